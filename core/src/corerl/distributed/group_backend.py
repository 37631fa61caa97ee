"""What a training backend's driver side does by passing the call to every rank."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corerl.training.contract import StepResult


def step_result(reporting: list[dict[str, Any]], tokens: int) -> StepResult:
    """One :class:`~corerl.training.contract.StepResult` from the ranks' ``train_step`` results:
    losses and metrics summed over the ranks that report (one per data-parallel group); the grad
    norm, lr and step, which every rank shares, from the first."""
    from corerl.training.contract import StepResult

    metrics: dict[str, float] = {}
    for result in reporting:
        for key, value in result["metrics"].items():
            metrics[key] = metrics.get(key, 0.0) + value
    first = reporting[0]
    return StepResult(loss=sum(r["loss"] for r in reporting), grad_norm=first["grad_norm"], lr=first["lr"],
                      tokens=tokens, step=first["step"], metrics=metrics)


class WorkerGroupBackend:
    """Base of a driver-side backend whose ranks are ``self.group`` (a worker group): the
    contract methods that are the same call on every rank."""

    group: Any

    def save_checkpoint(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        self.group.call("save_checkpoint", path)

    def load_checkpoint(self, path: str) -> None:
        self.group.call("load_checkpoint", path)

    def offload(self, parts: Sequence[str] = ("optimizer", "parameters")) -> None:
        self.group.call("offload", list(parts))

    def reload(self, parts: Sequence[str] = ("optimizer", "parameters")) -> None:
        self.group.call("reload", list(parts))

    def state_bytes(self) -> list[dict[str, int]]:
        """Per rank: bytes held for parameters, gradients and optimizer state (bench/memory.py)."""
        return self.group.call("state_bytes")

    def worker_pids(self) -> list[int]:
        return self.group.pids()

    def accelerator_memory(self, reset_peak: bool = False) -> list[dict[str, int]]:
        """Per rank: GPU bytes allocated, reserved and at the peak (zeros on CPU ranks; bench/memory.py)."""
        return self.group.call("accelerator_memory", reset_peak)

    def worker_devices(self) -> list[str]:
        """Where each rank computes ("cuda:0", "cpu"), by rank."""
        return self.group.call("device_name")

    def worker_nodes(self) -> list[str]:
        """The Ray node id of each rank (empty where the ranks are not Ray actors)."""
        return self.group.nodes()
