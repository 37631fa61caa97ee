"""What selection refuses for ``policy.lora`` (config logic only: nothing heavy is imported)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

SECTION = "policy.lora"


def _those(ids: Sequence[str] | None) -> str:
    return ", ".join(ids) if ids else "corerl plugins lists them"


def check_lora(config: Any, training: Any, generation: Any, *, lora_training: Sequence[str] | None = None,
               lora_generation: Sequence[str] | None = None) -> None:
    """Refuse, in one line naming the key, a LoRA policy on a training backend or a generation
    backend whose registration does not say ``lora=True`` (asynchronous GRPO's dedicated worker
    included: it takes the adapter as a synchronous refit does), and dropout after the adapter (PEFT's LoRA drops out its input). ``generation`` is None where the
    algorithm samples nothing. ``lora_training`` / ``lora_generation``: the installed backends
    that do take LoRA, which the hints name."""
    from corerl.errors import SelectionError, origin_of

    lora = config.core.policy.lora
    if not lora.enabled:
        return
    source = origin_of(f"{SECTION}.enabled", config.origins)
    if training is not None and not training.lora:
        raise SelectionError(f"training backend {training.id!r} (plugin {training.plugin!r}) does not train LoRA "
                             "adapters", key=f"{SECTION}.enabled", source=source,
                             hint=f"use a training backend that does ({_those(lora_training)}), or set "
                                  "policy.lora.enabled=false")
    if generation is not None and not generation.lora:
        raise SelectionError(f"generation backend {generation.id!r} (plugin {generation.plugin!r}) cannot sample with a "
                             "LoRA adapter", key="policy.generation.backend",
                             source=origin_of("policy.generation.backend", config.origins) or source,
                             hint=f"use one that can ({_those(lora_generation)}), or set policy.lora.enabled=false")
    if lora.dropout_position == "post" and lora.dropout > 0:
        raise SelectionError("PEFT's LoRA applies dropout to the adapter's input ('pre'); dropout after it is not "
                             "available", key=f"{SECTION}.dropout_position",
                             source=origin_of(f"{SECTION}.dropout_position", config.origins) or source,
                             hint="set policy.lora.dropout_position=pre, or policy.lora.dropout=0")


def check_lora_chosen(config: Any, chosen: Any) -> None:
    """The validation table's row (:mod:`corerl.config.validation`): :func:`check_lora` against
    the chosen backends, its hints naming the installed backends that take LoRA."""
    host = chosen.host
    check_lora(config, chosen.training_backend, chosen.generation_backend,
               lora_training=[r.id for r in host.training_backends if r.lora],
               lora_generation=[r.id for r in host.generation_backends if r.lora])
