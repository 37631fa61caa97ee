"""Ray's session folders left behind by local runs that were killed.

A local Ray runtime keeps its logs, sockets and spilled objects in ``<Ray temp>/session_<date>_<pid>``
(``pid``: the process that started it). A run that ends removes its own
(:func:`corerl.distributed.worker_group.remove_local_session`); one killed with SIGKILL cannot, and
each such folder (world-writable, about 200 KB) stays. The next local run removes those whose
processes are gone: the starting process has exited and no running process names the folder
(a ``ray start --head`` cluster outlives the command that started it, and its processes name their
session folder on their command lines). Ray has no API for this; ``ray stop`` kills live runtimes."""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

_SESSION = re.compile(r"session_\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}_\d+_(?P<pid>\d+)")


def remove_stale_sessions(ray_temp: Path, keep: str | None = None) -> list[Path]:
    """Remove the session folders under ``ray_temp`` that are this user's and whose processes are
    gone (never ``keep``, the caller's own); returns the folders removed."""
    import psutil

    candidates = []
    for folder in ray_temp.glob("session_*"):
        match = _SESSION.fullmatch(folder.name)
        if match is None or folder.name == keep or folder.is_symlink() or not folder.is_dir():
            continue
        try:
            if folder.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        if not psutil.pid_exists(int(match["pid"])):
            candidates.append(folder)
    if not candidates:
        return []
    named = _named_by_running_processes({folder.name for folder in candidates})
    removed = []
    for folder in candidates:
        if folder.name in named:
            continue
        try:
            shutil.rmtree(folder)
        except OSError as exc:  # a file of another user's process in it: the folder stays
            log.info("could not remove Ray's stale session folder %s (%s)", folder, exc)
        else:
            removed.append(folder)
    latest = ray_temp / "session_latest"
    if latest.is_symlink() and not latest.exists():
        latest.unlink(missing_ok=True)
    if removed:
        log.info("removed %d stale Ray session folder(s) of killed runs under %s", len(removed), ray_temp)
    return removed


def _named_by_running_processes(names: set[str]) -> set[str]:
    """Which of the session folder ``names`` a running process names on its command line."""
    import psutil

    named: set[str] = set()
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info.get("cmdline") or ())
        named.update(name for name in names if name in line)
    return named
