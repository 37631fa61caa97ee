"""A small rank worker for testing worker groups themselves (real process groups, real failures)."""

from __future__ import annotations

import os
from typing import Any

from corerl.errors import ConfigError


class ProbeWorker:
    """Joins a gloo process group when ``world_size > 1`` and answers simple requests; rank
    ``fail_at_start`` raises instead of joining."""

    def __init__(self, *, rank: int, world_size: int, tag: str = "", fail_at_start: int | None = None) -> None:
        self.rank, self.world_size, self.tag = rank, world_size, tag
        if rank == fail_at_start:  # before joining: the other ranks wait for this one in the rendezvous
            raise ValueError(f"rank {rank} refuses to start")
        if world_size > 1:
            from corerl.distributed.rendezvous import join_process_group

            join_process_group("gloo", rank, world_size)

    def all_reduce_rank(self) -> int:
        """The sum of all ranks, through a real all-reduce."""
        import torch
        import torch.distributed as dist

        value = torch.tensor([self.rank])
        if self.world_size > 1:
            dist.all_reduce(value)
        return int(value.item())

    def placement(self) -> dict[str, Any]:
        """Where Ray put this rank: its node, its GPU ids and what CUDA_VISIBLE_DEVICES says."""
        import ray

        return {"node": ray.get_runtime_context().get_node_id(), "gpus": [str(g) for g in ray.get_gpu_ids()],
                "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def variable(self, name: str) -> str | None:
        """The environment variable ``name`` as this rank's process sees it."""
        return os.environ.get(name)

    def listening(self) -> list[tuple[str, int]]:
        """The (address, port) of each TCP socket this rank's process listens on."""
        import os

        import psutil

        return sorted((c.laddr.ip, c.laddr.port) for c in psutil.Process(os.getpid()).net_connections("tcp")
                      if c.status == psutil.CONN_LISTEN)

    def rendezvous_port(self) -> int:
        """The ``MASTER_PORT`` this rank joined its process group through."""
        import os

        return int(os.environ["MASTER_PORT"])

    def echo(self, value: Any) -> tuple[int, str, Any]:
        return self.rank, self.tag, value

    def fail_on(self, rank: int, user_error: bool = False, how: str = "plain") -> int:
        """Raise on ``rank``: a ValueError (``how="plain"``), one whose message runs over several
        lines (``"multiline"``, as pydantic's do), or one that cannot be pickled back to the
        driver (``"unpicklable"``, as vLLM's config errors cannot)."""
        if self.rank == rank:
            if user_error:
                raise ConfigError("the batch is wrong", key="algorithm.batch_size")
            if how == "multiline":
                raise ValueError(f"1 validation error for ModelConfig\n  rank {rank} refuses\n    details")
            if how == "unpicklable":
                error = ValueError(f"rank {rank} refuses, unpicklably")
                error.payload = lambda: None  # type: ignore[attr-defined]
                raise error
            raise ValueError(f"rank {rank} refuses")
        return os.getpid()
