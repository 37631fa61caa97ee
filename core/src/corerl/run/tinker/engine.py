"""What the Tinker-compatible server asks of a training engine, with no torch in sight.

The server (``server.py``) turns the SDK's requests into these plain values and calls a
:class:`TinkerEngine`; an engine (``peft_engine.PeftEngine``) does the arithmetic. Conventions
follow the Tinker SDK: a datum's loss inputs are aligned position by position with its tokens
(``target_tokens[i]`` is the token predicted at position ``i``), losses are sums over positions,
and metric keys read ``name:reduction`` with exactly one colon.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

USER = "user"
SERVER = "server"

#: The loss functions an engine may implement; the SDK names more (``dro``, ``gspo``, ...).
LOSS_FUNCTIONS = ("cross_entropy", "importance_sampling", "ppo", "cispo")


class ServiceError(Exception):
    """A request the engine refuses, in one line; ``category`` is ``"user"`` or ``"server"``.

    The server answers it in the SDK's error shape (``{"error": message, "category": category}``).
    """

    def __init__(self, category: str, message: str) -> None:
        if category not in (USER, SERVER):
            raise ValueError(f"ServiceError category must be 'user' or 'server', not {category!r}")
        message = " ".join(str(message).split())
        super().__init__(message)
        self.category = category
        self.message = message

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class LoraSpec:
    """Which adapter a training client asked for (the SDK's ``lora_config``)."""

    rank: int
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = False
    seed: int | None = None


@dataclass
class Datum:
    """One training example: the model input's tokens and its named loss inputs, one value per token."""

    tokens: list[int]
    inputs: dict[str, list[float]]


@dataclass
class ForwardOutput:
    """Per datum at least ``logprobs`` and ``elementwise_loss``; metrics at least ``loss:sum``."""

    outputs: list[dict[str, list[float]]]
    metrics: dict[str, float]


@dataclass(frozen=True)
class AdamParams:
    """The SDK's ``AdamParams``, applied on each ``optim_step`` (weight decay is AdamW's, decoupled)."""

    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


@dataclass(frozen=True)
class SampleParams:
    """The SDK's sampling parameters; ``top_k = -1`` and ``top_p = 1`` mean no truncation.

    ``stop_at_eos``: whether the tokenizer's end-of-sequence token(s) stop a sample too. The SDK's
    ``stop`` left out means an implicit EOS (True); a ``stop`` given, ``[]`` included, means only
    the stops it lists (False).
    """

    max_tokens: int
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int | None = None
    stop_tokens: list[int] = field(default_factory=list)
    stop_strings: list[str] = field(default_factory=list)
    stop_at_eos: bool = True


@dataclass
class SampledSequence:
    """One sample: its tokens (the stop token included), their logprobs, and ``"stop"`` or ``"length"``."""

    tokens: list[int]
    logprobs: list[float]
    stop_reason: str


class TinkerEngine(Protocol):
    """Many LoRA adapters on one base model, each with its own optimizer state and step count."""

    base_model: str
    tokenizer: Any

    def create(self, model_id: str, spec: LoraSpec) -> None:
        """A new adapter under ``model_id``, freshly initialised (zero delta) with no optimizer state."""
        ...

    def delete(self, model_id: str) -> None:
        """Drop the adapter and its optimizer state."""
        ...

    def forward(
        self, model_id: str, data: list[Datum], loss_fn: str, loss_fn_config: dict[str, float] | None
    ) -> ForwardOutput:
        """The loss and per-token logprobs under the adapter, without gradients."""
        ...

    def forward_backward(
        self, model_id: str, data: list[Datum], loss_fn: str, loss_fn_config: dict[str, float] | None
    ) -> ForwardOutput:
        """As :meth:`forward`, and adds the loss's gradient to the adapter's accumulated gradient."""
        ...

    def optim_step(self, model_id: str, adam: AdamParams) -> dict[str, float]:
        """One Adam step on the accumulated gradient, which is then cleared; returns metrics."""
        ...

    def save_state(self, model_id: str, path: Path, with_optimizer: bool = True) -> None:
        """The adapter's spec, weights, step count and (optionally) optimizer state under ``path``."""
        ...

    def load_state(self, model_id: str, path: Path, with_optimizer: bool) -> None:
        """Replace (or create) ``model_id`` from a saved state; the spec comes from the state."""
        ...

    def export_sampler(self, model_id: str, path: Path) -> None:
        """The adapter's current weights under ``path``, for :meth:`sample`."""
        ...

    def sample(
        self, sampler_path: Path | None, prompt: list[int], num_samples: int, params: SampleParams
    ) -> list[SampledSequence]:
        """Samples continuing ``prompt`` with exported weights (``None``: the base model)."""
        ...

    def info(self, model_id: str) -> dict[str, Any]:
        """Base model, rank, steps taken and trainable parameter count of the adapter."""
        ...

    def adapter_bytes(self, model_id: str) -> int:
        """Bytes the adapter's weights take."""
        ...
