"""Ray nodes the tests start on this machine (loopback only): the clusters of
tests/test_ray_cluster.py, and the one head each test process shares with the ``corerl`` runs it
starts (:func:`shared_head_address`), so that a run joins a running cluster instead of paying
for a local runtime's start and stop of its own (about 8 s of a 2-step demo run's 40 on 2 cores).
The test process's own Ray groups (the world-size-2 conformance classes) join that head too
(:func:`joining_the_shared_head`)."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

RAY = Path(sys.executable).with_name("ray")
#: what the shared head's workers see beyond this process's environment (no test reaches a hub or W&B)
SHARED_HEAD_ENV = {"HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}


def ray_env() -> dict[str, str]:
    """This environment without corerl's variables or a cluster address, token authentication off."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORERL_", "RAY_ADDRESS"))}
    env["RAY_AUTH_MODE"] = "disabled"  # a throwaway loopback cluster; clients would otherwise need its token
    return env


def start_node(args: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``ray start ... --block`` on loopback; returns once the node says it is up."""
    log = log_path.open("w")
    node = subprocess.Popen([str(RAY), "start", "--node-ip-address=127.0.0.1", "--block", *args],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    ready = time.monotonic() + 90
    while "will now block" not in log_path.read_text() and time.monotonic() < ready:
        if node.poll() is not None:
            raise RuntimeError(f"ray start exited: {log_path.read_text()[-2000:]}")
        time.sleep(0.2)  # a node prints that line once its services accept clients
    return node


def stop_node(node: subprocess.Popen[bytes], grace_s: float = 3.0) -> None:
    """SIGTERM to the node's processes, then SIGKILL to those left after ``grace_s``. A head
    started by ``ray start --block`` never exits on SIGTERM by itself (Ray 2.60: its raylet does,
    its ``ray start``, GCS and monitor wait on), so a longer grace only adds to every test run's end;
    its workers leave once their raylet is gone, and its folder goes with :func:`ray_cluster`."""
    try:
        os.killpg(node.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        node.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(node.pid, signal.SIGKILL)
        node.wait()


@contextmanager
def ray_cluster(log_dir: Path, nodes: int, cpus_per_node: int, env: dict[str, str] | None = None,
                started: list[subprocess.Popen[bytes]] | None = None) -> Iterator[str]:
    """A head (plus ``nodes - 1`` workers) on this machine, its workers seeing ``env`` besides
    :func:`ray_env`; yields the address clients use (``started`` gets the nodes' processes)."""
    from corerl.distributed.worker_group import free_port

    port = free_port()
    env = {**ray_env(), **(env or {})}
    # Ray's sockets live under the temp dir: keep its path short (AF_UNIX paths stop at 107 bytes).
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    started = [] if started is None else started
    try:
        started.append(start_node(["--head", f"--port={port}", f"--num-cpus={cpus_per_node}",
                                   "--include-dashboard=false", f"--temp-dir={temp_dir}"], log_dir / "head.log", env))
        for index in range(1, nodes):
            started.append(start_node([f"--address=127.0.0.1:{port}", f"--num-cpus={cpus_per_node}"],
                                      log_dir / f"worker{index}.log", env))
        yield f"127.0.0.1:{port}"
    finally:
        for node in reversed(started):
            stop_node(node)
        shutil.rmtree(temp_dir, ignore_errors=True)


_shared: dict[str, str] = {}
_shared_nodes: list[subprocess.Popen[bytes]] = []


def shared_head_address() -> str:
    """The address of this process's shared Ray head, started at the first call (4 CPUs: Ray keeps
    as many idle workers ready, which a run's actors start in), stopped when the process exits."""
    if "address" not in _shared:
        stack = ExitStack()
        _shared["address"] = stack.enter_context(ray_cluster(
            Path(tempfile.mkdtemp(prefix="corerl-shared-ray-")), nodes=1, cpus_per_node=4, env=SHARED_HEAD_ENV,
            started=_shared_nodes))
        atexit.register(stack.close)
    return _shared["address"]


def in_shared_head(pid: int) -> bool:
    """Whether process ``pid`` belongs to this process's shared head (its session: every process
    the head's ``ray start`` started, its workers included)."""
    try:
        return any(os.getsid(pid) == node.pid for node in _shared_nodes)
    except ProcessLookupError:
        return False


def joining_the_shared_head(ensure_ray: Callable[..., None]) -> Callable[..., None]:
    """``corerl.distributed.worker_group.ensure_ray`` for a test process: where it would start a
    local runtime inside this process (no address given, none in ``RAY_ADDRESS``), it joins this
    process's shared head instead. A local runtime would live until the test worker ends, beside
    the head its runs already share: 4 s to start, and its idle services and workers took 1.4 s of
    CPU every 30 s (measured here), some 100 s of CPU over a slow tier's worker."""
    def ensure(address: str | None = None, num_cpus_needed: int = 1) -> None:
        import ray

        if address is not None or os.environ.get("RAY_ADDRESS") or ray.is_initialized():
            ensure_ray(address, num_cpus_needed)
            return
        ensure_ray(shared_head_address(), num_cpus_needed)
        atexit.register(ray.shutdown)  # at exit, before the head stops (atexit runs the latest first)

    return ensure
