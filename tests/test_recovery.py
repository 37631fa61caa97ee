"""In-run recovery (``run.max_restarts``, :mod:`corerl.run.recovery`): the logic in process, and one
asynchronous GRPO run on dtensor at world size 2 (SFT first, then training beside a dedicated
generation worker at staleness 0, so that it is deterministic) that loses a rank at five points
(inside a step, inside a save, during a refit to the generation worker, a rank stopped until the
call timeout, and a rank killed while the recovery loads its checkpoint), recovers from each by
itself and ends with an uninterrupted run's metrics. The one run checks dtensor, GRPO and the
asynchronous loop: it took the place of a synchronous run and an asynchronous one.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from corerl.distributed.worker_group import WorkerFailed
from corerl.reporting.metrics_log import MetricsLog
from corerl.run.recovery import RECOVERY_PHASE, Fault, Recovery, RunStopped, fault_of
from tests.recovery_runs import assert_same_steps, faults_of, run_with_faults

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
    recovery.recover_from(_failed("hung"), 5, None)
    assert [r["restart"] for r in recovery.recovered(0, started_over=True)] == [1, 2, 3]  # a new log: all of them


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
        "policy.generation.backend=hf", "policy.training_backend=dtensor", "cluster.gpus_per_node=2",
        "run.tensorboard=false"]
ASYNC = ["algorithm.async.enabled=true", "algorithm.async.max_staleness=0", "policy.generation.colocated.enabled=false",
         "policy.generation.colocated.resources.gpus_per_node=1"]
# in order, each counted from the one before: inside SFT step 2; inside GRPO step 1's save; in a
# refit of the generation worker after GRPO step 1 (full_state_dict); rank 0 stopped inside GRPO
# step 2 (the call timeout finds it); rank 1 killed while the recovery from that loads its checkpoint
FAULTS = ["kill:training worker 1:train_step#2", "kill:training worker 0:save_checkpoint#2",
          "kill:training worker 1:full_state_dict#2", "stop:training worker 0:train_step#2",
          "kill:training worker 1:load_checkpoint#1"]


@pytest.mark.slow
def test_a_run_recovers_from_dead_and_hung_ranks_by_itself_and_ends_like_an_uninterrupted_one(tmp_path, runs_beside):
    """Besides: every recovery is a line on the terminal and a row in metrics.jsonl, the ranks of
    the group it replaced are gone once it goes on (no orphans), the stopped rank is named (not
    its peer waiting for it in a collective), and a run past run.max_restarts stops in one line
    naming the checkpoint to resume from (that run starts while the faulted one waits out its
    stopped rank's call timeout, when this machine has cores to spare)."""
    # past run.max_restarts: rank 0 killed inside SFT step 2, then again after the restart (rank 0
    # both times: a dead rank marks nothing more, so the second count starts with the recovery; its
    # peer's marker of the failed step may land after the first fault's)
    bounded_run = runs_beside.start_at(
        tmp_path / "markers", f"fault:{FAULTS[3]}", "run", f"run.output_dir={tmp_path}", "run.name=bounded", *ARGS,
        "run.max_restarts=1", "sft.max_steps=3",
        extra_env={"CORERL_PROGRESS_MARKERS": str(tmp_path / "markers-bounded"),
                   "CORERL_TEST_FAULTS": "kill:training worker 0:train_step#2,kill:training worker 0:train_step#2"})
    # 60 s: a loaded 2-core machine has taken over 15 s for a model load (a false hang)
    recovered = run_with_faults(tmp_path, [*ARGS, *ASYNC], FAULTS, "run.collective_timeout_s=60")
    assert_same_steps(recovered.want, recovered.got)
    assert faults_of(recovered) == [
        ("training worker rank 1", "died", "train_step"), ("training worker rank 0", "died", "save_checkpoint"),
        ("training worker rank 1", "died", "full_state_dict"), ("training worker rank 0", "hung", "train_step"),
        ("training worker rank 1", "died", "load_checkpoint")]
    assert "did not answer 'train_step' within 60 s" in (tmp_path / "recovered" / "run.log").read_text()

    # past run.max_restarts: one line, the checkpoint to resume from, exit 1
    bounded = bounded_run().result()
    assert bounded.code == 1, bounded
    stopped = [line for line in bounded.err.splitlines() if "run.max_restarts=1" in line]
    assert len(stopped) == 1 and "training worker rank 0" in stopped[0] and "after 1 restart(s)" in stopped[0], bounded.err
    assert f"resumes from {tmp_path / 'bounded' / 'checkpoints' / 'step_000002'}" in stopped[0], stopped
    assert os.path.isdir(tmp_path / "bounded" / "checkpoints" / "step_000002")
