"""What a training backend does for the algorithms (the driver-side contract).

A training backend's factory (``TrainingBackend.factory``) is called as
``factory(config=Config)`` and returns an object with the methods of
:class:`TrainingEngine`. The algorithms talk to nothing else: where the ranks run (Ray
actors, one process) is the backend's business.

Batches are ``dict[str, torch.Tensor]`` with rows right-padded to a common length ``T``:

- ``input_ids`` ``[B, T]`` (long), ``attention_mask`` ``[B, T]`` (1 for real tokens);
- ``loss_mask`` ``[B, T]``: 1 where the token's logprob enters the loss (position 0 never does);
- any per-row or per-token fields the loss function reads (``advantages``, ``old_logprobs``, ...).

Logprobs come back as ``[B, T]`` float32: position ``t`` holds ``log p(input_ids[t] | input_ids[:t])``,
position 0 and padding hold 0.

A loss function is a picklable callable ``loss_fn(logprobs, micro_batch, normaliser) ->
(loss, metrics)``: ``logprobs`` are the differentiable ``[b, T]`` logprobs of one micro-batch,
``normaliser`` the number of loss tokens in the whole step (all ranks), and ``loss`` a
scalar whose sum over micro-batches and ranks is the step's loss (so token-level
normalisation is exact whatever the micro-batching and data parallelism). When the batch
holds ``candidate_ids`` ``[B, T, K]`` (long), the backend also writes ``candidate_logprobs``
``[b, T, K]`` (differentiable, aligned like the logprobs: position ``t`` holds
``log p(candidate_ids[t, k] | input_ids[:t])``) into each micro-batch before calling the loss
function (a forward KL over a teacher's top-k reads them). Metric values are
floats or 0-d tensors (a backend may sum tensors over its micro-batches and read them once per
step, :class:`corerl.training.step_totals.StepTotals`, so that no micro-batch waits on the host).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs

if TYPE_CHECKING:
    import torch

Batch = dict[str, "torch.Tensor"]
LossFn = Callable[["torch.Tensor", Batch, float], tuple["torch.Tensor", dict[str, Any]]]


@attrs.frozen
class StepResult:
    """What one optimizer step reports."""

    loss: float
    grad_norm: float
    lr: float
    tokens: int
    step: int
    metrics: dict[str, float] = attrs.field(factory=dict)


@runtime_checkable
class TrainingEngine(Protocol):
    """The methods every training backend provides to the algorithms."""

    def load_hf(self, model_path: str) -> None:
        """(Re)initialise model, optimizer, scheduler and step from a Hugging Face checkpoint directory."""

    def logprobs(self, batch: Batch) -> torch.Tensor:
        """Per-token logprobs ``[B, T]`` of ``batch`` under the current weights (no gradient), at
        the positions the loss reads (``loss_mask``; see docs/plugins.md): others are never read."""

    # Optional (contract 2.10): ``topk_logprobs(batch, k) -> (logprobs [B, T], topk_logprobs
    # [B, T, k], topk_ids [B, T, k])``, the token logprobs and each position's k most likely next
    # tokens from one forward pass (a forward- or mixed-KL distillation teacher needs it;
    # :class:`corerl.distributed.group_backend.WorkerGroupBackend` provides it).

    def train_step(self, batch: Batch, loss_fn: LossFn) -> StepResult:
        """One optimizer step over ``batch``, in the micro-batches
        :class:`corerl.training.microbatching.MicroBatcher` plans (rows, token budget or packed,
        as the recipe says) with gradients accumulated, clipped to ``policy.max_grad_norm``,
        then the LR scheduler steps."""

    def save_checkpoint(self, path: str) -> None:
        """Write a resumable checkpoint (model, optimizer, scheduler, RNG, step) to folder ``path``."""

    def load_checkpoint(self, path: str) -> None:
        """Restore everything :meth:`save_checkpoint` wrote; training then continues exactly."""

    def export_hf(self, path: str) -> None:
        """Write a Hugging Face checkpoint (safetensors, config, tokenizer) of the current weights."""

    def weight_stream(self) -> Iterable[tuple[str, torch.Tensor]]:
        """The current full weights as ``(Hugging Face name, tensor)`` pairs, for a generation
        backend; iterated once (a generator will do). A
        :class:`~corerl.training.weights.EngineWeights` lets a generation backend that shares
        this engine's model recognise the stream and skip the copy."""

    def offload(self, parts: Sequence[str] = ("optimizer", "parameters")) -> None:
        """Move ``parts`` (``"parameters"``, ``"optimizer"``) off the accelerator; the offload
        policy decides when (a logged no-op where there is no accelerator)."""

    def reload(self, parts: Sequence[str] = ("optimizer", "parameters")) -> None:
        """Bring ``parts`` back onto the accelerator."""

    def shutdown(self) -> None:
        """Release the workers and their resources."""


@runtime_checkable
class ValueEngine(TrainingEngine, Protocol):
    """A training engine built as PPO's critic (from a config with ``role="critic"``, see
    :func:`corerl.config.critic.critic_config`; its registration says ``value_model=True``).

    ``load_hf`` loads a value model: a Hugging Face token-classification checkpoint with one
    label (:mod:`corerl.models.value_model`); ``export_hf`` writes one back and
    ``weight_stream`` streams its weights. ``train_step(batch, loss_fn)`` calls ``loss_fn`` with
    the differentiable ``[b, T]`` values in place of logprobs (e.g.
    :class:`corerl.algorithms.ppo_math.ValueLoss`), with the same micro-batching, normaliser
    and summing rules. ``logprobs`` is not available on a critic.
    """

    def values(self, batch: Batch) -> torch.Tensor:
        """Per-token values ``[B, T]`` float32 of ``batch`` (no gradient): position ``t`` holds
        the value of the state ``input_ids[:t]``, the one in which token ``t`` is chosen (so it
        lines up with the logprob at ``t``); position 0 and padding hold 0."""


def _methods(protocol: type) -> list[str]:
    return [n for n in vars(protocol) if not n.startswith("_") and callable(getattr(protocol, n))]


def describe_missing(engine: Any, role: str = "policy") -> list[str]:
    """The :class:`TrainingEngine` methods ``engine`` lacks, and with ``role="critic"`` the
    :class:`ValueEngine` ones too (empty when it conforms)."""
    names = _methods(TrainingEngine) + (_methods(ValueEngine) if role == "critic" else [])
    return [n for n in names if not callable(getattr(engine, n, None))]
