"""A group of rank workers the driver talks to as one.

:class:`RayWorkerGroup` starts one Ray actor per rank (on a local Ray runtime, or on the
cluster at ``cluster.ray_address`` / ``RAY_ADDRESS``); :class:`LocalWorkerGroup` runs world
size 1 in this process. Both call a method on every rank and return the results by rank.
A rank that dies or raises ends the whole group at once (the other ranks would wait in a
collective forever) and surfaces as :class:`WorkerFailed` naming the rank.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from corerl.distributed.actor import RankActor, resolve
from corerl.distributed.placement import COLOCATED, POOLS, Pool, PoolLayout, start_timeout_s
from corerl.distributed.ray_sessions import remove_stale_sessions
from corerl.distributed.remote_errors import unwrap_remote
from corerl.distributed.run_log import ray_options
from corerl.distributed.run_variables import run_variables
from corerl.errors import ConfigError, CorerlError
from corerl.failures import first_line
from corerl.generation.shared_weights import remove_stale_shared_memory

log = logging.getLogger(__name__)


class WorkerFailed(CorerlError):
    """A rank died, hung or raised; the group has been shut down.

    ``role``, ``rank``, ``pid``, ``during`` (the method the group was calling) and ``how``
    (``died``, ``hung`` or ``raised``) say which and when: :mod:`corerl.run.recovery` restarts the run's
    workers after a rank that died or hung, never after one that raised (a bug, not a fault)."""

    def __init__(self, message: str, *, hint: str | None = None, role: str = "worker", rank: int | None = None,
                 pid: int | None = None, during: str = "", how: str = "died") -> None:
        super().__init__(message, hint=hint)
        self.role, self.rank, self.pid, self.during, self.how = role, rank, pid, during, how


_call_timeout_s: float | None = None


def set_call_timeout(seconds: float | None) -> None:
    """How long a call on a group of ranks may take before its unanswering ranks count as hung
    (``run.collective_timeout_s``; None: no limit). The run sets it before it starts its engines;
    groups started after read it."""
    global _call_timeout_s
    _call_timeout_s = seconds


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` (an address of this machine) now, for the process
    group's rendezvous; the probe binds that address only."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def held_port(host: str = "127.0.0.1") -> socket.socket:
    """A socket bound to a free port of ``host`` and held there, not listening, with
    ``SO_REUSEADDR``: until it is closed no other probe (a bind to port 0), outgoing connection or
    plain bind on this machine gets that port, while rank 0's store (``SO_REUSEADDR`` too, as
    torch's own) can still listen on it. :func:`free_port` lets the port go at once, and on a busy
    machine another process's socket could take it before rank 0 binds it (rank 0 then fails, and
    the other ranks wait for its store until their connect timeout)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    return sock


def rendezvous_address(pool: Pool, world_size: int) -> tuple[dict[str, str], socket.socket | None]:
    """``MASTER_ADDR``/``MASTER_PORT`` for a group of ``world_size`` ranks in ``pool``: loopback
    when rank 0 and every other rank share the driver's node (rank 0's store then listens on
    loopback alone: :mod:`corerl.distributed.rendezvous`), else rank 0's node address. On one
    node the port comes with its :func:`held_port` socket, for the caller to close once the group
    is done with the port; across nodes nothing can hold rank 0's port from here (None)."""
    import ray

    here = ray.get_runtime_context().get_node_id()
    if all(pool.node_of(rank) == here for rank in range(world_size)):
        hold = held_port()
        return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(hold.getsockname()[1])}, hold
    address = next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == pool.node_of(0))
    # the port is probed here, on the driver's node: the best guess available for rank 0's
    return {"MASTER_ADDR": address, "MASTER_PORT": str(free_port(""))}, None


def process_stopped(pid: int) -> bool:
    """Whether the process ``pid`` of this machine is stopped (SIGSTOP, a debugger) rather than busy."""
    import psutil

    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


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

    def nodes(self) -> list[str]:
        """No Ray nodes: the rank is this process."""
        return []

    def shutdown(self) -> None:
        self.worker = None


def remote_cause(exc: BaseException) -> str:
    """``Type: first line`` of the exception a rank raised. Where it could not be pickled back
    (Ray then sends the remote traceback as text), the traceback's last ``Type: message`` line."""
    cause = getattr(exc, "cause", None)
    if cause is not None and not isinstance(cause, type(exc)):
        return first_line(cause)
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b:?", line) and not line.startswith("ray."):
            return line
    return lines[-1] if lines else type(exc).__name__


NO_CLUSTER_HINT = ("start one there (`ray start --head`), correct the address, or unset both cluster.ray_address "
                   "and RAY_ADDRESS for a local runtime")


def check_cluster_answers(address: str, key: str) -> None:
    """Refuse at once, in one line naming ``key``, a cluster address ``host:port`` where nothing
    listens: Ray itself keeps retrying it for minutes. Other forms ("auto", ``ray://``) are Ray's."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except OSError as exc:
        raise ConfigError(f"nothing answers at {address} ({exc.strerror or exc})", key=key,
                          hint=NO_CLUSTER_HINT) from exc


def ensure_ray(address: str | None, num_cpus_needed: int = 1) -> None:
    """Connect to Ray: ``address``, else ``RAY_ADDRESS``, else a local runtime sized for the job."""
    import ray

    if ray.is_initialized():
        return
    key = "cluster.ray_address" if address else "RAY_ADDRESS"
    address = address or os.environ.get("RAY_ADDRESS")
    # a quiet `corerl run`: the workers write to the run's log file, not to this terminal
    options: dict[str, Any] = {"logging_level": logging.WARNING, "include_dashboard": False, **ray_options()}
    if address:
        check_cluster_answers(address, key)
        try:
            ray.init(address=address, **options)
        except ConnectionError as exc:  # a cluster that is not there is the user's setting, not a bug
            raise ConfigError(f"no Ray cluster answers at {address} ({first_line(exc)})", key=key,
                              hint=NO_CLUSTER_HINT) from exc
        return
    # A local runtime of our own (Ray says, once, that token authentication is on: keep it on)
    ray.init(num_cpus=max(os.cpu_count() or 1, num_cpus_needed), **options)
    private_token()
    context = ray.get_runtime_context()
    atexit.register(remove_local_session, os.path.join(context.get_temp_dir(), context.get_session_name()))
    remove_stale_sessions(Path(context.get_temp_dir()), keep=context.get_session_name())  # left by killed runs
    remove_stale_shared_memory()  # a killed run's weights in shared memory, too


def remove_local_session(session_dir: str) -> None:
    """Stop the local Ray runtime this process started and remove its session folder (logs,
    sockets, spilled objects), which Ray leaves behind in its temp folder after every run."""
    import shutil

    import ray

    ray.shutdown()
    failures: list[str] = []
    shutil.rmtree(session_dir, onerror=lambda _fn, path, info: failures.append(f"{path}: {info[1]}"))
    if failures:  # a file still held open: the folder stays, say so
        log.warning("could not remove Ray's session folder %s (%s)", session_dir, failures[0])
    latest = os.path.join(os.path.dirname(session_dir), "session_latest")
    if os.path.islink(latest) and os.readlink(latest) == session_dir:
        os.unlink(latest)


def private_token() -> None:
    """Make the token Ray's authentication writes (``~/.ray/auth_token``, 0644 as Ray leaves it)
    readable by its owner only: anyone who can read it can run code in the user's runs."""
    token = Path.home() / ".ray" / "auth_token"
    try:
        if token.is_file() and token.stat().st_uid == os.getuid() and token.stat().st_mode & 0o077:
            token.chmod(0o600)
    except OSError as exc:  # a read-only home: say so, the run itself is not affected
        log.warning("could not make %s private (%s)", token, exc)


class RayWorkerGroup:
    """One Ray actor per rank; rank ``r`` builds ``worker_path(rank=r, world_size=n, **kwargs)``.

    ``role`` names the workers in errors ("training worker rank 1 (pid 123) died during 'train_step'").
    ``layout`` names the pool of devices the ranks run in (:mod:`corerl.distributed.placement`):
    groups with the same layout share its GPUs bundle by bundle (policy, reference, colocated
    engine); unset, a colocated pool of ``world_size`` slots on one node. A request the cluster
    can never satisfy raises :class:`~corerl.errors.ConfigError` at once, naming the layout's key.
    """

    def __init__(
        self,
        worker_path: str,
        world_size: int,
        *,
        ray_address: str | None = None,
        layout: PoolLayout | None = None,
        env: dict[str, str] | None = None,
        role: str = "worker",
        **kwargs: Any,
    ) -> None:
        import ray

        self.role = role
        self.world_size = world_size
        self.call_timeout_s = _call_timeout_s
        self.slowest: dict[str, float] = {}  # seconds of the slowest call of each kind (method) so far
        self._failed: str | None = None
        self._pids: list[int] = []
        self._nodes: list[str] = []
        self.actors: list[Any] = []
        self.pool: Pool | None = None
        self._port_hold: socket.socket | None = None
        ensure_ray(ray_address, world_size)
        self.pool = POOLS.acquire(layout or PoolLayout(COLOCATED, 1, world_size), world_size, role)
        address, self._port_hold = rendezvous_address(self.pool, world_size)
        rendezvous = {**run_variables(), **address, **(env or {})}
        actor_cls = ray.remote(RankActor)
        # Every rank asks for no CPU and a share of its bundle's GPU: the backend sets its threads,
        # and the bundle (reserved once per pool) is what keeps groups apart or together.
        self.actors = [
            actor_cls.options(max_restarts=0, **self.pool.actor_options(rank)).remote(
                worker_path, rank, world_size, rendezvous, kwargs, role
            )
            for rank in range(world_size)
        ]
        started = [actor.pid.remote() for actor in self.actors]
        # a rank that fails to start ends the start at once (the others may wait for it until
        # their own connect timeouts); ranks that do not answer at all, after the start timeout
        self._pids = self._gather(started, "start")
        self._nodes = [self.pool.node_of(rank) for rank in range(world_size)]
        log.info("%d %ss on %d Ray node(s), %s", world_size, role, len(set(self._nodes)),
                 "a GPU share each" if self.pool.gpus else "CPU")

    def nodes(self) -> list[str]:
        """The Ray node id of each rank, by rank."""
        return list(self._nodes)

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
        import time

        import ray
        from ray.exceptions import RayActorError, RayTaskError

        rank_of = {f: rank for rank, f in enumerate(futures)}
        results: list[Any] = [None] * len(futures)
        pending = list(futures)
        begin = time.monotonic()
        limit = self.call_timeout_s if what != "start" else start_timeout_s()  # the start has its own limit
        while pending:
            left = None if limit is None else max(0.0, begin + limit - time.monotonic())
            done, pending = ray.wait(pending, num_returns=1, timeout=left)
            if not done and what == "start":
                self._not_started(len(futures) - len(pending), limit or 0.0)
            if not done:
                self._hung(sorted(rank_of[f] for f in pending), what, limit or 0.0)
            for future in done:
                rank = rank_of[future]
                try:
                    results[rank] = ray.get(future)
                except RayTaskError as exc:
                    cause = unwrap_remote(exc)  # with the rank's traceback chained to it
                    self._blame_a_dead_rank(pending, rank_of, what)
                    self._fail(rank, what, "raised", f"raised {remote_cause(exc)}", cause)
                except RayActorError as exc:
                    raised = exc.args[0] if getattr(exc, "actor_init_failed", False) and exc.args else None
                    if isinstance(raised, RayTaskError):  # the rank's constructor raised: not a death
                        self._fail(rank, what, "raised", f"raised {remote_cause(raised)}", unwrap_remote(raised))
                    self._fail(rank, what, "died", "died", exc)
        self.slowest[what] = max(self.slowest.get(what, 0.0), time.monotonic() - begin)
        return results

    def _not_started(self, started: int, limit: float) -> None:
        self.shutdown()
        raise WorkerFailed(
            f"Ray started {started} of {self.world_size} {self.role}s within {limit:.0f} s",
            hint="see the Ray log for the actors' start-up errors, or raise CORERL_WORKER_START_TIMEOUT",
            role=self.role, during="start", how="hung",
        )

    def _hung(self, ranks: list[int], what: str, limit: float) -> None:
        """Ranks that did not answer ``what`` within the call timeout: killed (SIGKILL where the
        rank is a process of this node: a stopped one takes nothing else), then reported."""
        import signal

        log.warning("%s rank(s) %s did not answer %r within %g s (run.collective_timeout_s); the slowest call of "
                    "each kind so far: %s", self.role, ranks, what, limit,
                    ", ".join(f"{kind} {seconds:.1f} s" for kind, seconds in sorted(self.slowest.items())) or "none")
        here = self._this_node()
        local = [rank for rank in ranks if self._pids and (not self._nodes or self._nodes[rank] == here)]
        stopped = [rank for rank in local if process_stopped(self._pids[rank])]
        for rank in local:
            try:
                os.kill(self._pids[rank], signal.SIGKILL)
            except (ProcessLookupError, PermissionError) as exc:
                log.debug("kill rank %d: %s", rank, exc)
        ranks = stopped or ranks  # the others wait for them in a collective
        pids = f" (pid {', '.join(str(self._pids[r]) for r in ranks)})" if self._pids else ""
        slowest = self.slowest.get(what)
        self._failed = (f"{self.role} rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}{pids} did not "
                        f"answer {what!r} within {limit:g} s" + (f" (its slowest {what!r} before: {slowest:.1f} s)"
                                                                   if slowest is not None else ""))
        self.shutdown()
        raise WorkerFailed(f"{self._failed}; the group was killed", role=self.role, rank=ranks[0],
                           pid=self._pids[ranks[0]] if self._pids else None, during=what, how="hung",
                           hint="raise run.collective_timeout_s if such a call may take that long")

    @staticmethod
    def _this_node() -> str | None:
        import ray

        try:
            return ray.get_runtime_context().get_node_id()
        except Exception:  # Ray shut down: no node to compare with  # noqa: BLE001
            return None

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
                self._fail(rank_of[future], what, "died", "died", exc)
            except Exception as exc:  # another consequence of the same failure  # noqa: BLE001
                log.debug("rank %d also failed: %s", rank_of[future], exc)

    def _fail(self, rank: int, what: str, kind: str, how: str, exc: BaseException) -> None:
        """Shut the whole group down (the other ranks may wait in a collective forever), then raise."""
        pid = self._pids[rank] if self._pids else None
        who = f"rank {rank}" + (f" (pid {pid})" if pid else "")
        self._failed = f"{self.role} {who} {how} during {what!r}"
        self.shutdown()
        if isinstance(exc, CorerlError):  # a user error raised on a rank keeps its type and message
            raise type(exc)(f"{exc.message} (on rank {rank})", key=exc.key, source=exc.source, hint=exc.hint) from exc
        raise WorkerFailed(
            f"{self._failed}; the group was shut down", hint="see the worker's log above for its last words",
            role=self.role, rank=rank, pid=pid, during=what, how=kind,
        ) from exc

    def shutdown(self) -> None:
        """Kill every actor and give the pool back (idempotent)."""
        import ray

        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception as exc:  # already dead: nothing to release
                log.debug("ray.kill: %s", exc)
        self.actors = []
        if self._port_hold is not None:  # the group's store is gone: its port may go too
            self._port_hold.close()
            self._port_hold = None
        if self.pool is not None:
            pool, self.pool = self.pool, None
            POOLS.release(pool)
