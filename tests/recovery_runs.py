"""A run that recovers by itself from injected faults, beside the same run never interrupted: the
shared body of the in-run recovery tests of every backend (``tests/test_recovery.py``, the megatron
and deepspeed plugins' ``test_*_recovery.py``).

Both runs start at once (the faulted one spends much of its time restarting workers, so the two
share the machine's cores well). While the faulted run goes on, each recovery's replaced ranks
(their pids, from the rank workers' markers before the fault) must be gone: no orphans."""

from __future__ import annotations

import json
import math
import subprocess
import time
from pathlib import Path

import attrs
import psutil

from corerl.run.recovery import RECOVERY_PHASE
from tests.conftest import CORERL, REPO, clean_env, markers_written


@attrs.frozen
class RecoveredRun:
    """The faulted run's terminal output and recovery rows, its steps and the uninterrupted run's
    (and that run's terminal output: a test may check what that run says too)."""

    out: str
    recoveries: list[dict]
    got: list[dict]
    want: list[dict]
    straight_out: str


def steps(run_dir: Path) -> list[dict]:
    """metrics.jsonl's step rows, less timings (the recovery rows are events, not steps)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "refit/"))} for r in rows
            if r["phase"] != RECOVERY_PHASE]


def _pids_before(lines: list[str], fault: str) -> set[int]:
    return {int(line.rsplit(" ", 1)[1]) for line in lines[:lines.index(f"fault:{fault}")] if ":pid " in line}


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def run_with_faults(tmp_path: Path, args: list[str], faults: list[str], *extra: str, timeout_s: float = 600,
                    straight: list[str] | None = None, variables: dict[str, str] | None = None) -> RecoveredRun:
    """``corerl run *args`` twice: once as it is (or as the command ``straight`` says: a launcher
    that must give the same run), once with ``faults`` injected (``CORERL_TEST_FAULTS``) and
    ``run.max_restarts`` set to their number (plus ``extra``); both with the ``CORERL_*``
    ``variables``."""
    command = straight or [str(CORERL), "run", *args]
    uninterrupted = subprocess.Popen([*command, f"run.output_dir={tmp_path}", "run.name=straight"], text=True,
                                     env=clean_env(variables), cwd=REPO, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
    markers = tmp_path / "markers"
    env = clean_env({**(variables or {}), "CORERL_PROGRESS_MARKERS": str(markers),
                     "CORERL_TEST_FAULTS": ",".join(faults)})
    proc = subprocess.Popen([str(CORERL), "run", f"run.output_dir={tmp_path}", "run.name=recovered", *args,
                             f"run.max_restarts={len(faults)}", *extra], text=True, env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    checked: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while True:
        lines = markers_written(markers)
        for restart in range(1, len(faults) + 1):
            if restart not in checked and f"recovery:{restart}" in lines:
                leftover = {pid for pid in _pids_before(lines, faults[restart - 1]) if _alive(pid)}
                assert not leftover, f"ranks {leftover} outlived recovery {restart}"
                checked.add(restart)
        if proc.poll() is not None:
            break
        assert time.monotonic() < deadline, "the faulted run did not end in time"
        time.sleep(0.05)
    out = proc.stdout.read()
    assert proc.returncode == 0, out
    assert checked == set(range(1, len(faults) + 1)), (checked, out)
    straight_out = uninterrupted.communicate(timeout=timeout_s)[0]
    assert uninterrupted.returncode == 0, straight_out
    for restart in range(1, len(faults) + 1):
        assert f"(restart {restart} of run.max_restarts={len(faults)})" in out, out
    run_dir = tmp_path / "recovered"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    recoveries = [r for r in rows if r["phase"] == RECOVERY_PHASE]
    assert [r["restart"] for r in recoveries] == list(range(1, len(faults) + 1))
    assert all(r["recover_s"] > 0 and r["steps_redone"] >= 0 for r in recoveries)
    return RecoveredRun(out, recoveries, steps(run_dir), steps(tmp_path / "straight"), straight_out)


def assert_same_steps(want: list[dict], got: list[dict], tolerance: float = 1e-6) -> None:
    """The same steps in the same order, every string equal and every number within ``tolerance``."""
    assert [(r["phase"], r["step"]) for r in got] == [(r["phase"], r["step"]) for r in want]
    for a, b in zip(want, got, strict=True):
        assert a.keys() == b.keys(), (a["phase"], a["step"])
        for key, value in a.items():
            # a None (a metric not logged that step) must be None in both runs: a number in one and
            # None in the other is a difference, never skipped
            assert (value is None) == (b[key] is None), (a["phase"], a["step"], key, value, b[key])
            if isinstance(value, str):
                assert value == b[key]
            elif isinstance(value, list):
                assert len(value) == len(b[key]) and all(
                    math.isclose(x, y, rel_tol=tolerance, abs_tol=tolerance) for x, y in zip(value, b[key], strict=True)), key
            elif value is not None:
                assert math.isclose(value, b[key], rel_tol=tolerance, abs_tol=tolerance), (a["phase"], a["step"], key,
                                                                                          value, b[key])


def faults_of(recovered: RecoveredRun) -> list[tuple[str, str, str]]:
    """(worker less its pid, how, during) of each recovery, in order."""
    return [(r["failed"].split(" (pid")[0], r["how"], r["during"]) for r in recovered.recoveries]
