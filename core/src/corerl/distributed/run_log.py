"""Where a quiet run's output goes, as its processes see it: the run's log file (``CORERL_RUN_LOG``),
the ``ray.init`` options that keep Ray workers' output off the terminal, and an actor's own
descriptors pointed at that file as it starts. The quiet terminal
(:class:`corerl.reporting.quiet.QuietTerminal`, which re-exports these names) sets the log file
in progress; :mod:`corerl.distributed` reads it here, below the reporting layer."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

#: how a Ray worker learns the log file (set in the job's runtime environment)
RUN_LOG_VARIABLE = "CORERL_RUN_LOG"

#: the log file of the run in progress in this process (None: not quiet; see :func:`ray_options`)
_active_log: Path | None = None


def set_active_log(path: Path | None) -> None:
    """The run in progress logs to ``path`` (None: none); Ray workers started now inherit it."""
    global _active_log
    _active_log = path
    if path is None:
        os.environ.pop(RUN_LOG_VARIABLE, None)
    else:
        os.environ[RUN_LOG_VARIABLE] = str(path)


def ray_options() -> dict[str, Any]:
    """``ray.init`` options of a quiet run: the workers' output is not forwarded to this terminal
    (nothing when the run is not quiet)."""
    return {"log_to_driver": False} if _active_log is not None else {}


def write_output_to_run_log() -> None:
    """In a Ray actor of a quiet run (``CORERL_RUN_LOG`` inherited): descriptors 1 and 2 append to
    the run's log file, and Python's logging (INFO and above, as in the driver) writes there too. Elsewhere (no variable, a node that cannot reach the file) nothing
    changes and Ray's own worker logs keep the output."""
    try:
        fd = os.open(os.environ[RUN_LOG_VARIABLE], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except (KeyError, OSError):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # Python's logging as the driver's: INFO and above of every logger (a backend's own in the
    # asynchronous generation worker, corerl's), each line naming the process it came from
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s %(name)s (pid {os.getpid()}): %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(min(root.level, logging.INFO) if root.level else logging.INFO)
    logging.getLogger("corerl").setLevel(logging.INFO)
