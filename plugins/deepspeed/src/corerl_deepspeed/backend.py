"""The driver side of the deepspeed backend: one Ray worker group, batches in, results out."""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch

from corerl.config import Config
from corerl.distributed.group_backend import WorkerGroupBackend, step_result
from corerl.distributed.placement import training_layout
from corerl.distributed.worker_group import RayWorkerGroup
from corerl.training.batching import loss_token_count
from corerl.training.contract import Batch, LossFn, StepResult
from corerl.training.microbatching import MicroBatcher
from corerl_deepspeed.support import check_supported

WORKER = "corerl_deepspeed.worker:DeepSpeedWorker"


class DeepSpeedBackend(WorkerGroupBackend):
    """DeepSpeed ZeRO stage 0-3, data parallel over ``cluster.num_nodes x cluster.gpus_per_node`` ranks."""

    def __init__(self, config: Config) -> None:
        check_supported(config)
        self.config = config
        self.world_size = config.core.cluster.world_size
        self.batcher = MicroBatcher.from_config(config)
        threads = max(1, (os.cpu_count() or 1) // self.world_size)
        self.group = RayWorkerGroup(WORKER, self.world_size, ray_address=config.core.cluster.ray_address,
                                    layout=training_layout(config.core.cluster), role="deepspeed worker", config=config, threads=threads)

    def load_hf(self, model_path: str) -> None:
        self.group.call("load_hf", model_path)

    def logprobs(self, batch: Batch) -> torch.Tensor:
        plan = self.batcher.plan(batch, self.world_size, "logprobs")
        return plan.unpack(self.group.call_per_rank("logprobs", [(mbs,) for mbs in plan.per_rank]))

    def values(self, batch: Batch) -> torch.Tensor:
        plan = self.batcher.plan(batch, self.world_size, "logprobs")
        return plan.unpack(self.group.call_per_rank("values", [(mbs,) for mbs in plan.per_rank]))

    def train_step(self, batch: Batch, loss_fn: LossFn) -> StepResult:
        normaliser = float(max(1, loss_token_count(batch)))
        plan = self.batcher.plan(batch, self.world_size, "train")
        results = self.group.call_per_rank("train_step", [(mbs, loss_fn, normaliser) for mbs in plan.per_rank])
        return step_result(results, int(normaliser))

    def export_hf(self, path: str) -> None:
        self.group.call("export_hf", path)

    def weight_stream(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from self.group.call("full_state_dict")[0].items()

    def shutdown(self) -> None:
        self.group.call("shutdown")
        self.group.shutdown()
