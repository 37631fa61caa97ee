"""The driver side of the ``example`` backend: one rank, in this process.

Imported only when the backend is built, so torch stays out of ``corerl plugins``. With the
rank worker of :mod:`corerl_example.worker` it is a complete implementation of corerl's
training-backend contract (``corerl.training.contract``) and passes the conformance suite.
:class:`corerl.distributed.group_backend.WorkerGroupBackend` passes checkpoint, offload and
memory calls to the ranks; this class cuts batches into micro-batches and collects results. For
several ranks, build a ``RayWorkerGroup`` instead of the ``LocalWorkerGroup`` (see the dtensor
backend).
"""

from __future__ import annotations

from typing import Any

import torch

from corerl.sdk import (
    ConfigError,
    EngineWeights,
    LocalWorkerGroup,
    MicroBatcher,
    StepResult,
    WorkerGroupBackend,
    loss_token_count,
    step_result,
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

    def load_hf(self, model_path: str) -> None:
        self.group.call("load_hf", model_path)

    def logprobs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        plan = self.batcher.plan(batch, ranks=1, purpose="logprobs")
        return plan.unpack(self.group.call_per_rank("logprobs", [(plan.per_rank[0],)]))

    def train_step(self, batch: dict[str, torch.Tensor], loss_fn: Any) -> StepResult:
        normaliser = float(max(1, loss_token_count(batch)))
        plan = self.batcher.plan(batch, ranks=1, purpose="train")
        results = self.group.call_per_rank("train_step", [(plan.per_rank[0], loss_fn, normaliser)])
        return step_result(results, int(normaliser))

    def export_hf(self, path: str) -> None:
        self.group.call("export_hf", path)

    def weight_stream(self) -> EngineWeights:
        return EngineWeights(self, lambda: self.group.call("full_state_dict")[0].items())

    def shutdown(self) -> None:
        self.group.call("shutdown")
        self.group.shutdown()
