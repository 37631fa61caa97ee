"""Parking state between phases: the storages behind a set of tensors copied to host memory and
freed in place, then brought back into the same storages.

Offloading by storage, not by tensor, keeps every alias working: a parameter that is a view into
a flat buffer (FSDP1's flat shards, ZeRO's partitions, megatron's buffers), a DTensor's local
shard, tied weights. Parking resizes each distinct storage to 0 bytes (as FSDP frees an unsharded
parameter after its forward), so the memory is given back and the tensors hold nothing until
:meth:`HostStore.unpark` resizes the storages and copies their bytes back. A tensor of a parked
storage must not be read meanwhile (the callers refuse to compute while their state is parked:
:meth:`corerl.training.rank_worker.RankWorker.require_resident`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class HostStore:
    """The parked storages of a worker, by part (``"parameters"``, ``"optimizer"``), each with its
    copy in host memory (pinned where the storage is on a GPU)."""

    def __init__(self) -> None:
        self._parked: dict[str, list[tuple[Any, Any]]] = {}

    def __contains__(self, part: str) -> bool:
        return part in self._parked

    def parts(self) -> list[str]:
        """The parts parked now."""
        return sorted(self._parked)

    def park(self, part: str, tensors: Iterable[Any]) -> int:
        """Copy the distinct storages behind ``tensors`` (a DTensor's local shard; None and empty
        storages skipped) to host memory and free them; returns the bytes parked. Parking a part
        again parks only what is not parked yet (a storage parked already is empty)."""
        import torch

        from corerl.training.memory import local_tensor

        groups: dict[int, list[Any]] = {}  # the tensors of each distinct storage, by its address
        for tensor in tensors:
            if tensor is not None:
                local = local_tensor(tensor)
                if local.untyped_storage().nbytes() > 0:
                    groups.setdefault(local.untyped_storage().data_ptr(), []).append(local)
        entries: list[tuple[Any, Any]] = []
        for group in groups.values():
            storage = group[0].untyped_storage()
            if not storage.resizable():  # e.g. memory-mapped from a safetensors file: the tensors get their own
                storage = _own_storage(storage, group)
            host = torch.empty(storage.nbytes(), dtype=torch.uint8,
                               pin_memory=storage.device.type == "cuda" and torch.cuda.is_available())
            host.untyped_storage().copy_(storage)
            entries.append((storage, host))
        if entries and entries[0][0].device.type == "cuda":
            torch.cuda.synchronize()
        for storage, _ in entries:
            storage.resize_(0)
        self._parked.setdefault(part, []).extend(entries)
        return sum(host.numel() for _, host in entries)

    def unpark(self, part: str) -> int:
        """Give each storage of ``part`` its bytes back and drop the host copies; returns the bytes
        restored (0 where ``part`` was not parked)."""
        entries = self._parked.pop(part, [])
        for storage, host in entries:
            storage.resize_(host.numel())
            storage.copy_(host.untyped_storage())
        return sum(host.numel() for _, host in entries)


def _own_storage(storage: Any, tensors: list[Any]) -> Any:
    """A resizable copy of ``storage``, which ``tensors`` (all of those that share it) now use."""
    import torch

    own = torch.empty(storage.nbytes(), dtype=torch.uint8, device=storage.device).untyped_storage()
    own.copy_(storage)
    with torch.no_grad():
        for tensor in tensors:
            tensor.set_(own, tensor.storage_offset(), tensor.size(), tensor.stride())
    return own
