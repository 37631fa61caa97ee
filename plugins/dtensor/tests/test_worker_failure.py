"""A worker that dies mid-step ends the run quickly, names its rank, and leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil

DRIVER = textwrap.dedent(
    """
    import json, sys, tempfile
    from corerl.config import load_config
    from corerl.errors import CorerlError
    from corerl.models.tiny import build_tiny_model
    from corerl.plugin_manager import PluginHost
    from corerl.testing import write_recipe
    from corerl.testing.conformance import conformance_batch, conformance_loss
    from corerl_dtensor.backend import DTensorBackend

    if __name__ == "__main__":
        host = PluginHost()  # first, as the CLI does: plugins quiet their libraries' import-time notices
        work = tempfile.mkdtemp()
        model = str(build_tiny_model(work + "/model", hidden_size=128, num_layers=4))
        recipe = write_recipe(__import__("pathlib").Path(work) / "r.yaml", {"policy": {"model_name": model}})
        config = load_config(recipe, ["cluster.gpus_per_node=2", "policy.train_micro_batch_size=1"], host)
        try:
            backend = DTensorBackend(config)
            backend.load_hf(model)
            print(json.dumps({"pids": backend.worker_pids()}), flush=True)
            batch = conformance_batch(rows=8, length=64)
            while True:
                backend.train_step(batch, conformance_loss)
        except CorerlError as exc:
            print(f"corerl: error: {exc}", file=sys.stderr)
            sys.exit(1)
    """
)


def test_killing_a_worker_mid_step_ends_the_run_naming_the_rank(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORERL_")}
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        pids = json.loads(line)["pids"]
        time.sleep(3)  # a few steps in: the kill lands mid-step
        descendants = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        assert set(pids) <= set(descendants)
        killed_at = time.monotonic()
        os.kill(pids[1], signal.SIGKILL)
        _, stderr = proc.communicate(timeout=60)
        elapsed = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, stderr
    # the surviving rank's own gloo error may be forwarded by Ray after the driver's line: find ours
    (last,) = [line for line in stderr.splitlines() if line.startswith("corerl: error:")]
    assert last.startswith("corerl: error: training worker rank 1") and "died" in last, last
    assert elapsed < 60
    print(f"\nrun ended {elapsed:.1f} s after the kill: {last}")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        alive = [pid for pid in descendants if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            break
        time.sleep(0.5)
    assert not alive, f"orphaned processes: {[psutil.Process(p).cmdline()[:3] for p in alive]}"
