"""Run checkpoints: written to a temporary folder and renamed into place, so a save that is
killed halfway never looks complete and the previous checkpoint stays usable."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_COMPLETE = re.compile(r"^step_(\d+)$")
SLOW_SAVE_ENV = "CORERL_TEST_CHECKPOINT_DELAY"  # seconds a save pauses before it completes


def complete_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints of ``run_dir``, oldest first."""
    root = run_dir / "checkpoints"
    found = []
    for path in root.iterdir() if root.is_dir() else []:
        match = _COMPLETE.match(path.name)
        if match and (path / "state.json").is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    found = complete_checkpoints(run_dir)
    return found[-1] if found else None


def save_checkpoint(run_dir: Path, step: int, write: Callable[[Path], None], state: dict[str, Any], keep_last: int) -> Path:
    """``write(folder)`` fills a temporary folder, ``state.json`` goes last, then one rename publishes it."""
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".step_{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    write(tmp)
    if os.environ.get(SLOW_SAVE_ENV):  # fault injection for tests: a window to kill a save in
        time.sleep(float(os.environ[SLOW_SAVE_ENV]))
    with (tmp / "state.json").open("w") as handle:
        json.dump(state, handle)
        handle.flush()
        os.fsync(handle.fileno())
    final = root / f"step_{step:06d}"
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for _, old in complete_checkpoints(run_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def read_state(checkpoint: Path) -> dict[str, Any]:
    return json.loads((checkpoint / "state.json").read_text())
