"""The driver side of the dtensor backend: one worker group, batches in, results out."""

from __future__ import annotations

import os
from typing import Any

import torch

from corerl.config import Config
from corerl.distributed.group_backend import WorkerGroupBackend, step_result
from corerl.distributed.placement import training_layout
from corerl.distributed.worker_group import LocalWorkerGroup, RayWorkerGroup
from corerl.training.batching import loss_token_count
from corerl.training.contract import Batch, LossFn, StepResult
from corerl.training.microbatching import MicroBatcher, MicroBatchPlan
from corerl.training.weights import EngineWeights
from corerl_dtensor.support import check_supported

WORKER = "corerl_dtensor.worker:DTensorWorker"


class DTensorBackend(WorkerGroupBackend):
    """FSDP2 (or FSDP1) x tensor parallel over ``cluster.num_nodes x cluster.gpus_per_node`` ranks;
    a policy, or PPO's critic when the config's role is ``critic``."""

    def __init__(self, config: Config) -> None:
        check_supported(config)
        self.config = config
        cluster = config.core.cluster
        settings = config.section("policy.dtensor_cfg")
        self.world_size = cluster.world_size
        self.tp = settings.tensor_parallel_size
        self.dp = self.world_size // self.tp
        self.batcher = MicroBatcher.from_config(config)
        if self.world_size == 1:
            self.group: Any = LocalWorkerGroup(WORKER, config=config)
        else:
            threads = max(1, (os.cpu_count() or 1) // self.world_size)
            self.group = RayWorkerGroup(
                WORKER, self.world_size, ray_address=cluster.ray_address, layout=training_layout(cluster),
                role="training worker", config=config, threads=threads,
            )

    def _by_rank(self, plan: MicroBatchPlan) -> list[list[Batch]]:
        """Each rank's micro-batches: the ranks of one tensor-parallel group share their dp rank's."""
        return [plan.per_rank[rank // self.tp] for rank in range(self.world_size)]

    def _dp_leaders(self, results: list[Any]) -> list[Any]:
        return [r for rank, r in enumerate(results) if rank % self.tp == 0]

    def load_hf(self, model_path: str) -> None:
        self.group.call("load_hf", model_path)

    def logprobs(self, batch: Batch) -> torch.Tensor:
        plan = self.batcher.plan(batch, self.dp, "logprobs")
        results = self.group.call_per_rank("logprobs", [(mbs,) for mbs in self._by_rank(plan)])
        return plan.unpack(self._dp_leaders(results))

    def values(self, batch: Batch) -> torch.Tensor:
        plan = self.batcher.plan(batch, self.dp, "logprobs")
        results = self.group.call_per_rank("values", [(mbs,) for mbs in self._by_rank(plan)])
        return plan.unpack(self._dp_leaders(results))

    def train_step(self, batch: Batch, loss_fn: LossFn) -> StepResult:
        normaliser = float(max(1, loss_token_count(batch)))
        plan = self.batcher.plan(batch, self.dp, "train")
        args = [(mbs, loss_fn, normaliser) for mbs in self._by_rank(plan)]
        results = self.group.call_per_rank("train_step", args)
        return step_result(self._dp_leaders(results), int(normaliser))

    def export_hf(self, path: str) -> None:
        self.group.call("export_hf", path)

    def weight_stream(self) -> EngineWeights:
        return EngineWeights(self, lambda: self.group.call("full_state_dict")[0].items())

    def local_model(self) -> torch.nn.Module | None:
        """The training model itself where it lives in this process unsharded (world size 1), for a
        generation backend that samples with it; None where the ranks are elsewhere."""
        return self.group.worker.model if isinstance(self.group, LocalWorkerGroup) else None

    def shutdown(self) -> None:
        if self.world_size > 1:
            self.group.shutdown()
        else:
            self.group.call("shutdown")
            self.group.shutdown()
