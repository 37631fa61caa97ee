"""What a training backend's driver side does by passing the call to every rank."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any


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

    def worker_pids(self) -> list[int]:
        return self.group.pids()
