"""Built-in reward functions and reward import paths (``pkg.module:fn``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from corerl.config.reward_paths import IMPORT_PATH, import_reward

__all__ = ["IMPORT_PATH", "answer_candidates", "exact_answer", "import_reward", "normalise_answer"]

_SPACES = re.compile(r"\s+")


def normalise_answer(text: str) -> str:
    """Lower case, single spaces, no surrounding spaces or final full stop."""
    return _SPACES.sub(" ", text).strip().rstrip(".").strip().lower()


def answer_candidates(completion: str) -> list[str]:
    """Where an answer may sit in a completion: all of it, after the last ``####``, or its last line."""
    candidates = [completion]
    if "####" in completion:
        candidates.append(completion.rsplit("####", 1)[1])
    lines = [line for line in completion.splitlines() if line.strip()]
    if lines:
        candidates.append(lines[-1])
    return candidates


def exact_answer(completion: str, example: Mapping[str, Any]) -> float:
    """1.0 when the completion (all of it, the text after its last ``####``, or its last line)
    equals ``example["answer"]`` up to case, spacing and a final full stop; else 0.0."""
    expected = normalise_answer(str(example["answer"]))
    return 1.0 if any(normalise_answer(c) == expected for c in answer_candidates(completion)) else 0.0
