"""Failures of the machine a run writes to, and of the checkpoint engines, as the one-line user
errors they are.

Two kinds of failure are not bugs and must not print as tracebacks: a write that fails for lack
of space or permission (``OSError``, or ``... (os error 28)`` from libraries that write without
Python's ``OSError``, e.g. safetensors), and a failed checkpoint save or load. The second comes
out of ``torch.distributed.checkpoint`` as ``CheckpointException``, which derives from
``BaseException`` (so ``except Exception`` lets it through) and carries each failing rank's own
exception: :func:`checkpoint_failure` names the folder and that cause; a Ctrl-C inside a save
stays a Ctrl-C.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from corerl.errors import RunError

#: what a full, read-only or forbidden output location raises while the run writes
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM})

_OS_ERROR = re.compile(r"os error (\d+)")


def disk_errno(exc: BaseException) -> int | None:
    """The errno of a write that failed for lack of space or permission; None for anything else."""
    if isinstance(exc, OSError):
        return exc.errno if exc.errno in DISK_ERRNOS else None
    found = _OS_ERROR.search(str(exc)) if type(exc).__name__ == "SafetensorError" else None
    if found is not None and int(found.group(1)) in DISK_ERRNOS:
        return int(found.group(1))
    return None


def disk_error(exc: BaseException, run_dir: Path) -> RunError | None:
    """A write that failed for lack of space or permission, as a one-line error naming the file
    (None for any other exception: a real bug stays one)."""
    code = disk_errno(exc)
    if code is None:
        return None
    where = exc.filename if isinstance(exc, OSError) and exc.filename else run_dir
    return RunError(f"writing {where} failed: {os.strerror(code)}; the run stopped there, its last complete "
                    "checkpoint is intact", key="run.output_dir",
                    hint="free space (or point run.output_dir elsewhere) and run the same command to resume")


def first_line(exc: BaseException) -> str:
    """``Type: first non-empty line of the message`` (just ``Type`` for an empty message): an
    exception from a library, said in one line."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def checkpoint_failure(exc: BaseException, action: str, path: str | Path) -> BaseException | None:
    """``torch.distributed.checkpoint``'s ``CheckpointException`` from ``action`` ("saving" or
    "loading") the checkpoint at ``path``, as the error to raise instead: a one-line
    :class:`RunError` naming the folder and the first failing rank's cause (ENOSPC and the like
    by name), or ``KeyboardInterrupt`` when Ctrl-C is what stopped it. None for anything else."""
    failures = getattr(exc, "failures", None)
    if type(exc).__name__ != "CheckpointException" or not isinstance(failures, dict):
        return None
    causes = [(rank, pair[0]) for rank, pair in sorted(failures.items())]
    if any(isinstance(cause, KeyboardInterrupt) for _, cause in causes):
        return KeyboardInterrupt()
    if not causes:
        return RunError(f"{action} checkpoint {path} failed: {first_line(exc)}")
    rank, cause = causes[0]
    ranks = f"rank {rank}" if len(causes) == 1 else f"ranks {', '.join(str(r) for r, _ in causes)}"
    code = disk_errno(cause)
    if action == "saving":
        reason = os.strerror(code) if code is not None else f"{first_line(cause)}{_free_space(path)}"
        return RunError(f"saving checkpoint {path} failed on {ranks}: {reason}; the run stopped there, its last "
                        "complete checkpoint is intact", key="run.output_dir",
                        hint="free space (or point run.output_dir elsewhere) and run the same command to resume"
                        if code is not None else "run the same command to resume from the last complete checkpoint")
    return RunError(f"loading checkpoint {path} failed on {ranks}: {first_line(cause)}", key="run.name",
                    hint="the checkpoint is damaged or was written by another layout: move that checkpoint folder "
                         "away to resume from the one before it, or start over under a new run.name")


def _free_space(path: str | Path) -> str:
    """`` (N MiB free there)``: a short write inside an engine often hides ENOSPC behind its own message."""
    import shutil

    folder = Path(path)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return f" ({shutil.disk_usage(folder).free / 2**20:,.0f} MiB free there)"
    except OSError:
        return ""


@contextmanager
def checkpoint_errors(action: str, path: str | Path) -> Iterator[None]:
    """Run a checkpoint engine's save or load, turning its ``CheckpointException`` into the error
    :func:`checkpoint_failure` gives (use around ``dcp.save`` / ``dcp.load``)."""
    try:
        yield
    except BaseException as exc:
        converted = checkpoint_failure(exc, action, path)
        if converted is None:
            raise
        raise converted from None
