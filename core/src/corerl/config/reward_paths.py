"""A recipe's reward as an import path (``data.reward: pkg.module:fn``): how selection tells one from
a registered id, and imports it (so a typo fails validation). :mod:`corerl.tasks.rewards`
re-exports both beside the built-in rewards."""

from __future__ import annotations

import re
from typing import Any

from corerl.import_paths import import_function

#: ``pkg.module:fn``: a reward (or an agent) named by import path rather than by a registered id
IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def import_reward(path: str) -> Any:
    """The function at import path ``pkg.module:fn`` (``data.reward``)."""
    return import_function(path, "data.reward", "reward",
                           hint="point data.reward at a function fn(completion: str, example: dict) -> float",
                           import_hint="put the module on PYTHONPATH (or install its package), or name a registered "
                                       "reward")
