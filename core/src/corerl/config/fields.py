"""Declaring schema fields: defaults, bounds and help text in one call.

Core and plugin schemas are attrs classes whose fields are made with :func:`setting`
(or :func:`section` for a nested section); :mod:`corerl.config.structure` reads them.
"""

from __future__ import annotations

from typing import Any

import attrs

_NO_DEFAULT = attrs.NOTHING

#: what the reference says of a path setting
PATH_NOTE = "relative in a recipe file: beside that file, else in the working directory"


def setting(
    default: Any = _NO_DEFAULT,
    *,
    min: float | None = None,
    max: float | None = None,
    min_exclusive: bool = False,
    help: str = "",
    path: bool = False,
    model: bool = False,
) -> Any:
    """A scalar setting. ``min``/``max`` bound numbers (``min_exclusive`` makes ``min`` strict).
    ``path``: a local file or folder the run reads (or a list of them): a relative one written in a
    recipe file is looked up beside that file first (:mod:`corerl.config.paths`). ``model``: a
    model the run loads (a path setting too), which ``corerl validate`` and the run's start check
    is a checkpoint folder with weights or a ``builtin:`` model (:mod:`corerl.run.inputs`), in the
    section of a selected algorithm.

    Mutable defaults (dicts, lists) are copied per instance.
    """
    path = path or model
    if path:
        help = f"{help} ({PATH_NOTE})" if help else PATH_NOTE
    metadata = {"min": min, "max": max, "min_exclusive": min_exclusive, "help": help, "path": path, "model": model}
    if isinstance(default, (dict, list)):
        return attrs.field(factory=lambda: type(default)(default), metadata=metadata)
    return attrs.field(default=default, metadata=metadata)


def section(cls: type, *, help: str = "") -> Any:
    """A nested section whose defaults come from ``cls``."""
    return attrs.field(factory=cls, metadata={"help": help})
