"""A validated recipe of a megatron policy for the megatron plugin's tests: float32, hf generation,
seed 7, on ``model``, with ``overrides``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corerl.testing import host_with, select_for, write_recipe


def megatron_config(model: str, folder: Path, overrides: list[str]) -> Any:
    """The validated config of that recipe, written in ``folder``, with ``overrides``."""
    recipe = write_recipe(folder / "r.yaml", {
        "policy": {"model_name": model, "precision": "float32", "megatron_cfg": {"enabled": True},
                   "generation": {"backend": "hf"}},
        "algorithm": {"seed": 7}})
    config, _ = select_for(host_with(None, "installed"), recipe, overrides)
    return config
