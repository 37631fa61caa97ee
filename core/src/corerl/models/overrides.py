"""``policy.hf_config_overrides``: keys laid over a checkpoint's ``config.json`` for every engine.

The run writes one folder whose ``config.json`` is the checkpoint's with the overrides applied
and whose other files link to the checkpoint's, then every backend (training, generation,
reference, critic, the Megatron converter) loads that folder as it would the checkpoint. One
place, so no engine can load the model without them; the weights are never copied.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from corerl.complete_folders import is_complete, write_complete
from corerl.errors import ConfigError


def with_config_overrides(model_path: str, overrides: dict[str, Any], target: Path) -> str:
    """The folder (``target``, written once per run) that holds ``model_path`` with ``overrides``
    laid over its ``config.json``; nested mappings merge key by key."""
    source = Path(model_path)
    config_file = source / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"{model_path} has no config.json to override", key="policy.hf_config_overrides",
                          hint="give policy.model_name a Hugging Face checkpoint folder, or remove the overrides")
    merged = _merged(json.loads(config_file.read_text()), overrides)
    if is_complete(target) and json.loads((target / "config.json").read_text()) == merged:
        return str(target)

    def fill(work: Path) -> None:
        for entry in source.iterdir():
            if entry.name != "config.json":
                os.symlink(entry.resolve(), work / entry.name)
        (work / "config.json").write_text(json.dumps(merged, indent=2, sort_keys=True))

    write_complete(target, fill)
    return str(target)


def _merged(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out
