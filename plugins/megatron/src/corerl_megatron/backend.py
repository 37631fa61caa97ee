"""The driver side of the megatron backend: one Ray worker group, batches in, results out."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from corerl.config import Config
from corerl.distributed.group_backend import WorkerGroupBackend, step_result
from corerl.distributed.placement import training_layout
from corerl.distributed.worker_group import RayWorkerGroup
from corerl.training.batching import loss_token_count
from corerl.training.contract import Batch, LossFn, StepResult
from corerl.training.microbatching import MicroBatcher
from corerl_megatron.support import check_supported

WORKER = "corerl_megatron.worker:MegatronWorker"


class MegatronBackend(WorkerGroupBackend):
    """megatron-core GPTModel, tensor x pipeline x data parallel over Ray ranks; a policy, or PPO's
    critic (a :class:`~corerl_megatron.model.ValueHead` in place of the vocabulary projection)."""

    def __init__(self, config: Config) -> None:
        check_supported(config)
        self.config = config
        self.world_size = config.core.cluster.world_size
        threads = max(1, (os.cpu_count() or 1) // self.world_size)
        self.batcher = MicroBatcher.from_config(config)
        from corerl_megatron.conversion import checkpoint_root

        # the driver's environment decides where conversions live (Ray workers may have started earlier)
        self.group = RayWorkerGroup(WORKER, self.world_size, ray_address=config.core.cluster.ray_address,
                                    layout=training_layout(config.core.cluster), role="megatron worker", config=config, threads=threads,
                                    checkpoint_dir=str(checkpoint_root()))
        coords = self.group.call("coordinates")
        self.dp_of = [c["dp"] for c in coords]
        self.reports = [c["reports"] for c in coords]
        self.dp = max(self.dp_of) + 1

    def load_hf(self, model_path: str) -> None:
        from corerl_megatron.conversion import load_hf_model_config

        self.group.call("load_hf", model_path)
        self.model_path = model_path
        # read once here, not on every refit
        self.hf_config, self.family, self.shape = load_hf_model_config(
            Path(model_path), self.config.section("policy.megatron_cfg").converter_type)

    def _args(self, plan: Any, *extra: Any) -> list[tuple[Any, ...]]:
        return [(plan.per_rank[self.dp_of[rank]], *extra) for rank in range(self.world_size)]

    def logprobs(self, batch: Batch) -> torch.Tensor:
        plan = self.batcher.plan(batch, self.dp, "logprobs")
        results = self.group.call_per_rank("logprobs", self._args(plan))
        by_dp = {self.dp_of[r]: out for r, out in enumerate(results) if self.reports[r]}
        return plan.unpack([by_dp[d] for d in range(self.dp)])

    def values(self, batch: Batch) -> torch.Tensor:
        plan = self.batcher.plan(batch, self.dp, "logprobs")
        results = self.group.call_per_rank("values", self._args(plan))
        by_dp = {self.dp_of[r]: out for r, out in enumerate(results) if self.reports[r]}
        return plan.unpack([by_dp[d] for d in range(self.dp)])

    def train_step(self, batch: Batch, loss_fn: LossFn) -> StepResult:
        normaliser = float(max(1, loss_token_count(batch)))
        plan = self.batcher.plan(batch, self.dp, "train")
        results = self.group.call_per_rank("train_step", self._args(plan, loss_fn, normaliser))
        return step_result([r for rank, r in enumerate(results) if self.reports[rank]], int(normaliser))

    def _megatron_state(self) -> dict[str, torch.Tensor]:
        state: dict[str, torch.Tensor] = {}
        for part in self.group.call("full_state_dict"):
            state.update(part or {})
        return state

    def weight_stream(self) -> Iterable[tuple[str, torch.Tensor]]:
        return OwnWeights(self)

    def export_hf(self, path: str) -> None:
        from corerl.training.hf_export import write_hf_checkpoint

        write_hf_checkpoint(dict(self.weight_stream()), self.hf_config, self.model_path, path, self.config.role)

    def shutdown(self) -> None:
        self.group.call("shutdown")
        self.group.shutdown()


class OwnWeights:
    """A megatron engine's weights as Hugging Face ``(name, tensor)`` pairs, gathered when
    iterated. ``engine`` lets the megatron generation backend, which samples with this very
    engine, recognise its own weights and skip the copy."""

    def __init__(self, engine: MegatronBackend) -> None:
        self.engine = engine

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        from corerl_megatron.convert import megatron_to_hf

        engine = self.engine
        yield from megatron_to_hf(engine._megatron_state(), engine.family, engine.shape).items()
