"""Run checkpoints in ``<run dir>/checkpoints/step_NNNNNN``, each a complete folder
(:mod:`corerl.complete_folders`): a save that is killed halfway never looks complete, saving a
step again replaces the old folder in one rename, and pruning renames before it deletes, so
the previous checkpoint stays usable at every moment."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corerl.complete_folders import is_complete, recover, remove, write_complete

_STEP = re.compile(r"^step_(\d+)$")
_LEFTOVER = re.compile(r"^\.(step_\d+)\.")


def _root(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def recover_checkpoints(run_dir: Path) -> None:
    """Put back or delete what a killed save or prune left in the checkpoints folder."""
    root = _root(run_dir)
    names = {p.name for p in root.iterdir() if _STEP.match(p.name)} if root.is_dir() else set()
    names |= {m.group(1) for p in (root.iterdir() if root.is_dir() else []) if (m := _LEFTOVER.match(p.name))}
    for name in sorted(names):
        recover(root / name)


def complete_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints of ``run_dir``, oldest first."""
    root = _root(run_dir)
    found = []
    for path in root.iterdir() if root.is_dir() else []:
        match = _STEP.match(path.name)
        if match and is_complete(path):
            found.append((int(match.group(1)), path))
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    """The newest complete checkpoint (after :func:`recover_checkpoints`), or None."""
    recover_checkpoints(run_dir)
    found = complete_checkpoints(run_dir)
    return found[-1] if found else None


def save_checkpoint(run_dir: Path, step: int, write: Callable[[Path], None], state: dict[str, Any], keep_last: int) -> Path:
    """``write(folder)`` fills the new checkpoint, ``state.json`` is added, the folder is published;
    then all but the ``keep_last`` newest complete checkpoints are removed."""

    def fill(folder: Path) -> None:
        write(folder)
        (folder / "state.json").write_text(json.dumps(state))

    final = _root(run_dir) / f"step_{step:06d}"
    write_complete(final, fill)
    for _, old in complete_checkpoints(run_dir)[:-keep_last]:
        remove(old)
    return final


def read_state(checkpoint: Path) -> dict[str, Any]:
    """The run state (steps done, task position, metrics lines, evaluations) a checkpoint holds."""
    return json.loads((checkpoint / "state.json").read_text())


def duration_seconds(text: str) -> float:
    """``DD:HH:MM:SS`` or ``HH:MM:SS`` (``checkpointing.save_by``; NeMo RL's
    ``checkpoint_must_save_by``) in seconds."""
    parts = [float(p) for p in str(text).split(":")]
    days, hours, minutes, seconds = ([0.0] * (4 - len(parts)) + parts)[-4:]
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


class TimeBudget:
    """``checkpointing.save_by`` from the moment it is made: :meth:`check` says (and remembers in
    ``spent``) whether it has run out; with no budget it never does."""

    def __init__(self, text: str | None) -> None:
        self.deadline = None if text is None else time.monotonic() + duration_seconds(text)
        self.spent = False

    def check(self) -> bool:
        self.spent = self.spent or (self.deadline is not None and time.monotonic() >= self.deadline)
        return self.spent
