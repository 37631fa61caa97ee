"""Named points of a run's life, for the fault-injection tests (kill at a chosen moment).

Off unless ``CORERL_PROGRESS_MARKERS`` names a file: each :func:`mark` then appends its name as
one line. ``CORERL_TEST_HOLD_AT=<name>`` makes the process stop at that marker (after writing
it) until it is killed, so a test can kill a run exactly there instead of guessing with sleeps.
``CORERL_TEST_NO_SPACE_AT=<name>`` makes the write in progress there fail as a full disk does
(``OSError`` ENOSPC), so a test can fill the disk at a chosen moment.

The rank workers mark each call they take, ``<role> <rank>:<method>`` (``training worker 1:train_step``).
``CORERL_TEST_FAULTS`` lists faults to inject, in order, comma-separated ``kill:<name>#<n>`` or
``stop:<name>#<n>``: the process that writes the n-th ``<name>`` line since the previous fault
fired SIGKILLs (or SIGSTOPs) itself there, after writing ``fault:<spec>``; so one run loses ranks
at several chosen points and recovers from each (:mod:`corerl.run.recovery`).
"""

from __future__ import annotations

import errno
import os
import signal
import time

MARKERS_ENV = "CORERL_PROGRESS_MARKERS"
HOLD_ENV = "CORERL_TEST_HOLD_AT"
NO_SPACE_ENV = "CORERL_TEST_NO_SPACE_AT"
FAULTS_ENV = "CORERL_TEST_FAULTS"


def mark(name: str) -> None:
    """Record that the run reached ``name`` (nothing unless the environment asks for markers)."""
    path = os.environ.get(MARKERS_ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(name + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    if os.environ.get(HOLD_ENV) == name:
        while True:  # held for the test to kill
            time.sleep(3600)
    if os.environ.get(NO_SPACE_ENV) == name:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    if os.environ.get(FAULTS_ENV):
        _inject_fault(path, name, os.environ[FAULTS_ENV].split(","))


def _inject_fault(path: str, name: str, faults: list[str]) -> None:
    """Fire the first fault of ``faults`` not yet fired when this is its n-th ``name`` since the one before."""
    with open(path, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    since = 0
    for spec in faults:
        fired = f"fault:{spec}"
        if fired in lines[since:]:
            since = lines.index(fired, since) + 1
            continue
        how, _, point = spec.partition(":")
        target, _, nth = point.rpartition("#")
        if target == name and lines[since:].count(name) == int(nth):
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(fired + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        return


def worker_marker(role: str, rank: int, method: str) -> str:
    """The marker a rank worker writes when a call reaches it."""
    return f"{role} {rank}:{method}"
