"""Presets: recipe fragments for the common training strategies.

Each is a YAML file in this package. A recipe names one in ``defaults:`` as ``preset:NAME``;
``corerl run --preset NAME`` (and ``validate``) lays one over a recipe, under the command
line's ``KEY=VALUE`` overrides; from Python, :func:`get` returns one as a dict.

    >>> import corerl.presets
    >>> corerl.presets.get("zero3")["policy"]["deepspeed_cfg"]["zero_stage"]
    3
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

FOLDER = Path(__file__).parent
PREFIX = "preset:"


def names() -> list[str]:
    """The presets there are."""
    return sorted(path.stem for path in FOLDER.glob("*.yaml"))


def path_of(name: str, key: str = "preset", source: str | None = None) -> Path:
    """The file of preset ``name``; for an unknown one, a one-line error at ``key`` (and
    ``source``, the file that names it) that lists the presets."""
    from corerl.errors import ConfigError

    path = FOLDER / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"no preset named {name!r}", key=key, source=source, hint=f"presets: {', '.join(names())}")
    return path


def get(name: str) -> dict[str, Any]:
    """Preset ``name`` as a recipe fragment (a fresh dict each call)."""
    import yaml

    return copy.deepcopy(yaml.safe_load(path_of(name).read_text(encoding="utf-8")))


def get_default_fsdp_preset() -> dict[str, Any]:
    """The default strategy: FSDP2 full sharding on the dtensor backend."""
    return get("fsdp")
