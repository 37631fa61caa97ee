"""The device a rank computes on: the GPU its Ray bundle gave it, else the CPU.

A Ray rank with a share of a bundle's GPU sees exactly that GPU (Ray sets its
``CUDA_VISIBLE_DEVICES``), so its device is ``cuda:0`` whatever its rank number. A process that
sees several GPUs (the driver at world size 1 on a multi-GPU host, a torchrun launch) takes
``LOCAL_RANK``, else the current device.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def machine_has_gpu() -> bool:
    """Whether this process can use a GPU, asked without importing torch (Ray's own detector, as
    :meth:`corerl.distributed.placement.ClusterView.local` does); torch only where that detector
    is not where this Ray release keeps it. For config checks that must stay light."""
    from corerl.distributed.placement import ClusterView

    view = ClusterView.local()
    if view is not None:
        return view.gpus > 0
    import torch

    return torch.cuda.is_available()


def runs_here(config: Any) -> bool:
    """Whether the recipe's ranks run on this very machine: one node, no Ray cluster named by
    ``cluster.ray_address`` or ``RAY_ADDRESS``. A recipe for another cluster is not judged by what
    this machine has (its GPUs, the packages installed here)."""
    cluster = config.core.cluster
    return not (cluster.num_nodes > 1 or cluster.ray_address or os.environ.get("RAY_ADDRESS"))


def runs_here_without_gpu(config: Any) -> bool:
    """True when the recipe's ranks run on this very machine (:func:`runs_here`) and it has no GPU:
    the case where a GPU-only option can be refused from the config alone."""
    return runs_here(config) and not machine_has_gpu()


def local_gpu_index() -> int:
    """Which visible GPU this process uses (0 where it sees one)."""
    import torch

    if torch.cuda.device_count() <= 1:
        return 0
    return int(os.environ.get("LOCAL_RANK", torch.cuda.current_device()))


def rank_device() -> torch.device:
    """This process's compute device, made current where it is a GPU."""
    import torch

    if not torch.cuda.is_available():
        return torch.device("cpu")
    index = local_gpu_index()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def accelerator_memory(device: torch.device) -> dict[str, int]:
    """Bytes the GPU ``device`` holds for this process now (allocated, reserved) and at its peak
    since the last :func:`reset_peak_memory` (or the start); zeros on the CPU."""
    import torch

    if device.type != "cuda":
        return {"allocated": 0, "reserved": 0, "peak": 0}
    torch.cuda.synchronize(device)
    return {"allocated": torch.cuda.memory_allocated(device), "reserved": torch.cuda.memory_reserved(device),
            "peak": torch.cuda.max_memory_allocated(device)}


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak for :func:`accelerator_memory` (nothing to do on the CPU)."""
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


class RankDeviceReport:
    """What a rank worker with a ``device`` attribute reports about it (a mixin for the workers)."""

    device: torch.device

    def accelerator_memory(self, reset_peak: bool = False) -> dict[str, int]:
        """GPU bytes this rank holds now and at its peak (zeros on the CPU); ``reset_peak`` starts a new peak."""
        memory = accelerator_memory(self.device)
        if reset_peak:
            reset_peak_memory(self.device)
        return memory

    def device_name(self) -> str:
        """Where this rank computes ("cuda:0", "cpu")."""
        return str(self.device)
