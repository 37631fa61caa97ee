"""What selection refuses for ``policy.lora`` (config logic only: nothing heavy is imported)."""

from __future__ import annotations

from typing import Any

SECTION = "policy.lora"


def check_lora(config: Any, training: Any, generation: Any) -> None:
    """Refuse, in one line naming the key, a LoRA policy on a training backend or a generation
    backend whose registration does not say ``lora=True``, LoRA with asynchronous GRPO, and
    dropout after the adapter (PEFT's LoRA drops out its input). ``generation`` is None where the
    algorithm samples nothing."""
    from corerl.errors import SelectionError, origin_of

    lora = config.core.policy.lora
    if not lora.enabled:
        return
    source = origin_of(f"{SECTION}.enabled", config.origins)
    if training is not None and not training.lora:
        raise SelectionError(f"training backend {training.id!r} (plugin {training.plugin!r}) does not train LoRA "
                             "adapters", key=f"{SECTION}.enabled", source=source,
                             hint="use a training backend that does (dtensor, deepspeed), or set policy.lora.enabled=false")
    if generation is not None and not generation.lora:
        raise SelectionError(f"generation backend {generation.id!r} (plugin {generation.plugin!r}) cannot sample with a "
                             "LoRA adapter", key="policy.generation.backend",
                             source=origin_of("policy.generation.backend", config.origins) or source,
                             hint="use one that can (vllm, hf), or set policy.lora.enabled=false")
    if config.section_enabled("algorithm.async"):
        raise SelectionError("asynchronous GRPO pushes full weights to its dedicated worker; adapter-only refits are "
                             "not wired into it yet", key="algorithm.async.enabled",
                             source=origin_of("algorithm.async.enabled", config.origins) or source,
                             hint="set algorithm.async.enabled=false with policy.lora, or train the whole model")
    if lora.dropout_position == "post" and lora.dropout > 0:
        raise SelectionError("PEFT's LoRA applies dropout to the adapter's input ('pre'); dropout after it is not "
                             "available", key=f"{SECTION}.dropout_position",
                             source=origin_of(f"{SECTION}.dropout_position", config.origins) or source,
                             hint="set policy.lora.dropout_position=pre, or policy.lora.dropout=0")
