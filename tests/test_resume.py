"""A killed run resumes from its last complete checkpoint and ends with the same per-step
metrics; Ctrl-C saves a checkpoint and exits cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from tests.conftest import CORERL, REPO, clean_env, run_corerl, wait_for_marker

# 2 SFT steps then 6 GRPO steps: checkpoints at global steps 2 (end of SFT), 4, 6 and 8; hf generation
# (a run with its vLLM engine and Ray actors, stopped and resumed: the Ctrl-C test below)
COMMON = ["sft.max_steps=2", "algorithm.max_steps=6", "checkpointing.enabled=true", "checkpointing.save_period=2",
          "checkpointing.keep_last=2", "algorithm.batch_size=4", "algorithm.num_generations_per_prompt=4",
          "policy.generation.backend=hf"]


def _rows(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]


def _same_metrics(want, got):
    assert len(want) == len(got)
    for a, b in zip(want, got, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            if isinstance(a[key], str):
                assert a[key] == b[key]
            else:
                assert abs(a[key] - b[key]) <= 1e-6 * max(1.0, abs(a[key])), (a["phase"], a["step"], key, a[key], b[key])


def _start(tmp_path, name, *args, env=None):
    return subprocess.Popen([str(CORERL), "run", f"run.output_dir={tmp_path}", f"run.name={name}", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(env), cwd=REPO,
                            start_new_session=True)


def test_a_run_sigkilled_inside_a_checkpoint_save_resumes_from_the_last_complete_one(tmp_path):
    straight = run_corerl("run", f"run.output_dir={tmp_path}", "run.name=straight", *COMMON)
    assert straight.code == 0, straight

    # the run stops inside the step-6 save (training state written, folder not sealed) until killed
    markers = tmp_path / "markers"
    proc = _start(tmp_path, "killed", *COMMON, env={"CORERL_PROGRESS_MARKERS": str(markers),
                                                     "CORERL_TEST_HOLD_AT": "folder:step_000006:filled"})
    killed_dir = tmp_path / "killed"
    wait_for_marker(markers, "folder:step_000006:filled", proc, seconds=240)
    os.killpg(proc.pid, signal.SIGKILL)  # the run and every process it started, in the middle of the save
    proc.wait(timeout=30)
    (partial,) = (killed_dir / "checkpoints").glob(".step_000006.partial-*")
    assert (partial / "training").is_dir() and (partial / "state.json").exists()  # written, never sealed
    assert sorted(p.name for p in (killed_dir / "checkpoints").iterdir() if not p.name.startswith(".")) == [
        "step_000002", "step_000004"]

    resumed = run_corerl("run", f"run.output_dir={tmp_path}", "run.name=killed", *COMMON)
    assert resumed.code == 0, resumed
    assert "resuming from step 4" in resumed.out
    want, got = _rows(tmp_path / "straight"), _rows(killed_dir)
    assert [r["phase"] for r in want] == ["sft"] * 2 + ["grpo"] * 6
    _same_metrics(want, got)
    kept = sorted(p.name for p in (killed_dir / "checkpoints").iterdir())
    assert kept == ["step_000006", "step_000008"]  # keep_last=2, the partial save replaced by a real one


def test_ctrl_c_saves_a_checkpoint_and_exits_cleanly_then_the_run_resumes(tmp_path):
    args = ["sft.max_steps=2", "algorithm.max_steps=40", "algorithm.batch_size=4", "algorithm.num_generations_per_prompt=4"]
    proc = _start(tmp_path, "interrupted", *args)  # checkpointing is off: Ctrl-C saves anyway
    run_dir = tmp_path / "interrupted"
    deadline = time.monotonic() + 240
    while not (run_dir / "metrics.jsonl").exists() or len((run_dir / "metrics.jsonl").read_text().splitlines()) < 5:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err, err
    (checkpoint,) = (run_dir / "checkpoints").iterdir()
    step = int(checkpoint.name.removeprefix("step_"))
    assert 5 <= step < 42 and f"saved a checkpoint at step {step}" in out
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == step

    # algorithm.max_steps may change on resume: two more GRPO steps, not the 40 asked at first
    shorter = [*args[:1], f"algorithm.max_steps={step}", *args[2:]]  # step - 2 GRPO steps done, 2 to go
    resumed = run_corerl("run", f"run.output_dir={tmp_path}", "run.name=interrupted", *shorter)
    assert resumed.code == 0, resumed
    assert f"resuming from step {step}" in resumed.out
    assert len(_rows(run_dir)) == step + 2


def test_a_spent_save_by_budget_saves_a_checkpoint_exits_0_and_the_run_resumes_to_the_end(tmp_path):
    """checkpointing.save_by (NeMo RL's checkpoint_must_save_by): once the budget is spent (here at
    once: a budget of 0), the run saves and stops with status 0; the same command then resumes it
    to its last step."""
    args = [*COMMON, "checkpointing.save_period=100"]
    stopped = run_corerl("run", f"run.output_dir={tmp_path}", "run.name=budget", *args, "checkpointing.save_by='0'")
    assert stopped.code == 0, stopped
    assert "checkpointing.save_by (0) ran out: saved a checkpoint at step 0" in stopped.out, stopped.out
    run_dir = tmp_path / "budget"
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_000000"]
    assert not (run_dir / "final").exists()
    finished = run_corerl("run", f"run.output_dir={tmp_path}", "run.name=budget", *args)
    assert finished.code == 0, finished
    assert "resuming from step 0" in finished.out and (run_dir / "final").exists()
    assert len(_rows(run_dir)) == 8
