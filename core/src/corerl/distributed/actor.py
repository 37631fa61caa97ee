"""The Ray actor that hosts one rank's worker object (imported by Ray in each worker process)."""

from __future__ import annotations

import os
from typing import Any

from corerl.import_paths import resolve
from corerl.progress_markers import mark, worker_marker

__all__ = ["RankActor", "resolve"]


class RankActor:
    """Builds ``worker_path(rank=..., world_size=..., **kwargs)`` and forwards method calls to it."""

    def __init__(self, worker_path: str, rank: int, world_size: int, env: dict[str, str], kwargs: dict[str, Any],
                 role: str = "worker") -> None:
        from corerl import start_up
        from corerl.distributed.run_variables import adopt_run_variables

        adopt_run_variables(env)  # the run's CORERL_* variables and rendezvous; its output to run.log
        self.rank, self.role = rank, role
        mark(f"{role} {rank}:pid {os.getpid()}")  # which processes a test expects gone after a recovery
        with start_up.starting():  # the backend's imports and its model: few garbage collections
            self.worker = resolve(worker_path, what="rank worker")(rank=rank, world_size=world_size, **kwargs)

    def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        mark(worker_marker(self.role, self.rank, method))  # the fault-injection tests' points
        return getattr(self.worker, method)(*args, **kwargs)

    def pid(self) -> int:
        return os.getpid()
