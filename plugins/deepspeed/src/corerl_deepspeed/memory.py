"""What a DeepSpeed rank holds for parameters, gradients and optimizer state: the tensors offload
parks (``DeepSpeedWorker.phase_tensors``) and ``state_bytes`` counts."""

from __future__ import annotations

from typing import Any

from corerl.sdk import optimizer_state_tensors, storage_bytes


def parameter_tensors(engine: Any, stage: int) -> list[Any]:
    """The module's parameters as this rank stores them: its ZeRO-3 partitions, else whole (under
    ZeRO-1/2 views into DeepSpeed's flat buffers)."""
    return [p.ds_tensor if stage == 3 else p for p in engine.module.parameters()]


def gradient_bytes(engine: Any) -> int:
    """Gradients held at the accumulation boundary, before the step: whole ``.grad`` tensors and
    ZeRO's reduced partitions and flat gradient buffers."""
    optimizer = engine.optimizer
    tensors = [p.grad for p in engine.module.parameters()]
    for group in (getattr(optimizer, "averaged_gradients", None) or {}).values():
        tensors.extend(group if isinstance(group, list) else [group])
    tensors.append(getattr(optimizer, "grads_in_partition", None))
    tensors.append(getattr(optimizer, "grad_partitions_flat_buffer", None))
    return storage_bytes(tensors)


def optimizer_tensors(engine: Any) -> list[Any]:
    """The optimizer's moments and ZeRO's fp32 master partitions."""
    optimizer = engine.optimizer
    masters = list(getattr(optimizer, "single_partition_of_fp32_groups", None) or [])
    masters += list(getattr(optimizer, "fp32_partitioned_groups_flat", None) or [])
    return [*optimizer_state_tensors(optimizer), *masters]
