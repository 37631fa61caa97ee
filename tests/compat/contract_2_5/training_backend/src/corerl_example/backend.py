"""The driver side of the ``example`` backend: one rank, in this process.

Imported only when the backend is built, so torch stays out of ``corerl plugins``. With the
rank worker of :mod:`corerl_example.worker` it is a complete implementation of corerl's
training-backend contract (``corerl.training.contract``) and passes the conformance suite.
:class:`corerl.sdk.WorkerGroupBackend` does every contract call as one dispatch to the
ranks: batches cut per data-parallel rank by ``self.batcher`` and the answers gathered, weights
out as one ``EngineWeights`` stream, checkpoints, offload and memory calls to every rank. This
class only builds the group. For several ranks, build a ``RayWorkerGroup`` instead of the
``LocalWorkerGroup`` and, where ranks share a data-parallel rank, set ``self.layout`` (a
``RankLayout``; see the dtensor backend).
"""

from __future__ import annotations

from typing import Any

from corerl.sdk import (
    ConfigError,
    LocalWorkerGroup,
    MicroBatcher,
    WorkerGroupBackend,
)


class ExampleBackend(WorkerGroupBackend):
    """Trains a Hugging Face causal LM in this process."""

    def __init__(self, config: Any) -> None:
        if config.core.cluster.world_size != 1:
            raise ConfigError(
                "the example backend runs one process only", key="cluster.gpus_per_node", hint="set it to 1"
            )
        self.config = config
        self.settings = config.section("policy.example_cfg")  # this backend's own recipe section
        # rows, dynamic (token-budget) or packed micro-batches, as the recipe says
        self.batcher = MicroBatcher.from_config(config)
        self.group = LocalWorkerGroup("corerl_example.worker:ExampleWorker", config=config)
