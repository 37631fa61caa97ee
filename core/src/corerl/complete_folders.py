"""Folders that are either complete or absent: written aside, sealed with a manifest, then renamed.

Everything a run writes and later trusts (the built-in base model, ``sft_model``, ``final``,
checkpoints, Megatron conversions) goes through :func:`write_complete`:

1. ``fill(work)`` writes into a hidden sibling ``.<name>.partial-<pid>``;
2. a manifest (every file and its size) is written last, into the same folder, and synced;
3. an existing folder at the name is moved aside with one rename (``.<name>.old-<pid>``), the
   new one is renamed into place, and only then is the old one deleted.

A reader asks :func:`is_complete`: the manifest is there and every file it lists has its size.
So a kill at any moment leaves at the published name either the old complete folder, the new
complete folder, or nothing; never a half-deleted or half-written folder that looks complete.
:func:`recover` puts back what a kill between the two renames left aside.

Removing a folder (checkpoint pruning) renames it to ``.<name>.deleting-<pid>`` first, for the
same reason. A single file replaced whole (``metrics.jsonl`` cut back on resume, ``recipe.yaml``,
``summary.json``) goes through :func:`write_file_whole`: written to ``.<name>.partial``, synced,
renamed over the old one.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from corerl.progress_markers import mark

MANIFEST = ".corerl-complete.json"
_PARTIAL, _OLD, _DELETING = "partial", "old", "deleting"
T = TypeVar("T")


def write_file_whole(target: Path, text: str, marker: str | None = None) -> None:
    """Replace ``target`` with ``text`` in one rename (a kill leaves the old file or the new one,
    never a torn one): written to ``.<name>.partial`` beside it and synced first; ``marker`` is
    the progress marker between the two (for the kill harness)."""
    written = target.parent / f".{target.name}.partial"
    with written.open("w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    if marker is not None:
        mark(marker)
    os.replace(written, target)


def _sibling(target: Path, kind: str) -> Path:
    return target.parent / f".{target.name}.{kind}-{os.getpid()}"


def _siblings(target: Path, kind: str) -> Iterator[Path]:
    return target.parent.glob(f".{target.name}.{kind}-*") if target.parent.is_dir() else iter(())


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != MANIFEST}


def seal(folder: Path, meta: dict[str, Any] | None = None) -> None:
    """Write ``folder``'s manifest (its files and sizes, plus ``meta``), synced to disk."""
    with (folder / MANIFEST).open("w", encoding="utf-8") as handle:
        json.dump({"files": _files(folder), "meta": meta or {}}, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())


def manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest of a complete ``folder``; None when it is missing, partial or damaged."""
    try:
        data = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        files = data["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    for name, size in files.items():
        path = folder / name
        if not path.is_file() or path.stat().st_size != size:
            return None
    return data


def is_complete(folder: Path) -> bool:
    """True when ``folder`` was published by :func:`write_complete` and is intact."""
    return manifest(folder) is not None


def remove(folder: Path) -> None:
    """Delete ``folder``: first renamed out of its name (one step), then deleted."""
    if not folder.exists():
        return
    doomed = _sibling(folder, _DELETING)
    os.replace(folder, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def recover(target: Path) -> None:
    """Undo what a kill left around ``target``: a complete new folder not yet renamed into place
    is published, else a complete old one moved aside is put back; other leftovers are deleted,
    as is an incomplete folder at the name itself."""
    if target.exists() and not is_complete(target):
        remove(target)
    if not target.exists():
        for kind in (_PARTIAL, _OLD):
            ready = [p for p in _siblings(target, kind) if is_complete(p)]
            if ready:
                os.replace(ready[0], target)
                break
    for kind in (_PARTIAL, _OLD, _DELETING):
        for leftover in _siblings(target, kind):
            shutil.rmtree(leftover, ignore_errors=True)


def write_complete(target: Path, fill: Callable[[Path], T], meta: dict[str, Any] | None = None) -> T:
    """Publish the folder ``fill(work)`` writes at ``target`` (see the module docstring);
    returns what ``fill`` returned."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    recover(target)
    work = _sibling(target, _PARTIAL)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    mark(f"folder:{target.name}:begin")
    try:
        result = fill(work)
    except BaseException:  # an error, not a kill: leave nothing half-written behind
        shutil.rmtree(work, ignore_errors=True)
        raise
    mark(f"folder:{target.name}:filled")  # written, not yet sealed: a kill here must not count
    seal(work, meta)
    old = _sibling(target, _OLD)
    if target.exists():
        os.replace(target, old)
        mark(f"folder:{target.name}:aside")  # the old one aside, the new one not yet in place
    os.replace(work, target)
    shutil.rmtree(old, ignore_errors=True)
    return result


def write_once(target: Path, fill: Callable[[Path], Any]) -> Path:
    """The complete folder ``target``, filled by ``fill(work)`` the first time (after
    :func:`recover`: a folder a killed run left half-written is made again); ``target``."""
    target = Path(target)
    recover(target)
    if not is_complete(target):
        write_complete(target, fill)
    return target

