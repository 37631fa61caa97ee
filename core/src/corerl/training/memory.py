"""Counting the bytes a rank holds, for the memory benchmark (``bench/memory.py``).

Tensors are counted by their storage, once each: views into one flat buffer (ZeRO's, megatron's
gradient buffer) count the buffer once; a DTensor counts its local shard.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def local_tensor(tensor: Any) -> Any:
    """A DTensor's local shard; any other tensor as it is."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def storage_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (None entries skipped)."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        if tensor is None:
            continue
        storage = local_tensor(tensor).untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def optimizer_state_tensors(optimizer: Any) -> list[Any]:
    """Every tensor in the state of ``optimizer`` and of the torch optimizers it wraps (DeepSpeed's
    and megatron's wrappers keep theirs under ``.optimizer`` or ``.chained_optimizers``)."""
    import torch

    found: list[Any] = []
    stack, visited = [optimizer], set()
    while stack:
        current = stack.pop()
        if current is None or id(current) in visited:
            continue
        visited.add(id(current))
        if isinstance(current, torch.optim.Optimizer):
            for state in current.state.values():
                found.extend(v for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
        stack.append(getattr(current, "optimizer", None))
        stack.extend(getattr(current, "chained_optimizers", None) or [])
    return found


def move_optimizer_state(optimizer: Any, device: Any) -> None:
    """Move the tensors of a torch optimizer's state (not its 0-d step counters) to ``device``."""
    import torch

    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                state[key] = value.to(device, non_blocking=True)
