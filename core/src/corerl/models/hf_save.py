"""``save_pretrained`` for a transformers model, without importing DeepSpeed to do it.

transformers' ``save_pretrained`` unwraps the model through accelerate's
``extract_model_from_parallel``, which imports DeepSpeed wherever it is installed, only to test
``isinstance(model, DeepSpeedEngine)``: 1.5-2 s of CPU in every process that writes a checkpoint
(a run's driver building the demo model, a rank exporting the final one). No object can be a
``DeepSpeedEngine`` while DeepSpeed is not imported, so :func:`save_pretrained` first makes
accelerate's check also ask whether it is (:func:`_deepspeed_lookup_only_when_imported`): the
answer is the same for every model, and a process that runs DeepSpeed still unwraps its engines.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def _deepspeed_lookup_only_when_imported() -> None:
    """Make accelerate's unwrapping test ``DeepSpeedEngine`` only once DeepSpeed is imported
    (idempotent; the check it replaces is used by ``extract_model_from_parallel`` alone)."""
    from accelerate.utils import other

    check = other.is_deepspeed_available
    if getattr(check, "corerl_imported_only", False):
        return

    def deepspeed_imported_and_available() -> bool:
        return "deepspeed" in sys.modules and check()

    deepspeed_imported_and_available.corerl_imported_only = True  # type: ignore[attr-defined]
    other.is_deepspeed_available = deepspeed_imported_and_available


def save_pretrained(model: Any, target: str | Path, **kwargs: Any) -> None:
    """``model.save_pretrained(target, **kwargs)`` (a transformers or PEFT model), DeepSpeed left
    unimported where nothing has imported it."""
    try:
        _deepspeed_lookup_only_when_imported()
    except ImportError:  # no accelerate: transformers unwraps by itself, without DeepSpeed
        pass
    model.save_pretrained(target, **kwargs)
