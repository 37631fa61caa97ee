"""Recipe dialects: other frameworks' recipes translated into corerl's configuration.

A dialect is recognised from the recipe's shape (a SkyRL launch script from its name: ``.sh``; or
named with ``--dialect``) and turns the
merged, resolved tree into a corerl tree plus an explanation of what became of every key
(:class:`KeyFate`). corerl's own recipes use no dialect and are validated strictly as they are.
"""

from __future__ import annotations

from typing import Any

from corerl.config.dialects.key_fate import KeyFate

__all__ = ["DIALECTS", "KeyFate", "detect", "detect_target"]

DIALECTS = ("corerl", "nemo-rl", "skyrl")


def detect(raw: dict[str, Any]) -> str:
    """``nemo-rl`` for a tree with NeMo RL's algorithm sections or its ``loss_fn``/``logger``/``env``
    sections, else ``corerl``."""
    from corerl.config.dialects import nemo_rl  # on use: `corerl --help` does not load the dialect

    return "nemo-rl" if nemo_rl.looks_like(raw) else "corerl"


def detect_target(target: str) -> str | None:
    """``skyrl`` for what ``corerl run`` is given that is SkyRL's rather than a recipe file: a
    launch script (``run_gsm8k.sh``), or the module of one of SkyRL's entry points given by hand
    (``skyrl.train.entrypoints.main_base``, not a file); else None (the recipe's shape decides)."""
    from corerl.config.dialects.skyrl.script import is_launch_target

    return "skyrl" if is_launch_target(target) else None
