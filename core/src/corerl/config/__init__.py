"""Configuration: recipes, overrides, the core schema and plugin-owned sections.

:func:`load_config` is the entry point for files (:func:`config_from_mapping` for Python
dicts): it reads a recipe with its ``defaults:``,
applies ``key=value`` overrides, structures the core sections strictly and hands each
plugin-owned section (``policy.megatron_cfg``, ...) to the owning plugin's schema.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from corerl.config.async_section import SECTION as ASYNC_SECTION
from corerl.config.async_section import AsyncSettings
from corerl.config.dialects import KeyFate, detect, detect_target
from corerl.config.interpolation import resolve_references
from corerl.config.overrides import apply_overrides, parse_override
from corerl.config.recipes import load_recipe, normalise_aliases
from corerl.config.schema import CorerlConfig
from corerl.config.section_paths import critic_section
from corerl.config.structure import StructureContext, structure
from corerl.config.tree import Origins, deep_merge, drop_at, origin_of, record_origins
from corerl.errors import ConfigError, ConfigErrors
from corerl.known_plugins import FIRST_PARTY
from corerl.registry import TrainingBackend

if TYPE_CHECKING:
    from corerl.plugin_manager import PluginHost

__all__ = ["Config", "CorerlConfig", "config_from_mapping", "load_config", "owned_sections"]


@attrs.define
class Config:
    """A validated recipe: the core sections plus every plugin-owned section by key path."""

    core: CorerlConfig
    sections: dict[str, Any]
    raw: dict[str, Any]
    origins: Origins
    source: str
    #: registrations selection resolved for the backends to use (``sequence_packer``, ``offload_policy``)
    components: dict[str, Any] = attrs.field(factory=dict, eq=False)
    #: the recipe's dialect, and what it did with each key (empty for corerl's own recipes)
    dialect: str = "corerl"
    fates: list[KeyFate] = attrs.field(factory=list, eq=False)
    #: what the dialect accepted but wants the user to know at every run (a logger corerl lacks)
    warnings: list[str] = attrs.field(factory=list, eq=False)
    #: which model a training backend built from this config trains: ``policy`` (a causal LM:
    #: logprobs) or ``critic`` (PPO's value model: values; :func:`corerl.config.critic.critic_config`)
    role: str = "policy"
    #: which placement pool a training backend built from this config reserves on a Ray cluster:
    #: the run's colocated pool, or a frozen model's own (:mod:`corerl.config.own_layout`)
    pool: str = "colocated"

    def section(self, path: str) -> Any | None:
        """The plugin-owned section at ``path`` (a schema instance, or a mapping when its plugin is absent)."""
        return self.sections.get(path)

    def section_enabled(self, path: str) -> bool:
        """Whether the section at ``path`` says ``enabled: true``."""
        value = self.sections.get(path)
        enabled = value.get("enabled") if isinstance(value, Mapping) else getattr(value, "enabled", False)
        return enabled is True


def owned_sections(host: PluginHost) -> dict[str, type | None]:
    """Key path -> schema of every plugin-owned section (None: owner known but not installed)."""
    owned: dict[str, type | None] = {ASYNC_SECTION: AsyncSettings}  # the core's own, a keyword as its name
    for item in host.registrations():
        if item.config_section and owned.get(item.config_section) is None:
            owned[item.config_section] = item.config_schema
            if isinstance(item, TrainingBackend):  # the critic may have its own layout of the same backend
                owned[critic_section(item.config_section)] = item.config_schema
    for plugin in FIRST_PARTY:
        for path in plugin.sections:
            owned.setdefault(path, None)
            if plugin.training_backends:
                owned.setdefault(critic_section(path), None)
    for path in unloaded_plugin_sections(host):
        owned.setdefault(path, None)
    return owned


def unloaded_plugin_sections(host: PluginHost) -> dict[str, str]:
    """``policy.<name>_cfg`` (the documented section name) of each installed plugin that failed to
    load or is disabled, by plugin name: kept as a mapping, so that a recipe naming it is told
    which plugin is missing rather than "unknown key" (see :func:`corerl.config.selection.select`)."""
    return {f"policy.{info.name}_cfg": info.name for info in host.plugins.values() if info.status != "loaded"}


def load_config(path: str | Path, overrides: Iterable[str], host: PluginHost, presets: Iterable[str] = (),
                dialect: str | None = None, strict: bool = False, environ: Mapping[str, str] | None = None) -> Config:
    """Load a recipe, lay ``presets`` over it (:mod:`corerl.config.presets`), apply the overrides, resolve
    ``${...}`` references, translate a recipe in another framework's ``dialect`` (None: recognised
    from its shape; :mod:`corerl.config.dialects`), and validate; every problem found is raised
    together. In another framework's dialect a key nothing maps is left out with a warning, or with
    ``strict`` refused. A SkyRL launch script (``.sh``, or ``dialect="skyrl"``) is read with
    ``environ`` (default: this process's environment) as its environment, the overrides as its ``$@``."""
    if dialect == "skyrl" or (dialect is None and detect_target(str(path)) == "skyrl"):
        return _load_skyrl(str(path), list(overrides), host, list(presets), strict, environ)
    raw, origins = load_recipe(path, host)
    from corerl.config import presets as bundled

    for name in presets:
        preset_data, preset_origins = load_recipe(bundled.path_of(name, key="--preset", host=host), host)
        raw = deep_merge(raw, preset_data)
        origins.update(preset_origins)
    apply_overrides(raw, [parse_override(text, host) for text in overrides], origins)
    raw = resolve_references(raw, origins)
    dialect = dialect or detect(raw)
    if dialect == "nemo-rl":
        from corerl.config.dialects import nemo_rl

        translation = nemo_rl.translate(raw, origins, strict, host=host)
        config = _validate_translation(translation, host, str(Path(path)), strict)
        return attrs.evolve(config, dialect=dialect)
    try:
        return validate_tree(raw, origins, host, str(Path(path)))
    except ConfigErrors as exc:
        raise _with_dialect_hint(exc) from None


def _load_skyrl(target: str, overrides: list[str], host: PluginHost, presets: list[str], strict: bool,
                environ: Mapping[str, str] | None) -> Config:
    """A SkyRL launch script (or an entry point's module given by hand, with its overrides) read
    (:mod:`corerl.config.dialects.skyrl.script`), translated and validated; what the script runs
    besides its training command is among the warnings."""
    from corerl.config.dialects.skyrl import script
    from corerl.config.dialects.skyrl.translate import translate
    from corerl.errors import UsageError

    if presets:
        raise UsageError("--preset lays a preset over a corerl recipe, not over a SkyRL launch script",
                         hint="give SkyRL's key=value overrides after the script instead")
    by_hand = not target.endswith(".sh") and not Path(target).is_file()
    launch = script.by_hand(target, overrides) if by_hand else script.read(target, overrides, environ)
    raw, origins = launch.tree()
    translation = translate(raw, origins, strict, host=host, entry_point=launch.entry_point.id)
    config = _validate_translation(translation, host, launch.source, strict, label="SkyRL")
    return attrs.evolve(config, dialect="skyrl", warnings=[*launch.warnings, *config.warnings])


def _validate_translation(translation: Any, host: PluginHost, source: str, strict: bool,
                          label: str = "NeMo RL") -> Config:
    """Validate a translated tree. A key passed through under its own name that corerl does not
    know either is left out as ``unknown`` (refused with ``strict``, as validation says)."""
    from corerl.config.dialects import nemo_rl

    tree, fates = translation.tree, list(translation.fates)
    try:
        config = validate_tree(tree, translation.origins, host, source)
    except ConfigErrors as exc:
        unknown = [e.key for e in exc.errors if isinstance(e, ConfigError) and e.message == "unknown key"
                   and e.key is not None and _passed_through(e.key, translation.passthrough)]
        if strict or not unknown:
            raise
        for key in unknown:  # a key, or a whole section corerl lacks (each of its keys is reported)
            drop_at(tree, key)
            fates += [KeyFate(leaf, "unknown", origin_of(leaf, translation.origins) or "override")
                      for leaf in sorted(translation.passthrough) if leaf == key or leaf.startswith(key + ".")]
        config = validate_tree(tree, translation.origins, host, source)  # any other problem is raised here
    block = nemo_rl.unknown_warning(fates, dialect=label)
    return attrs.evolve(config, fates=fates, warnings=[*config.warnings, *translation.warnings, *([block] if block else [])])


def _passed_through(key: str, passthrough: frozenset[str]) -> bool:
    """Whether ``key`` is a passed-through key, or a section holding only passed-through keys."""
    return key in passthrough or any(leaf.startswith(key + ".") for leaf in passthrough)


def _with_dialect_hint(exc: ConfigErrors) -> ConfigErrors:
    """An unknown key that NeMo RL's dialect knows gets a hint to use it."""
    from corerl.config.dialects import nemo_rl

    for error in exc.errors:
        if error.message == "unknown key" and error.key and nemo_rl.rule_for(error.key) is not None:
            error.hint = f"{error.key} is a NeMo RL key: run the recipe with --dialect nemo-rl (or write corerl's key)"
    return ConfigErrors(exc.errors)


def config_from_mapping(data: Mapping[str, Any], host: PluginHost, source: str = "<python dict>") -> Config:
    """Validate a recipe given as nested Python mappings (the Python API's ``config_dict``)."""
    if not isinstance(data, Mapping):
        raise ConfigErrors([ConfigError(f"expected a mapping of recipe sections, got {type(data).__name__}",
                                        source=source, hint="pass e.g. {'policy': {'model_name': ...}}")])
    raw = deep_merge({}, data)
    if "defaults" in raw:
        raise ConfigErrors([ConfigError("defaults: is for recipe files", key="defaults", source=source,
                                        hint="merge the dicts in Python, or load the file with the trainer's from_recipe")])
    normalise_aliases(raw, source, host)
    origins: Origins = {}
    record_origins(raw, source, origins)
    return validate_tree(raw, origins, host, source)


def validate_tree(raw: dict[str, Any], origins: Origins, host: PluginHost, source: str) -> Config:
    """Structure the core sections strictly and each plugin-owned section by its plugin's schema."""
    return validate_with_sections(raw, origins, owned_sections(host), source)


def validate_with_sections(raw: dict[str, Any], origins: Origins, owned: Mapping[str, type | None],
                           source: str) -> Config:
    """:func:`validate_tree` with the plugin-owned sections given (key path -> schema). Relative
    paths a recipe file gives are first made absolute where they are found
    (:mod:`corerl.config.paths`)."""
    from corerl.config.paths import path_keys, resolve_recipe_paths

    path_warnings = resolve_recipe_paths(raw, origins, path_keys(owned))
    ctx = StructureContext(origins, owned, default_source=source)
    core = structure(CorerlConfig, raw, "", ctx)
    if core is not None:
        for key, message in core.check():
            ctx.error(key, message)
        for section_path, value in ctx.sections.items():
            check = getattr(value, "check", None)
            for key, message in (check(core) if callable(check) else ()):
                ctx.error(f"{section_path}.{key}" if key else section_path, message)
    if ctx.errors:
        raise ConfigErrors(ctx.errors)
    assert core is not None
    sections = dict(ctx.sections)
    for section_path, schema in owned.items():
        if section_path not in sections and schema is not None:
            sections[section_path] = schema()
    return Config(core, sections, raw, origins, source, warnings=path_warnings)
