"""The recipe a run started with, kept in its directory (``recipe.yaml``), and the check that a
resume goes on with the same one.

A run writes its resolved recipe (overrides applied, ``${...}`` references resolved, in corerl's
own keys) when it starts. Resuming it re-validates that file and compares every effective
setting, defaults included, with the recipe given now: anything but :data:`RESUMABLE_KEYS`
that differs is refused in one line listing the differences (exit 2), because a checkpoint
continued under other settings (another generation backend, learning rate or dataset) gives a
run that no single recipe describes. The file is a recipe: ``corerl run <run dir>/recipe.yaml``
runs it again.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from corerl.errors import ConfigError, ConfigErrors

if TYPE_CHECKING:
    from corerl.config import Config
    from corerl.plugin_manager import PluginHost

RECIPE_FILE = "recipe.yaml"

#: what a resumed run may change: how far it goes, how often it saves, where and how it logs
RESUMABLE_KEYS = ("algorithm.max_steps", "checkpointing.enabled", "checkpointing.save_period",
                  "checkpointing.keep_last", "checkpointing.merge_lora_on_export", "checkpointing.save_by",
                  "checkpointing.metric_name", "checkpointing.higher_is_better", "checkpointing.keep_top_k",
                  "eval.*", "run.output_dir", "run.name", "run.resume", "run.tensorboard", "cluster.ray_address",
                  "logger.*")


def resumable(key: str) -> bool:
    """Whether a resume may change ``key`` (one of :data:`RESUMABLE_KEYS`, ``*`` ending a section)."""
    return any(key == entry or (entry.endswith(".*") and key.startswith(entry[:-1])) for entry in RESUMABLE_KEYS)

_MISSING = object()


def effective_values(config: Config) -> dict[str, Any]:
    """Every setting of ``config`` (core sections and plugin sections, defaults included) by key path."""
    values: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if attrs.has(type(value)):
            value = attrs.asdict(value, recurse=False)
        if isinstance(value, Mapping):
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), item)
        else:
            values[prefix] = list(value) if isinstance(value, tuple) else value

    walk("", config.core)
    for path, section in sorted(config.sections.items()):
        walk(path, section)
    return values


def record_recipe(run_dir: Path, config: Config) -> None:
    """Write ``config``'s resolved recipe to ``<run dir>/recipe.yaml`` (aside, then renamed in)."""
    import json

    import yaml

    from corerl.complete_folders import write_file_whole

    plain = json.loads(json.dumps(config.raw, default=str))  # a Path given through the Python API, as text
    write_file_whole(run_dir / RECIPE_FILE, "# the recipe this run started with (resolved); a resume must match it "
                     f"except for {', '.join(RESUMABLE_KEYS)}\n" + yaml.safe_dump(plain, sort_keys=False))


def check_same_recipe(run_dir: Path, config: Config, host: PluginHost) -> None:
    """Refuse, in one line listing the differences, a resume whose recipe differs from the one
    recorded in ``run_dir`` in anything but :data:`RESUMABLE_KEYS` (a run from before the record
    is resumed unchecked)."""
    from corerl.config import load_config
    from corerl.models.chat_template import resolve_chat_template

    path = run_dir / RECIPE_FILE
    if not path.exists():
        return
    hint = (f"resume with the recipe it started with (corerl run {path} run.name={run_dir.name}), changing only "
            f"{', '.join(RESUMABLE_KEYS)}; or start a new run under another run.name")
    try:
        recorded = load_config(path, [], host)
    except ConfigErrors as exc:
        raise ConfigError(f"the recipe {run_dir} started with no longer validates ({exc.errors[0].one_line()})",
                          key="run.name", hint=hint) from None
    resolve_chat_template(recorded)  # an unset data.apply_chat_template resolved as selection resolved the run's
    before, now = effective_values(recorded), effective_values(config)
    changed = [key for key in sorted(set(before) | set(now))
               if not resumable(key) and before.get(key, _MISSING) != now.get(key, _MISSING)]
    if changed:
        def shown(value: Any) -> str:
            return "(unset)" if value is _MISSING else repr(value)

        listed = "; ".join(f"{key} {shown(before.get(key, _MISSING))} -> {shown(now.get(key, _MISSING))}"
                           for key in changed)
        raise ConfigError(f"resuming {run_dir} with a recipe that differs from the one it started with: {listed}",
                          key="run.name", hint=hint)
