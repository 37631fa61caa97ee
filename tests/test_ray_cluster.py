"""Worker groups join an existing Ray cluster named by RAY_ADDRESS instead of starting one."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from corerl.distributed.worker_group import free_port

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


def test_worker_group_uses_the_cluster_at_ray_address(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORERL_", "RAY_ADDRESS"))}
    env["RAY_AUTH_MODE"] = "disabled"  # a throwaway loopback cluster; clients would otherwise need its token
    # Ray's sockets live under the temp dir: keep its path short (AF_UNIX paths stop at 107 bytes).
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    log = (tmp_path / "head.log").open("w")
    head = subprocess.Popen(
        [str(RAY), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
         "--include-dashboard=false", "--block", f"--temp-dir={temp_dir}"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )
    try:
        ready = time.monotonic() + 90
        while "will now block" not in (tmp_path / "head.log").read_text() and time.monotonic() < ready:
            time.sleep(0.5)  # the head prints that line once its services accept clients
        client_env = {**env, "RAY_ADDRESS": f"127.0.0.1:{port}"}
        proc = subprocess.run([sys.executable, "-c", CLIENT], capture_output=True, text=True, env=client_env,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "SUM [1, 1]" in proc.stdout
        gcs = next(line for line in proc.stdout.splitlines() if line.startswith("GCS "))
        assert gcs.endswith(f":{port}"), gcs  # the existing cluster, not a new local runtime
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)
