"""What a DeepSpeed rank holds for parameters, gradients and optimizer state."""

from __future__ import annotations

from typing import Any

from corerl.sdk import optimizer_state_tensors, storage_bytes


def parameter_bytes(engine: Any, stage: int) -> int:
    """The module's parameters as this rank stores them: its ZeRO-3 shards, else whole."""
    params = list(engine.module.parameters())
    return storage_bytes(p.ds_tensor if stage == 3 else p for p in params)


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


def optimizer_bytes(engine: Any) -> int:
    """The optimizer's moments and ZeRO's fp32 master partitions."""
    optimizer = engine.optimizer
    masters = list(getattr(optimizer, "single_partition_of_fp32_groups", None) or [])
    masters += list(getattr(optimizer, "fp32_partitioned_groups_flat", None) or [])
    return storage_bytes([*optimizer_state_tensors(optimizer), *masters])
