"""What a training backend's driver side does by passing the call to every rank."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from corerl.distributed.dispatch import Dispatch, RankLayout, dispatch
from corerl.training.batching import loss_token_count
from corerl.training.weights import EngineWeights

if TYPE_CHECKING:
    from corerl.training.contract import Batch, LossFn, StepResult


def step_result(reporting: list[dict[str, Any]], tokens: int) -> StepResult:
    """One :class:`~corerl.training.contract.StepResult` from the ranks' ``train_step`` results:
    losses and metrics summed over the ranks that report (one per data-parallel group; a metric
    named ``.../max`` or ``.../min`` by its extreme: :func:`~corerl.training.step_totals.combine`); the grad
    norm, lr and step, which every rank shares, from the first."""
    from corerl.training.contract import StepResult
    from corerl.training.step_totals import combine

    metrics: dict[str, float] = {}
    for result in reporting:
        for key, value in result["metrics"].items():
            metrics[key] = combine(key, metrics[key], value) if key in metrics else value
    first = reporting[0]
    return StepResult(loss=sum(r["loss"] for r in reporting), grad_norm=first["grad_norm"], lr=first["lr"],
                      tokens=tokens, step=first["step"], metrics=metrics)


class WorkerGroupBackend:
    """Base of a driver-side training backend whose ranks are ``self.group`` (a worker group):
    every contract method as one :func:`~corerl.distributed.dispatch.dispatch` to the ranks.

    A subclass sets ``self.group``, ``self.batcher`` (a :class:`~corerl.training.microbatching.MicroBatcher`)
    and, where ranks share a data-parallel rank (tensor or pipeline parallel), ``self.layout``
    (a :class:`~corerl.distributed.dispatch.RankLayout`; default: every rank its own). Batches
    are cut per data-parallel rank and the reporting ranks' answers gathered; weights leave as
    one :class:`~corerl.training.weights.EngineWeights` stream of Hugging Face ``(name, tensor)``
    pairs, from the ranks' ``full_state_dict`` (override :meth:`hf_state` where the ranks hold
    another layout, as megatron's do).
    """

    group: Any
    batcher: Any
    layout: RankLayout | None = None

    @property
    def rank_layout(self) -> RankLayout:
        """``layout``, or every rank its own data-parallel rank where the backend set none."""
        return self.layout if self.layout is not None else RankLayout.data_parallel(self.group.world_size)

    def call(self, mode: Dispatch, method: str, *args: Any, parts: Sequence[Any] | None = None) -> Any:
        """``method`` on the ranks in ``mode`` (:func:`~corerl.distributed.dispatch.dispatch`)."""
        return dispatch(self.group, self.rank_layout, mode, method, *args, parts=parts)

    def _split(self, method: str, batch: Batch, purpose: str, *args: Any) -> tuple[Any, list[Any]]:
        plan = self.batcher.plan(batch, self.rank_layout.data_parallel_size, purpose)
        return plan, self.call(Dispatch.SPLIT_BY_DP, method, *args, parts=plan.per_rank)

    def load_hf(self, model_path: str) -> None:
        self.call(Dispatch.ALL, "load_hf", model_path)
        self.base_path = model_path  # with LoRA, the frozen base the adapter trains on

    def logprobs(self, batch: Batch) -> Any:
        plan, answers = self._split("logprobs", batch, "logprobs")
        return plan.unpack(answers)

    def topk_logprobs(self, batch: Batch, k: int) -> tuple[Any, Any, Any]:
        """``(logprobs [B, T], topk_logprobs [B, T, k], topk_ids [B, T, k])`` from one forward
        pass: the token logprobs and, at every position, the ``k`` most likely next tokens (what
        a distillation teacher gives a forward or mixed KL loss)."""
        from corerl.training.logprobs import split_topk

        plan, answers = self._split("topk_logprobs", batch, "logprobs", k)
        return split_topk(plan.unpack(answers))

    def values(self, batch: Batch) -> Any:
        """The critic's values (a backend registered with ``value_model=True``)."""
        plan, answers = self._split("values", batch, "logprobs")
        return plan.unpack(answers)

    def train_step(self, batch: Batch, loss_fn: LossFn) -> StepResult:
        normaliser = float(max(1, loss_token_count(batch)))
        _, answers = self._split("train_step", batch, "train", loss_fn, normaliser)
        return step_result(answers, int(normaliser))

    def hf_state(self) -> Iterable[tuple[str, Any]]:
        """The model's weights as Hugging Face ``(name, tensor)`` pairs (rank 0 gathers them; a
        LoRA adapter merged in, by ``RankWorker.full_hf_state``)."""
        return self.call(Dispatch.ONE_RANK, "full_hf_state" if self.adapter_only else "full_state_dict").items()

    # -- LoRA (policy.lora: the ranks hold a PEFT model, corerl.lora) ---------------------------

    @property
    def adapter_only(self) -> bool:
        """Whether only a LoRA adapter trains (then a refit sends :meth:`adapter_weights`)."""
        from corerl.lora.adapter import lora_enabled

        config = getattr(self, "config", None)
        return config is not None and lora_enabled(config)

    def base_logprobs(self, batch: Batch) -> Any:
        """Logprobs with the LoRA adapter switched off: the base model's (the KL reference)."""
        plan, answers = self._split("base_logprobs", batch, "logprobs")
        return plan.unpack(answers)

    def adapter_weights(self) -> Any:
        """The adapter as a :class:`corerl.lora.weights.AdapterWeights` (gathered when iterated)."""
        from corerl.lora.adapter import config_dict
        from corerl.lora.weights import AdapterWeights

        base = self.base_path
        return AdapterWeights(self, config_dict(self.config.core.policy.lora, base), base,
                              lambda: self.call(Dispatch.ONE_RANK, "adapter_state"))

    def export_adapter(self, path: str) -> None:
        """Write the PEFT adapter folder (``adapter_model.safetensors``, ``adapter_config.json``) at ``path``."""
        self.call(Dispatch.ALL, "export_adapter", path)

    def weight_stream(self) -> EngineWeights:
        return EngineWeights(self, self.hf_state)

    def export_hf(self, path: str) -> None:
        self.call(Dispatch.ALL, "export_hf", path)

    def shutdown(self) -> None:
        self.call(Dispatch.ALL, "shutdown")
        self.group.shutdown()

    def save_checkpoint(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        self.call(Dispatch.ALL, "save_checkpoint", path)

    def load_checkpoint(self, path: str) -> None:
        self.call(Dispatch.ALL, "load_checkpoint", path)

    def offload(self, parts: Sequence[str] = ("optimizer", "parameters")) -> None:
        self.call(Dispatch.ALL, "offload", list(parts))

    def reload(self, parts: Sequence[str] = ("optimizer", "parameters")) -> None:
        self.call(Dispatch.ALL, "reload", list(parts))

    def state_bytes(self) -> list[dict[str, int]]:
        """Per rank: bytes held for parameters, gradients and optimizer state (bench/memory.py)."""
        return self.call(Dispatch.ALL, "state_bytes")

    def worker_pids(self) -> list[int]:
        return self.group.pids()

    def accelerator_memory(self, reset_peak: bool = False) -> list[dict[str, int]]:
        """Per rank: GPU bytes allocated, reserved and at the peak (zeros on CPU ranks; bench/memory.py)."""
        return self.call(Dispatch.ALL, "accelerator_memory", reset_peak)

    def worker_devices(self) -> list[str]:
        """Where each rank computes ("cuda:0", "cpu"), by rank."""
        return self.call(Dispatch.ALL, "device_name")

    def worker_nodes(self) -> list[str]:
        """The Ray node id of each rank (empty where the ranks are not Ray actors)."""
        return self.group.nodes()
