"""Worker groups on Ray clusters started here (loopback only): joining the cluster named by
RAY_ADDRESS instead of starting one, and a recipe whose ranks spread over two nodes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from corerl.distributed.worker_group import free_port
from tests.conftest import CORERL, REPO

RAY = Path(sys.executable).with_name("ray")

CLIENT = textwrap.dedent(
    """
    import ray
    from corerl.distributed.worker_group import RayWorkerGroup
    group = RayWorkerGroup("corerl.testing.workers:ProbeWorker", 2)
    print("SUM", group.call("all_reduce_rank"))
    print("GCS", ray.get_runtime_context().gcs_address)
    group.shutdown()
    """
)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORERL_", "RAY_ADDRESS"))}
    env["RAY_AUTH_MODE"] = "disabled"  # a throwaway loopback cluster; clients would otherwise need its token
    return env


def _start_node(args: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``ray start ... --block`` on loopback; returns once the node says it is up."""
    log = log_path.open("w")
    node = subprocess.Popen([str(RAY), "start", "--node-ip-address=127.0.0.1", "--block", *args],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    ready = time.monotonic() + 90
    while "will now block" not in log_path.read_text() and time.monotonic() < ready:
        if node.poll() is not None:
            raise RuntimeError(f"ray start exited: {log_path.read_text()[-2000:]}")
        time.sleep(0.5)  # a node prints that line once its services accept clients
    return node


def _stop(node: subprocess.Popen[bytes]) -> None:
    os.killpg(node.pid, signal.SIGTERM)
    try:
        node.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(node.pid, signal.SIGKILL)


@contextmanager
def ray_cluster(tmp_path: Path, nodes: int, cpus_per_node: int) -> Iterator[str]:
    """A head (plus ``nodes - 1`` workers) on this machine; yields the address clients use."""
    port = free_port()
    env = _env()
    # Ray's sockets live under the temp dir: keep its path short (AF_UNIX paths stop at 107 bytes).
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    started: list[subprocess.Popen[bytes]] = []
    try:
        started.append(_start_node(["--head", f"--port={port}", f"--num-cpus={cpus_per_node}",
                                    "--include-dashboard=false", f"--temp-dir={temp_dir}"], tmp_path / "head.log", env))
        for index in range(1, nodes):
            started.append(_start_node([f"--address=127.0.0.1:{port}", f"--num-cpus={cpus_per_node}"],
                                       tmp_path / f"worker{index}.log", env))
        yield f"127.0.0.1:{port}"
    finally:
        for node in reversed(started):
            _stop(node)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_worker_group_uses_the_cluster_at_ray_address(tmp_path):
    with ray_cluster(tmp_path, nodes=1, cpus_per_node=2) as address:
        proc = subprocess.run([sys.executable, "-c", CLIENT], capture_output=True, text=True,
                              env={**_env(), "RAY_ADDRESS": address}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "SUM [1, 1]" in proc.stdout
    gcs = next(line for line in proc.stdout.splitlines() if line.startswith("GCS "))
    assert gcs.endswith(address.split(":")[1]), gcs  # the existing cluster, not a new local runtime


@pytest.mark.slow
def test_the_demo_recipe_runs_with_its_ranks_spread_over_two_ray_nodes(tmp_path):
    with ray_cluster(tmp_path, nodes=2, cpus_per_node=1) as address:
        proc = subprocess.run(
            [str(CORERL), "run", "cluster.num_nodes=2", "cluster.gpus_per_node=1", "policy.generation.backend=hf",
             "sft.max_steps=3", "algorithm.max_steps=3", "algorithm.kl_penalty=0.05", "algorithm.batch_size=4",
             "algorithm.num_generations_per_prompt=4", f"run.output_dir={tmp_path}",
             "run.name=two-nodes"],
            capture_output=True, text=True, env={**_env(), "RAY_ADDRESS": address}, timeout=400, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    # the policy and the KL reference: each rank of each group on its own node
    assert out.count("dtensor: 2 rank(s) on 2 Ray node(s)") == 2, out[-3000:]
    assert (tmp_path / "two-nodes" / "final" / "config.json").exists()
