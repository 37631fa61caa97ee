"""NeMo RL's recipe dialect, translated into corerl's configuration.

The whole mapping is a table of rules (:class:`corerl.config.dialects.rules.Rule`): each NeMo RL
key either **acts** (its value goes to a corerl key, converted where the two differ), is **inert**
(accepted with a stated reason: it has no effect in corerl, or only the value NeMo RL uses by
default is accepted), or is **refused** in one line saying what corerl does not support. Keys the
table does not name are taken to mean what the same key means in corerl and go through corerl's
strict validation, so nothing is dropped silently. A section switched off (``enabled: false``) is
inert as a whole.

The core holds the shared sections' rules (:mod:`corerl.config.dialects.nemo_rl_keys`, by
section: :data:`RULES`); an engine's section comes from the plugin that registers the engine
(:class:`corerl.registry.DialectSection`), laid over them per plugin host
(:func:`corerl.config.dialects.nemo_rl_lookup.table`). What several keys decide together is
:mod:`corerl.config.dialects.nemo_rl_derived`. This module translates, and every name of the
dialect stays importable from here; a name that moved to an engine's plugin with its section
(the megatron section's reasons) is found in the installed plugins' section modules.
"""

from __future__ import annotations

import sys
from typing import Any, Literal

import attrs

from corerl.config.dialects import nemo_rl_vision as vision
from corerl.config.dialects.key_fate import KeyFate
from corerl.config.dialects.nemo_rl_datasets import merge_dataset_lists
from corerl.config.dialects.nemo_rl_derived import *  # noqa: F403  (the names it had here)
from corerl.config.dialects.nemo_rl_derived import (  # noqa: F401  (private names, importable from here as before)
    _NO_EVALUATION,
    _always,
    _asynchronous,
    _chat_template,
    _checkpoint_ranking,
    _critic,
    _dedicated_generation,
    _derived,
    _eval_recipe,
    _evaluation,
    _frozen_model,
    _played,
    _policy_target,
    _reward_model_environment,
    _reward_model_policy,
    _scheduler,
    _under,
    _validation_sampling,
    _vision,
)
from corerl.config.dialects.nemo_rl_keys import (  # noqa: F401  (the shared sections' table)
    CRITIC_LAYOUTS,
    FROZEN_INERT,
    OPAQUE_KEYS,
    RULES,
    SWITCHED_SECTIONS,
    UNSUPPORTED_SECTIONS,
)
from corerl.config.dialects.nemo_rl_keys.algorithms import (  # noqa: F401
    _FLEET,
    _aggregation,
    _estimator,
    _step_count,
)
from corerl.config.dialects.nemo_rl_keys.data import _NEMO_GYM, _environment_name  # noqa: F401
from corerl.config.dialects.nemo_rl_keys.policy import _torch_optimizer  # noqa: F401
from corerl.config.dialects.nemo_rl_lookup import *  # noqa: F403
from corerl.config.dialects.nemo_rl_lookup import (  # noqa: F401
    ALGORITHM_SECTIONS,
    EVAL_RECIPE_ALIASES,
    NEMO_ONLY_SECTIONS,
    NEMO_ONLY_SUBSECTIONS,
    SAMPLING_ALGORITHMS,
    SHARED_KEYS,
    _leaves,
    _own_rule,
    _refused_section,
    _rule_name,
    _switched_off,
    aliased,
    critic_rule,
    is_env_workers_key,
    is_eval_recipe,
    looks_like,
    markdown_table,
    nemo_only,
    rule_for,
    table,
)
from corerl.config.dialects.rules import (  # noqa: F401  (the rule helpers, importable from here as before)
    _DEFAULT_ONLY,
    _ENV,
    _OFF,
    _PERF,
    DERIVED,
    Rule,
    _above,
    _not,
    _truthy,
    acts,
    derived,
    inert,
    inert_with_warning,
    refused,
)
from corerl.config.tree import Origins, origin_of, set_at, value_at
from corerl.errors import ConfigError, ConfigErrors
from corerl.plugin_manager import PluginHost

UNKNOWN_KEY = "a NeMo RL key corerl does not know: nothing in corerl maps it"
UNKNOWN_HINT = "remove it (docs/migrating-from-nemo-rl.md lists the keys corerl takes)"


def __getattr__(name: str) -> Any:
    """A name that moved to an engine's plugin with its section, read from the installed
    plugins' section modules (as this module had it before the engine sections moved)."""
    for registration, _ in table().sections:
        factory = registration.factory
        module = sys.modules.get(factory.split(":")[0]) if isinstance(factory, str) else None
        if module is not None and hasattr(module, name) and not name.startswith("__"):
            return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@attrs.frozen
class Translation:
    """A NeMo RL recipe as a corerl tree, with the origins of its keys and each key's fate."""

    tree: dict[str, Any]
    origins: Origins
    fates: list[KeyFate]
    warnings: list[str]
    #: keys passed through under their own name (corerl's strict validation judges them)
    passthrough: frozenset[str] = frozenset()


class SectionRefused(ConfigError):
    """The refusal of every key a refused ``prefix.*`` section holds, in one line; ``keys`` lists them."""

    def __init__(self, message: str, *, key: str, source: str | None, hint: str) -> None:
        super().__init__(message, key=key, source=source, hint=hint)
        self.keys = [key]


@attrs.define
class _Translator:
    """The corerl tree being built, with what happened to each NeMo RL key on the way."""

    origins: Origins  # of the NeMo RL keys
    raw: dict[str, Any] = attrs.field(factory=dict)
    #: whose dialect sections (None: this process's plugin host)
    host: PluginHost | None = None
    tree: dict[str, Any] = attrs.field(factory=dict)
    new_origins: Origins = attrs.field(factory=dict)
    fates: list[KeyFate] = attrs.field(factory=list)
    warnings: list[str] = attrs.field(factory=list)
    errors: list[ConfigError] = attrs.field(factory=list)
    #: section -> its one refusal: a refused section is one line, not one per key
    refused_sections: dict[str, SectionRefused] = attrs.field(factory=dict)

    @property
    def eval_recipe(self) -> bool:
        return is_eval_recipe(self.raw)

    @property
    def vision_language(self) -> bool:
        return vision.marker(self.raw) is not None

    def value(self, path: str) -> Any:
        """The recipe's value at ``path`` (None where it has none)."""
        return value_at(self.raw, path)

    def switched_off(self, path: str) -> str | None:
        """The section switched off (``enabled: false``) that ``path`` lies in, or None."""
        return _switched_off(path, self.raw, self.host)

    def set(self, source: str, target: str, value: Any) -> None:
        """Set corerl's ``target`` on account of ``source``, recording no fate."""
        self.new_origins[target] = origin_of(source, self.origins) or "nemo-rl dialect"
        set_at(self.tree, target, value)

    def put(self, source: str, target: str, value: Any, detail: str | None = None) -> None:
        """Set corerl's ``target`` from NeMo RL's ``source`` key (its fate: acts)."""
        set_at(self.tree, target, value)
        self.new_origins[target] = origin_of(source, self.origins) or "nemo-rl dialect"
        self.fates.append(KeyFate(source, "acts", detail or target))

    def inert(self, source: str, reason: str) -> None:
        self.fates.append(KeyFate(source, "inert", reason))

    def unknown(self, source: str) -> None:
        """A key nothing maps: left out (its fate says so; a warning block lists it)."""
        self.fates.append(KeyFate(source, "unknown", origin_of(source, self.origins) or "override"))

    def refate(self, source: str, fate: Literal["acts", "inert"], detail: str) -> None:
        """Replace what was recorded for ``source`` once other keys have decided its fate."""
        self.fates = [f for f in self.fates if f.key != source] + [KeyFate(source, fate, detail)]

    def make_inert(self, source: str, target: str, value: Any, reason: str) -> None:
        """Undo an acting key whose value has no effect in this recipe: ``target`` gets ``value``."""
        set_at(self.tree, target, value)
        self.refate(source, "inert", reason)

    def refuse(self, path: str, message: str, hint: str) -> None:
        self.errors.append(ConfigError(message, key=path, source=origin_of(path, self.origins), hint=hint))

    def refuse_in_section(self, section: str, path: str, message: str) -> None:
        """Refuse ``path`` for its section's reason: the section's keys share one line (a NeMo Gym
        section holds dozens), keyed by the section once it refuses more than one."""
        error = self.refused_sections.get(section)
        if error is None:
            error = SectionRefused(message, key=path, source=origin_of(path, self.origins), hint="remove the key")
            self.refused_sections[section] = error
            self.errors.append(error)
            return
        error.keys.append(path)
        names = ", ".join(key[len(section) + 1:] for key in error.keys[:3]) + (", ..." if len(error.keys) > 3 else "")
        error.key, error.hint = section, "remove the section"
        error.message = f"{message} ({len(error.keys)} keys under it: {names})"


def _is_inert(path: str, host: PluginHost | None) -> bool:
    """Whether the dialect leaves ``path`` inert whatever its value."""
    rule = rule_for(path, host)
    return rule is not None and rule.fate == "inert" and rule.refuse_if is None


def translate(raw: dict[str, Any], origins: Origins, strict: bool = False,
              host: PluginHost | None = None) -> Translation:
    """Translate a resolved NeMo RL tree; every refused key is reported together (exit 2). A
    NeMo RL key nothing maps is left out with an ``unknown`` fate, or with ``strict`` refused.
    ``host``'s plugins give the engine sections (None: this process's plugin host)."""
    rules = table(host)
    raw, merge_refusals = merge_dataset_lists(raw, lambda path: _is_inert(path, host))
    out = _Translator(origins, raw, host)
    for key, reason, hint in merge_refusals:
        out.refuse(key, reason, hint)
    passthrough: set[str] = set()
    algorithm = next((name for name in ("grpo", "ppo", "dpo", "sft", "distillation", "rm") if name in raw), None)
    if algorithm:
        set_at(out.tree, "algorithm.name", algorithm)
        out.new_origins["algorithm.name"] = origin_of(algorithm, origins) or "nemo-rl dialect"
        if algorithm == "sft":
            set_at(out.tree, "sft.enabled", False)
    inert_here: dict[str, str] = {}  # sections an engine's section makes inert in this recipe
    for _, section in rules.sections:
        inert_here.update(section.before(raw, out) if section.before is not None else {})
    played = _played(raw)
    environments = raw.get("env") if isinstance(raw.get("env"), dict) else {}
    if played is None and is_eval_recipe(raw) and len(environments) == 1:
        played = next(iter(environments))  # NeMo RL's evaluation plays its one environment
        set_at(out.tree, "data.env_name", played)
        out.new_origins["data.env_name"] = origin_of(f"env.{played}", origins) or "nemo-rl dialect"
    for path, value in _leaves(raw, host=host):
        section = _switched_off(path, raw, host)
        if section is not None:
            out.inert(path, f"{section}.enabled is false")
            continue
        made_inert = next((prefix for prefix in inert_here if path.startswith(prefix + ".")), None)
        if made_inert is not None:
            out.inert(path, inert_here[made_inert])
            continue
        if path.endswith(".enabled") and value and path[: -len(".enabled")] in rules.unsupported:
            out.refuse(path, rules.unsupported[path[: -len(".enabled")]], f"set {path}=false")
            continue
        absent = rules.absent_section(path)
        if absent is not None and path != f"{absent}.enabled":  # its plugin is not loaded: validation judges enabled
            off = value_at(raw, f"{absent}.enabled") is False
            out.inert(path, f"{absent}.enabled is false" if off else rules.absent[absent])
            continue
        rule = rule_for(path, host)
        if path.startswith("env.reward_model.") and played != "reward_model":
            out.inert(path, f"env.reward_model is not the environment the recipe plays (data.env_name: {played})")
        elif (vlm_env := vision.vlm_environment_of(path)) is not None and vlm_env != played:
            out.inert(path, f"env.{vlm_env} is not the environment the recipe plays (data.env_name: {played})")
        elif rule is None and is_env_workers_key(path) and (env := path.split(".")[1]) != played:
            out.inert(path, f"env.{env} is not the environment the recipe plays (data.env_name: {played})")
        elif rule is None and is_env_workers_key(path):
            out.put(path, path, value)  # any environment's actors: a key of every env.<id> section
        elif rule is None and nemo_only(aliased(path)):
            if strict:
                out.refuse(path, UNKNOWN_KEY, UNKNOWN_HINT)
            else:
                out.unknown(path)
        elif rule is None:  # the same key in corerl (an evaluation recipe's, under policy): strict validation decides
            out.put(path, aliased(path), value)
            passthrough.add(aliased(path))
        elif rule.fate == "refused" and (refusing := _refused_section(path, host)) is not None:
            out.refuse_in_section(refusing, path, rule.reason)
        elif rule.fate == "refused":
            out.refuse(path, rule.reason, "remove the key")
        elif rule.fate == "inert":
            if rule.refuse_if is not None and rule.refuse_if(value):
                out.refuse(path, f"{value!r} is not supported: {rule.reason}", "remove the key or use NeMo RL's default")
                continue
            out.inert(path, rule.reason)
            if rule.warn_if is not None and rule.warn_if(value):
                out.warnings.append(f"{path}={value}: {rule.reason}")
        elif rule.fate == "acts":
            assert rule.target is not None
            try:
                out.put(path, rule.target, rule.convert(value) if rule.convert else value)
            except ValueError as exc:
                out.refuse(path, str(exc), "change the value")
    _derived(raw, out, algorithm)
    for _, section in rules.sections:
        if section.derived is not None:
            section.derived(raw, out)
    if out.errors:
        raise ConfigErrors(out.errors)
    return Translation(out.tree, out.new_origins, out.fates, out.warnings, frozenset(passthrough))


def unknown_warning(fates: list[KeyFate], shown: int = 5, dialect: str = "NeMo RL") -> str | None:
    """One warning block for the keys left out as unknown: their count and the first ``shown``,
    each with its file (None when there are none); ``dialect`` names the framework they are of."""
    unknown = [f for f in fates if f.fate == "unknown"]
    if not unknown:
        return None
    listed = ", ".join(f"{f.key} ({f.detail})" for f in unknown[:shown])
    more = f", and {len(unknown) - shown} more" if len(unknown) > shown else ""
    return (f"{len(unknown)} {dialect} key(s) corerl does not know were left out: {listed}{more} (--explain lists "
            "them all; --strict refuses them)")


