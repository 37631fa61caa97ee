"""The driver side of the dtensor backend: one worker group, batches in, results out."""

from __future__ import annotations

import os
from typing import Any

import torch

from corerl.sdk import (
    Config,
    LocalWorkerGroup,
    MicroBatcher,
    RankLayout,
    RayWorkerGroup,
    WorkerGroupBackend,
    training_layout,
)

WORKER = "corerl_dtensor.worker:DTensorWorker"


class DTensorBackend(WorkerGroupBackend):
    """FSDP2 (or FSDP1) x tensor parallel over ``cluster.num_nodes x cluster.gpus_per_node`` ranks;
    a policy, or PPO's critic when the config's role is ``critic``."""

    def __init__(self, config: Config) -> None:
        self.config = config
        cluster = config.core.cluster
        settings = config.section("policy.dtensor_cfg")
        self.world_size = cluster.world_size
        self.batcher = MicroBatcher.from_config(config)
        # the ranks of one data-parallel rank: its tensor-parallel group, or its context-parallel ring
        self.layout = RankLayout.tensor_parallel(self.world_size,
                                                 settings.tensor_parallel_size * settings.context_parallel_size)
        if self.world_size == 1:
            self.group: Any = LocalWorkerGroup(WORKER, config=config)
        else:
            threads = max(1, (os.cpu_count() or 1) // self.world_size)
            self.group = RayWorkerGroup(
                WORKER, self.world_size, ray_address=cluster.ray_address, layout=training_layout(cluster, config.pool),
                role="critic worker" if config.role == "critic" else "training worker", config=config, threads=threads,
            )

    def local_model(self) -> torch.nn.Module | None:
        """The training model itself where it lives in this process unsharded (world size 1), for a
        generation backend that samples with it; None where the ranks are elsewhere."""
        return self.group.worker.model if isinstance(self.group, LocalWorkerGroup) else None

    def shutdown(self) -> None:
        if self.world_size > 1:  # the actors end with their processes
            self.group.shutdown()
        else:
            super().shutdown()
