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


#: torch.save's words for a write that came up short (its C++ writer drops the errno): on a full
#: disk, "[enforce fail at inline_container.cc:...] . unexpected pos 704 vs 598"
_SHORT_WRITE = re.compile(r"unexpected pos \d+ vs \d+|PytorchStreamWriter failed writing")
#: below this much free space where a short write happened, the disk is taken to be full
FULL_BELOW_BYTES = 64 * 2**20


def disk_errno(exc: BaseException, where: str | Path | None = None) -> int | None:
    """The errno of a write that failed for lack of space or permission; None for anything else.
    torch's short write (no errno of its own) is ENOSPC when the file system at ``where`` is
    (nearly) full."""
    if isinstance(exc, OSError):
        return exc.errno if exc.errno in DISK_ERRNOS else None
    found = _OS_ERROR.search(str(exc)) if type(exc).__name__ == "SafetensorError" else None
    if found is not None and int(found.group(1)) in DISK_ERRNOS:
        return int(found.group(1))
    if where is not None and isinstance(exc, RuntimeError) and _SHORT_WRITE.search(str(exc)):
        free = free_bytes(where)
        if free is not None and free < FULL_BELOW_BYTES:
            return errno.ENOSPC
    return None


def disk_error(exc: BaseException, run_dir: Path) -> RunError | None:
    """A write that failed for lack of space or permission, as a one-line error naming the file
    (None for any other exception: a real bug stays one)."""
    code = disk_errno(exc, run_dir)
    if code is None:
        return None
    where = exc.filename if isinstance(exc, OSError) and exc.filename else run_dir
    space = _free_space(where) if code == errno.ENOSPC else ""
    return RunError(f"writing {where} failed: {os.strerror(code)}{space}; the run stopped there, its last complete "
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
    code = disk_errno(cause, path)
    if action == "saving":
        space = _free_space(path) if code in (None, errno.ENOSPC) else ""
        reason = f"{os.strerror(code) if code is not None else first_line(cause)}{space}"
        return RunError(f"saving checkpoint {path} failed on {ranks}: {reason}; the run stopped there, its last "
                        "complete checkpoint is intact", key="run.output_dir",
                        hint="free space (or point run.output_dir elsewhere) and run the same command to resume"
                        if code is not None else "run the same command to resume from the last complete checkpoint")
    return RunError(f"loading checkpoint {path} failed on {ranks}: {first_line(cause)}", key="run.name",
                    hint="the checkpoint is damaged or was written by another layout: move that checkpoint folder "
                         "away to resume from the one before it, or start over under a new run.name")


def free_bytes(path: str | Path) -> int | None:
    """Free space (for this user) on the file system holding ``path`` or its nearest existing parent."""
    import shutil

    folder = Path(path)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def _free_space(path: str | Path) -> str:
    """`` (N MiB free there)``: a short write inside an engine often hides ENOSPC behind its own message."""
    free = free_bytes(path)
    return "" if free is None else f" ({free / 2**20:,.1f} MiB free there)"


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
