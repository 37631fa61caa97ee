"""Recipe dialects: other frameworks' recipes translated into corerl's configuration.

A dialect is recognised from the recipe's shape (or named with ``--dialect``) and turns the
merged, resolved tree into a corerl tree plus an explanation of what became of every key
(:class:`KeyFate`). corerl's own recipes use no dialect and are validated strictly as they are.
"""

from __future__ import annotations

from typing import Any

from corerl.config.dialects.key_fate import KeyFate

__all__ = ["DIALECTS", "KeyFate", "detect"]

DIALECTS = ("corerl", "nemo-rl")


def detect(raw: dict[str, Any]) -> str:
    """``nemo-rl`` for a tree with NeMo RL's algorithm sections or its ``loss_fn``/``logger``/``env``
    sections, else ``corerl``."""
    from corerl.config.dialects import nemo_rl  # on use: `corerl --help` does not load the dialect

    return "nemo-rl" if nemo_rl.looks_like(raw) else "corerl"
