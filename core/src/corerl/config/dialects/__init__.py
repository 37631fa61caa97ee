"""Recipe dialects: other frameworks' recipes translated into corerl's configuration.

A dialect is recognised from the recipe's shape (or named with ``--dialect``) and turns the
merged, resolved tree into a corerl tree plus an explanation of what became of every key
(:class:`KeyFate`). corerl's own recipes use no dialect and are validated strictly as they are.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

DIALECTS = ("corerl", "nemo-rl")


@attrs.frozen
class KeyFate:
    """What a dialect did with one key: ``acts`` (mapped to ``detail``, a corerl key),
    ``inert`` (accepted, no effect; ``detail`` says why) or ``unknown`` (neither the dialect's table
    nor corerl knows it: left out with a warning, refused with ``--strict``; ``detail`` is its file)."""

    key: str
    fate: Literal["acts", "inert", "unknown"]
    detail: str


def detect(raw: dict[str, Any]) -> str:
    """``nemo-rl`` for a tree with NeMo RL's algorithm sections or its ``loss_fn``/``logger``/``env``
    sections, else ``corerl``."""
    from corerl.config.dialects import nemo_rl

    return "nemo-rl" if nemo_rl.looks_like(raw) else "corerl"
