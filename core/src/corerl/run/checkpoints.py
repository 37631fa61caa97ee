"""Run checkpoints in ``<run dir>/checkpoints/step_NNNNNN``, each a complete folder
(:mod:`corerl.complete_folders`): a save that is killed halfway never looks complete, saving a
step again replaces the old folder in one rename, and pruning renames before it deletes, so
the previous checkpoint stays usable at every moment. Pruning keeps the newest
``checkpointing.keep_last``, or with ``checkpointing.keep_top_k`` the best by the metric each
checkpoint recorded when it was saved (``checkpointing.metric_name``) and the newest besides."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

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


@attrs.frozen(kw_only=True)
class KeepPolicy:
    """Which complete checkpoints a save leaves: the ``keep_last`` newest; or, with ``keep_top_k``,
    the ``keep_top_k`` best by the value of ``metric_name`` each recorded (``state.json``'s
    ``metric``) and the newest besides, which a resumed run starts from."""

    keep_last: int
    keep_top_k: int | None = None
    metric_name: str | None = None
    higher_is_better: bool = True

    @classmethod
    def from_config(cls, checkpointing: Any) -> KeepPolicy:
        """The ``checkpointing`` section's policy."""
        return cls(keep_last=checkpointing.keep_last, keep_top_k=checkpointing.keep_top_k,
                   metric_name=checkpointing.metric_name, higher_is_better=checkpointing.higher_is_better)

    def value_of(self, state: dict[str, Any]) -> float | None:
        """The ranking value a checkpoint's state records (None: none, or another metric's)."""
        recorded = state.get("metric") or {}
        value = recorded.get("value")
        if recorded.get("name") != self.metric_name or not isinstance(value, (int, float)) or math.isnan(value):
            return None
        return float(value)


def checkpoints_to_keep(found: list[tuple[int, float | None]], policy: KeepPolicy) -> set[int]:
    """The steps of ``found`` (each checkpoint's step and metric value, None where it has none)
    that ``policy`` keeps. Ranked by the metric, a checkpoint without a value is the worst, and of
    two equal values the newer is the better."""
    steps = sorted(step for step, _ in found)
    if policy.keep_top_k is None:
        return set(steps[-policy.keep_last:])
    sign = 1.0 if policy.higher_is_better else -1.0
    ranked = sorted(found, key=lambda item: (item[1] is None, -sign * (item[1] or 0.0), -item[0]))
    return {step for step, _ in ranked[:policy.keep_top_k]} | set(steps[-1:])


def save_checkpoint(run_dir: Path, step: int, write: Callable[[Path], None], state: dict[str, Any],
                    keep: int | KeepPolicy) -> Path:
    """``write(folder)`` fills the new checkpoint, ``state.json`` is added, the folder is published;
    then the complete checkpoints ``keep`` does not keep are removed (an int: the newest that many)."""

    def fill(folder: Path) -> None:
        write(folder)
        (folder / "state.json").write_text(json.dumps(state))

    policy = keep if isinstance(keep, KeepPolicy) else KeepPolicy(keep_last=keep)
    final = _root(run_dir) / f"step_{step:06d}"
    write_complete(final, fill)
    found = complete_checkpoints(run_dir)
    values = {s: policy.value_of(read_state(path)) for s, path in found} if policy.keep_top_k is not None else {}
    kept = checkpoints_to_keep([(s, values.get(s)) for s, _ in found], policy)
    for s, old in found:
        if s not in kept:
            remove(old)
    return final


def best_checkpoint(run_dir: Path, policy: KeepPolicy) -> tuple[Path, float] | None:
    """The complete checkpoint with the best value of ``policy.metric_name`` (the newer of equals),
    and that value; None when none records one."""
    if policy.metric_name is None:
        return None
    scored = [(step, path, value) for step, path in complete_checkpoints(run_dir)
              if (value := policy.value_of(read_state(path))) is not None]
    if not scored:
        return None
    sign = 1.0 if policy.higher_is_better else -1.0
    _, path, value = max(scored, key=lambda item: (sign * item[2], item[0]))
    return path, value


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
