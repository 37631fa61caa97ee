"""The driver side of the deepspeed backend: one Ray worker group, batches in, results out."""

from __future__ import annotations

import os

from corerl.sdk import Config, MicroBatcher, RayWorkerGroup, WorkerGroupBackend, training_layout

WORKER = "corerl_deepspeed.worker:DeepSpeedWorker"


class DeepSpeedBackend(WorkerGroupBackend):
    """DeepSpeed ZeRO stage 0-3, data parallel over ``cluster.num_nodes x cluster.gpus_per_node`` ranks."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.world_size = config.core.cluster.world_size
        self.batcher = MicroBatcher.from_config(config)
        threads = max(1, (os.cpu_count() or 1) // self.world_size)
        self.group = RayWorkerGroup(WORKER, self.world_size, ray_address=config.core.cluster.ray_address,
                                    layout=training_layout(config.core.cluster, config.pool), role="deepspeed critic worker" if config.role == "critic" else "deepspeed worker", config=config, threads=threads)
