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

from tests.conftest import markers_written, wait_for_marker

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


#: rank 1 stops itself (SIGSTOP) when its third train_step call reaches it: the kill lands mid-step
#: (rank 0 inside the same step, waiting for it), on a progress marker rather than after a sleep
FROZEN = "training worker 1:train_step"
FAULT = f"stop:{FROZEN}#3"


def _status_once_settled(pid: int) -> str:
    """The process's status once it is stopped, or its last status after 60 s (a hang guard only)."""
    for _ in range(600):
        status = psutil.Process(pid).status()
        if status == psutil.STATUS_STOPPED:
            break
        time.sleep(0.1)
    return status


def test_killing_a_worker_mid_step_ends_the_run_naming_the_rank(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER, encoding="utf-8")
    markers = tmp_path / "markers.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORERL_")}
    env.update({"CORERL_PROGRESS_MARKERS": str(markers), "CORERL_TEST_FAULTS": FAULT})
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        pids = json.loads(line)["pids"]
        wait_for_marker(markers, f"fault:{FAULT}", proc, seconds=600)  # a guard against a hang only
        written = markers_written(markers)
        assert written.count(FROZEN) == 3 and "training worker 0:train_step" in written, written
        # the marker is written just before the rank stops itself: wait for the stop to land
        status = _status_once_settled(pids[1])
        assert status == psutil.STATUS_STOPPED, status  # frozen inside its step
        descendants = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        assert set(pids) <= set(descendants)
        killed_at = time.monotonic()
        os.kill(pids[1], signal.SIGKILL)
        _, stderr = proc.communicate(timeout=600)  # a guard against a hang only, not a speed check
        elapsed = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, stderr
    # the surviving rank's own gloo error may be forwarded by Ray after the driver's line: find ours.
    # "Quickly" is the path taken, not a clock: the death itself ended the run, not a collective
    # timeout running out (that would say "timed out", not "died")
    (last,) = [line for line in stderr.splitlines() if line.startswith("corerl: error:")]
    assert last.startswith("corerl: error: training worker rank 1") and "died" in last, last
    print(f"\nrun ended {elapsed:.1f} s after the kill: {last}")
    alive = descendants
    for _ in range(1200):  # Ray reaps its workers asynchronously: up to 10 minutes, a hang guard only
        alive = [pid for pid in alive if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            break
        time.sleep(0.5)
    assert not alive, f"orphaned processes: {[psutil.Process(p).cmdline()[:3] for p in alive]}"
