"""Presets: recipe fragments for the common training strategies, registered by the plugins
whose sections they set (``corerl_register_presets``: dtensor's ``fsdp``, megatron's
``megatron_tp``, deepspeed's ``zero2``/``zero3``/``zero3_offload``).

A recipe names one in ``defaults:`` as ``preset:NAME``; ``corerl run --preset NAME`` (and
``validate``) lays one over a recipe, under the command line's ``KEY=VALUE`` overrides; from
Python, :func:`get` returns one as a dict.

    >>> import corerl.config.presets
    >>> corerl.config.presets.get("zero3")["policy"]["deepspeed_cfg"]["zero_stage"]
    3
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

PREFIX = "preset:"


def default_host() -> Any:
    """The plugin host of this process (:func:`corerl.plugin_manager.process_host`)."""
    from corerl.plugin_manager import process_host

    return process_host()


def names(host: Any = None) -> list[str]:
    """The presets the installed plugins register."""
    return sorted((host or default_host()).presets.ids())


def path_of(name: str, key: str = "preset", source: str | None = None, host: Any = None) -> Path:
    """The file of preset ``name``; for an unknown one, a one-line error at ``key`` (and
    ``source``, the file that names it) that lists the presets."""
    from corerl.errors import ConfigError

    host = host or default_host()
    preset = host.presets.get(name)
    if preset is None:
        known = ", ".join(names(host)) or "none (install a training-backend plugin: they register presets)"
        raise ConfigError(f"no preset named {name!r}", key=key, source=source, hint=f"presets: {known}")
    return Path(preset.path())


def get(name: str, host: Any = None) -> dict[str, Any]:
    """Preset ``name`` as a recipe fragment (a fresh dict each call)."""
    import yaml

    return copy.deepcopy(yaml.safe_load(path_of(name, host=host).read_text(encoding="utf-8")))


def get_default_fsdp_preset() -> dict[str, Any]:
    """The default strategy: FSDP2 full sharding on the dtensor backend (the dtensor plugin's)."""
    return get("fsdp")
