"""A killed run resumes from its last complete checkpoint and ends with the same per-step metrics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from tests.conftest import CORERL, REPO, clean_env, run_corerl

COMMON = ["algorithm.max_steps=6", "checkpointing.enabled=true", "checkpointing.save_period=2",
          "checkpointing.keep_last=2", "algorithm.batch_size=4", "algorithm.num_generations_per_prompt=4"]


def _rows(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]


def test_sigkilled_run_resumes_from_the_last_complete_checkpoint_with_identical_metrics(tmp_path):
    straight = run_corerl("run", f"run.output_dir={tmp_path}", "run.name=straight", *COMMON)
    assert straight.code == 0, straight

    killed_dir = tmp_path / "killed"
    proc = subprocess.Popen([str(CORERL), "run", f"run.output_dir={tmp_path}", "run.name=killed", *COMMON],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=clean_env(), cwd=REPO,
                            start_new_session=True)
    deadline = time.monotonic() + 240
    while not (killed_dir / "checkpoints" / "step_000004" / "state.json").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before its second checkpoint"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the run and every process it started
    proc.wait(timeout=30)
    # what a save killed halfway leaves behind: a temporary folder without state.json
    partial = killed_dir / "checkpoints" / ".step_000006.tmp"
    partial.mkdir(exist_ok=True)
    (partial / "junk").write_text("half-written")

    resumed = run_corerl("run", f"run.output_dir={tmp_path}", "run.name=killed", *COMMON)
    assert resumed.code == 0, resumed
    assert "resuming from step 4" in " ".join(resumed.out.split())
    want, got = _rows(tmp_path / "straight"), _rows(killed_dir)
    assert len(want) == len(got) == 6
    for a, b in zip(want, got, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert abs(a[key] - b[key]) <= 1e-6 * max(1.0, abs(a[key])), (a["step"], key, a[key], b[key])
    kept = sorted(p.name for p in (killed_dir / "checkpoints").iterdir())
    assert kept == ["step_000004", "step_000006"]  # keep_last=2, the partial one replaced by the real save
