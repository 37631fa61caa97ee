"""Named points of a run's life, for the fault-injection tests (kill at a chosen moment).

Off unless ``CORERL_PROGRESS_MARKERS`` names a file: each :func:`mark` then appends its name as
one line. ``CORERL_TEST_HOLD_AT=<name>`` makes the process stop at that marker (after writing
it) until it is killed, so a test can kill a run exactly there instead of guessing with sleeps.
``CORERL_TEST_NO_SPACE_AT=<name>`` makes the write in progress there fail as a full disk does
(``OSError`` ENOSPC), so a test can fill the disk at a chosen moment.
"""

from __future__ import annotations

import errno
import os
import time

MARKERS_ENV = "CORERL_PROGRESS_MARKERS"
HOLD_ENV = "CORERL_TEST_HOLD_AT"
NO_SPACE_ENV = "CORERL_TEST_NO_SPACE_AT"


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
