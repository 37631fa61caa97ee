"""In-run recovery (``run.max_restarts``, :mod:`corerl.recovery`): the logic in process, and one
GRPO run on dtensor at world size 2 that loses a rank at five points (inside a step, inside a
save, during a refit, a rank stopped until the call timeout, and a rank killed while the
recovery loads its checkpoint), recovers from each by itself and ends with an uninterrupted
run's metrics."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from corerl.distributed.worker_group import WorkerFailed
from corerl.recovery import RECOVERY_PHASE, Fault, Recovery, RunStopped, fault_of
from corerl.reporting.metrics_log import MetricsLog
from tests.conftest import CORERL, REPO, clean_env, run_corerl

# -- the logic, in process ------------------------------------------------------------------


def _failed(how: str, during: str = "train_step", rank: int = 1) -> WorkerFailed:
    return WorkerFailed("it failed", role="training worker", rank=rank, pid=100 + rank, during=during, how=how)


def test_a_rank_that_died_or_hung_is_a_fault_and_one_that_raised_is_not():
    assert fault_of(_failed("died")) == Fault("training worker rank 1 (pid 101)", "died", "train_step", "it failed")
    assert fault_of(_failed("hung")).how == "hung"
    assert fault_of(_failed("raised")) is None
    assert fault_of(ValueError("a bug in the driver")) is None
    try:  # met as the cause of another error
        try:
            raise _failed("died")
        except WorkerFailed as exc:
            raise RuntimeError("the step failed") from exc
    except RuntimeError as outer:
        assert fault_of(outer).who == "training worker rank 1 (pid 101)"


def test_recovery_is_bounded_by_max_restarts_and_names_the_checkpoint(tmp_path):
    assert Recovery(0).recover_from(_failed("died"), 3, None) is None  # today's behaviour: the run stops
    recovery = Recovery(2)
    assert recovery.recover_from(_failed("died"), 3, tmp_path / "step_000003") is not None
    (row,) = recovery.recovered(3)
    assert row["phase"] == RECOVERY_PHASE and row["restart"] == 1 and row["steps_redone"] == 0
    assert row["failed"] == "training worker rank 1 (pid 101)" and row["during"] == "train_step" and row["recover_s"] >= 0
    assert recovery.recover_from(_failed("hung", "save_checkpoint"), 5, tmp_path / "step_000004") is not None
    with pytest.raises(RunStopped) as stopped:
        recovery.recover_from(_failed("died", "generate"), 7, tmp_path / "step_000006")
    assert "after 2 restart(s) (run.max_restarts=2)" in str(stopped.value)
    assert f"the same command resumes from {tmp_path / 'step_000006'}" in str(stopped.value)


def test_a_recovery_cut_short_by_another_fault_keeps_its_row():
    recovery = Recovery(3)
    recovery.recover_from(_failed("died"), 6, None)
    recovery.recover_from(_failed("died", "load_checkpoint", rank=0), 4, None)  # while the first one restarts
    rows = recovery.recovered(4)
    assert [(r["restart"], r["during"], r["steps_redone"]) for r in rows] == [(1, "train_step", 2), (2, "load_checkpoint", 0)]
    assert recovery.recovered(4) == []


def test_the_same_step_failing_the_same_way_twice_stops_the_run():
    recovery = Recovery(5)
    assert recovery.recover_from(_failed("died", rank=0), 4, None) is not None
    assert recovery.recover_from(_failed("died", "save_checkpoint", rank=0), 4, None) is not None  # another call
    with pytest.raises(RunStopped) as stopped:
        recovery.recover_from(_failed("died", "save_checkpoint", rank=0), 4, None)
    assert "at step 4 again" in str(stopped.value) and "starts over" in str(stopped.value)


def test_a_cut_metrics_log_keeps_the_recoveries_after_the_checkpoint(tmp_path):
    rows = [{"phase": "grpo", "step": 1}, {"phase": "grpo", "step": 2},
            {"phase": RECOVERY_PHASE, "step": 1, "restart": 1}, {"phase": "grpo", "step": 2}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    log = MetricsLog(tmp_path, keep_lines=1)
    log.close()
    kept = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert kept == [rows[0], rows[2]] and log.lines == 2


def test_a_fault_fires_once_at_its_nth_marker_since_the_one_before(tmp_path, monkeypatch):
    from corerl import progress_markers

    markers = tmp_path / "markers"
    monkeypatch.setenv("CORERL_PROGRESS_MARKERS", str(markers))
    monkeypatch.setenv("CORERL_TEST_FAULTS", "kill:a#2,stop:a#1")
    signals: list[tuple[int, int]] = []
    monkeypatch.setattr(progress_markers.os, "kill", lambda pid, sig: signals.append((pid, sig)))
    for name in ["a", "b", "a", "a", "b"]:
        progress_markers.mark(name)
    assert markers.read_text().splitlines() == ["a", "b", "a", "fault:kill:a#2", "a", "fault:stop:a#1", "b"]
    assert signals == [(os.getpid(), signal.SIGKILL), (os.getpid(), signal.SIGSTOP)]


def test_a_recovery_waits_for_the_cluster_to_fit_the_layout_again(monkeypatch):
    from corerl.distributed import placement
    from corerl.errors import ConfigError

    small = placement.ClusterView([placement.NodeResources("a", cpus=8, gpus=1)])
    big = placement.ClusterView([placement.NodeResources("a", cpus=8, gpus=1), placement.NodeResources("b", cpus=8, gpus=1)])
    views = iter([small, small, big])
    monkeypatch.setattr(placement.ClusterView, "from_ray", classmethod(lambda cls: next(views)))
    monkeypatch.setattr(placement.time, "sleep", lambda seconds: None)
    layout = placement.PoolLayout(placement.COLOCATED, 2, 1, key="cluster.num_nodes")
    registry = placement.PoolRegistry()
    with pytest.raises(ConfigError):  # not recovering: refused at once
        registry._cluster_that_fits(layout, 2, "training worker")
    registry.wait_s = 60.0
    assert registry._cluster_that_fits(layout, 2, "training worker") is big


# -- one run that recovers five times --------------------------------------------------------

ARGS = ["sft.max_steps=2", "algorithm.max_steps=3", "algorithm.batch_size=4", "algorithm.num_generations_per_prompt=4",
        "checkpointing.enabled=true", "checkpointing.save_period=1", "checkpointing.keep_last=1",
        "policy.generation.backend=hf", "policy.training_backend=dtensor", "cluster.gpus_per_node=2"]
# in order, each counted from the one before: inside SFT step 2; inside GRPO step 1's save; in the
# refit after GRPO step 1 (full_state_dict: hf generation reads the policy's weights); rank 0
# stopped inside GRPO step 2 (the call timeout finds it); rank 1 killed while the recovery from
# that loads its checkpoint
FAULTS = ["kill:training worker 1:train_step#2", "kill:training worker 0:save_checkpoint#2",
          "kill:training worker 1:full_state_dict#2", "stop:training worker 0:train_step#2",
          "kill:training worker 1:load_checkpoint#1"]


def _steps(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows if r["phase"] != RECOVERY_PHASE]


def _pids_before(lines: list[str], fault: str) -> set[int]:
    return {int(line.rsplit(" ", 1)[1]) for line in lines[:lines.index(f"fault:{fault}")] if ":pid " in line}


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
def test_a_run_recovers_from_dead_and_hung_ranks_by_itself_and_ends_like_an_uninterrupted_one(tmp_path):
    """Besides: every recovery is a line on the terminal and a row in metrics.jsonl, the ranks of
    the group it replaced are gone once it goes on (no orphans), and a run past run.max_restarts
    stops in one line naming the checkpoint to resume from."""
    straight = run_corerl("run", f"run.output_dir={tmp_path}", "run.name=straight", *ARGS)
    assert straight.code == 0, straight

    markers = tmp_path / "markers"
    env = clean_env({"CORERL_PROGRESS_MARKERS": str(markers), "CORERL_TEST_FAULTS": ",".join(FAULTS)})
    proc = subprocess.Popen([str(CORERL), "run", f"run.output_dir={tmp_path}", "run.name=recovered", *ARGS,
                             "run.max_restarts=5", "run.collective_timeout_s=5"], text=True, env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    checked: set[int] = set()
    while proc.poll() is None or len(checked) < len(FAULTS):  # each recovery's replaced ranks, once it goes on
        lines = markers.read_text().splitlines() if markers.exists() else []
        for restart in range(1, len(FAULTS) + 1):
            if restart not in checked and f"recovery:{restart}" in lines:
                leftover = {pid for pid in _pids_before(lines, FAULTS[restart - 1]) if _alive(pid)}
                assert not leftover, f"ranks {leftover} outlived recovery {restart}"
                checked.add(restart)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    out = proc.stdout.read()
    assert proc.returncode == 0, out
    assert checked == set(range(1, len(FAULTS) + 1)), (checked, out)

    run_dir = tmp_path / "recovered"
    want, got = _steps(tmp_path / "straight"), _steps(run_dir)
    assert [(r["phase"], r["step"]) for r in got] == [(r["phase"], r["step"]) for r in want]
    for a, b in zip(want, got, strict=True):
        assert a.keys() == b.keys()
        for key, value in a.items():
            if isinstance(value, str):
                assert value == b[key]
            else:
                assert math.isclose(value, b[key], rel_tol=1e-6, abs_tol=1e-6), (a["phase"], a["step"], key, value, b[key])

    recoveries = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                  if json.loads(line)["phase"] == RECOVERY_PHASE]
    assert [(r["restart"], r["how"], r["during"]) for r in recoveries] == [
        (1, "died", "train_step"), (2, "died", "save_checkpoint"), (3, "died", "full_state_dict"),
        (4, "hung", "train_step"), (5, "died", "load_checkpoint")]
    assert [r["failed"].split(" (pid")[0] for r in recoveries] == [
        "training worker rank 1", "training worker rank 0", "training worker rank 1", "training worker rank 0",
        "training worker rank 1"]  # the stopped rank is named, not its peer waiting in the collective
    assert all(r["recover_s"] > 0 for r in recoveries)
    for restart in range(1, 6):
        assert f"(restart {restart} of run.max_restarts=5)" in out, out
    assert "did not answer 'train_step' within 5 s" in (run_dir / "run.log").read_text()

    # past run.max_restarts: one line, the checkpoint to resume from, exit 1
    bounded = subprocess.run([str(CORERL), "run", f"run.output_dir={tmp_path}", "run.name=bounded", *ARGS,
                              "run.max_restarts=1", "sft.max_steps=3"], text=True, capture_output=True, cwd=REPO,
                             env=clean_env({"CORERL_PROGRESS_MARKERS": str(tmp_path / "markers-bounded"),
                                            "CORERL_TEST_FAULTS": "kill:training worker 0:train_step#2,"
                                                                  "kill:training worker 1:train_step#2"}), timeout=600)
    assert bounded.returncode == 1, bounded.stdout + bounded.stderr
    stopped = [line for line in bounded.stderr.splitlines() if "run.max_restarts=1" in line]
    assert len(stopped) == 1 and "training worker rank 1" in stopped[0] and "after 1 restart(s)" in stopped[0], bounded.stderr
    assert f"resumes from {tmp_path / 'bounded' / 'checkpoints' / 'step_000002'}" in stopped[0], stopped
    assert os.path.isdir(tmp_path / "bounded" / "checkpoints" / "step_000002")
