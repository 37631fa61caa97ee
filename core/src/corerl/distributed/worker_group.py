"""A group of rank workers the driver talks to as one.

:class:`RayWorkerGroup` starts one Ray actor per rank (on a local Ray runtime, or on the
cluster at ``cluster.ray_address`` / ``RAY_ADDRESS``); :class:`LocalWorkerGroup` runs world
size 1 in this process. Both call a method on every rank and return the results by rank.
A rank that dies or raises ends the whole group at once (the other ranks would wait in a
collective forever) and surfaces as :class:`WorkerFailed` naming the rank.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Sequence
from typing import Any

from corerl.distributed.actor import RankActor, resolve
from corerl.errors import CorerlError

log = logging.getLogger(__name__)


class WorkerFailed(CorerlError):
    """A rank died or raised; the group has been shut down."""


def free_port() -> int:
    """A TCP port that is free on this host now (for the process group's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


class LocalWorkerGroup:
    """World size 1 in the calling process: no Ray, no process group."""

    world_size = 1

    def __init__(self, worker_path: str, **kwargs: Any) -> None:
        self.worker = resolve(worker_path)(rank=0, world_size=1, **kwargs)

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return [getattr(self.worker, method)(*args, **kwargs)]

    def call_per_rank(self, method: str, args_by_rank: Sequence[tuple[Any, ...]]) -> list[Any]:
        (args,) = args_by_rank
        return [getattr(self.worker, method)(*args)]

    def pids(self) -> list[int]:
        return [os.getpid()]

    def shutdown(self) -> None:
        self.worker = None


def ensure_ray(address: str | None, num_cpus_needed: int) -> None:
    """Connect to Ray: ``address``, else ``RAY_ADDRESS``, else a local runtime sized for the job."""
    import ray

    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    options: dict[str, Any] = {"logging_level": logging.WARNING, "include_dashboard": False}
    if address:
        ray.init(address=address, **options)
        return
    # A local runtime of our own: its token-authentication notice is noise on every run.
    notice = logging.getLogger("ray._private.authentication.authentication_token_setup")
    level = notice.level
    notice.setLevel(logging.ERROR)
    try:
        ray.init(num_cpus=max(os.cpu_count() or 1, num_cpus_needed), **options)
    finally:
        notice.setLevel(level)


class RayWorkerGroup:
    """One Ray actor per rank; rank ``r`` builds ``worker_path(rank=r, world_size=n, **kwargs)``.

    ``role`` names the workers in errors ("training worker rank 1 (pid 123) died during 'train_step'").
    ``gpus_per_worker`` unset: one GPU per rank when the cluster has ``world_size`` GPUs, else none.
    """

    def __init__(
        self,
        worker_path: str,
        world_size: int,
        *,
        ray_address: str | None = None,
        gpus_per_worker: float | None = None,
        cpus_per_worker: float = 1,
        env: dict[str, str] | None = None,
        role: str = "worker",
        **kwargs: Any,
    ) -> None:
        import ray

        self.role = role

        ensure_ray(ray_address, int(world_size * cpus_per_worker))
        if gpus_per_worker is None:  # one GPU per rank where the cluster has enough, else CPU ranks
            gpus_per_worker = 1 if ray.cluster_resources().get("GPU", 0) >= world_size else 0
        self.world_size = world_size
        self._failed: str | None = None
        self._pids: list[int] = []
        master_addr = ray.util.get_node_ip_address()
        rendezvous = {"MASTER_ADDR": master_addr, "MASTER_PORT": str(free_port()), **(env or {})}
        actor_cls = ray.remote(RankActor)
        # CPU ranks reserve no Ray CPUs: their threads are set by the backend, and a reservation
        # would leave a second group (a KL reference model, a generation engine) unplaceable on a
        # small machine. GPU ranks are placed by their GPU and keep their CPU reservation.
        cpus = cpus_per_worker if gpus_per_worker else 0
        self.actors = [
            actor_cls.options(num_cpus=cpus, num_gpus=gpus_per_worker, max_restarts=0).remote(
                worker_path, rank, world_size, rendezvous, kwargs
            )
            for rank in range(world_size)
        ]
        started = [actor.pid.remote() for actor in self.actors]
        timeout = float(os.environ.get("CORERL_WORKER_START_TIMEOUT", "300"))
        ready, _ = ray.wait(started, num_returns=len(started), timeout=timeout)
        if len(ready) < len(started):
            free = ray.available_resources()
            self.shutdown()
            raise WorkerFailed(
                f"Ray started {len(ready)} of {world_size} {role}s within {timeout:.0f} s "
                f"(each asks for {cpus} CPU, {gpus_per_worker} GPU; free now: {free.get('CPU', 0):g} CPU, "
                f"{free.get('GPU', 0):g} GPU)",
                hint="free the resources other runs hold, give the cluster more, or raise CORERL_WORKER_START_TIMEOUT",
            )
        self._pids = self._gather(started, "start")

    def pids(self) -> list[int]:
        return list(self._pids)

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``method(*args, **kwargs)`` on every rank; results by rank."""
        self._check_alive()
        return self._gather([a.call.remote(method, args, kwargs) for a in self.actors], method)

    def call_per_rank(self, method: str, args_by_rank: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Call ``method(*args_by_rank[r])`` on rank ``r``; results by rank."""
        self._check_alive()
        futures = [a.call.remote(method, tuple(args), {}) for a, args in zip(self.actors, args_by_rank, strict=True)]
        return self._gather(futures, method)

    def _check_alive(self) -> None:
        if self._failed is not None:
            raise WorkerFailed(f"the worker group was shut down after an earlier failure: {self._failed}")

    def _gather(self, futures: list[Any], what: str) -> list[Any]:
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        rank_of = {f: rank for rank, f in enumerate(futures)}
        results: list[Any] = [None] * len(futures)
        pending = list(futures)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for future in done:
                rank = rank_of[future]
                try:
                    results[rank] = ray.get(future)
                except RayTaskError as exc:
                    cause = exc.cause if exc.cause is not None else exc
                    self._blame_a_dead_rank(pending, rank_of, what)
                    self._fail(rank, what, f"raised {type(cause).__name__}: {cause}", cause)
                except RayActorError as exc:
                    self._fail(rank, what, "died", exc)
        return results

    def _blame_a_dead_rank(self, pending: list[Any], rank_of: dict[Any, int], what: str) -> None:
        """A rank whose peer died fails too (its collective loses the connection), often first:
        wait a moment for the others, and report a rank that died as the cause."""
        import ray
        from ray.exceptions import RayActorError

        done, _ = ray.wait(pending, num_returns=len(pending), timeout=5) if pending else ([], [])
        for future in done:
            try:
                ray.get(future)
            except RayActorError as exc:
                self._fail(rank_of[future], what, "died", exc)
            except Exception as exc:  # another consequence of the same failure  # noqa: BLE001
                log.debug("rank %d also failed: %s", rank_of[future], exc)

    def _fail(self, rank: int, what: str, how: str, exc: BaseException) -> None:
        """Shut the whole group down (the other ranks may wait in a collective forever), then raise."""
        pid = self._pids[rank] if self._pids else None
        who = f"rank {rank}" + (f" (pid {pid})" if pid else "")
        self._failed = f"{self.role} {who} {how} during {what!r}"
        self.shutdown()
        if isinstance(exc, CorerlError):  # a user error raised on a rank keeps its type and message
            raise type(exc)(f"{exc.message} (on rank {rank})", key=exc.key, source=exc.source, hint=exc.hint) from exc
        raise WorkerFailed(
            f"{self._failed}; the group was shut down", hint="see the worker's log above for its last words"
        ) from exc

    def shutdown(self) -> None:
        """Kill every actor (idempotent)."""
        import ray

        for actor in getattr(self, "actors", []):
            try:
                ray.kill(actor, no_restart=True)
            except Exception as exc:  # already dead: nothing to release
                log.debug("ray.kill: %s", exc)
        self.actors = []
