"""corerl's model cache: checkpoints corerl makes once from another form (a GGUF file, a quantised
checkpoint) as plain Hugging Face folders, each made under a lock so that ranks and runs share it,
and made again where a killed run left it half-written.

The cache is ``$CORERL_MODEL_CACHE``, else ``~/.cache/corerl/models``.
"""

from __future__ import annotations

import fcntl
import os
import sys
from collections.abc import Callable
from pathlib import Path


def cache_root() -> Path:
    """Where converted models are kept."""
    return Path(os.environ.get("CORERL_MODEL_CACHE") or Path.home() / ".cache" / "corerl" / "models")


def convert_once(target: Path, what: str, convert: Callable[[Path], None]) -> Path:
    """``target``, made by ``convert(work_folder)`` unless a complete one is there; ``what`` names
    the conversion in the one line said when it starts."""
    from corerl.complete_folders import is_complete, recover, write_complete

    if is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:  # one converter at a time (ranks, runs)
        fcntl.flock(lock, fcntl.LOCK_EX)
        recover(target)  # a half-written conversion (a killed run) is made again
        if not is_complete(target):
            print(f"corerl: converting {what} into a Hugging Face folder at {target} (once)", file=sys.stderr)
            write_complete(target, convert)
    return target
