"""Which rule of NeMo RL's dialect a key takes: the table of the shared sections
(:mod:`corerl.config.dialects.nemo_rl_keys`) with the engine sections of the installed plugins laid
over it (:func:`table`), and the lookups the translator and its translation functions share.

A plugin host's :class:`corerl.registry.DialectSection` registrations of the ``nemo-rl`` dialect
give the engines' sections. A first-party engine's section whose plugin is not loaded
(:data:`corerl.known_plugins.FIRST_PARTY`) is inert but for its ``enabled``, which corerl's
validation judges as it does any backend's switch (naming the line that installs the plugin).
"""

from __future__ import annotations

import re
import weakref
from typing import Any

import attrs

from corerl import plugin_manager
from corerl.config.dialects import nemo_rl_keys as core
from corerl.config.dialects.rules import Rule, SectionRules, acts
from corerl.config.tree import value_at
from corerl.known_plugins import FIRST_PARTY, KnownPlugin
from corerl.plugin_manager import PluginHost
from corerl.registry import DialectSection

#: this dialect's id, as ``--dialect`` and a DialectSection's ``dialect`` name it
DIALECT = "nemo-rl"
ALGORITHM_SECTIONS = ("grpo", "ppo", "sft", "dpo", "distillation", "rm")
# NeMo RL's own top-level sections (``env`` and ``logger`` are corerl's too); ``generation`` and
# ``tokenizer`` are those of its evaluation recipes (examples/configs/evals), which have no policy
NEMO_ONLY_SECTIONS = ("loss_fn", "logger", "env", "value", "value_loss_fn", "teacher", "generation", "tokenizer")
#: an evaluation recipe's top-level sections mean the policy's: ``generation.x`` is ``policy.generation.x``
EVAL_RECIPE_ALIASES = ("generation", "tokenizer")
#: sections whose keys without a rule of their own take another section's rule (NeMo RL shares them)
SHARED_KEYS = {"ppo": "grpo", "distillation": "grpo", "rm": "dpo"}
#: algorithms whose steps sample the policy: NeMo RL validates them by sampling answers to held-out prompts
SAMPLING_ALGORITHMS = ("grpo", "ppo", "distillation")
# NeMo RL's dataset specs: corerl's data section has no such subsections
NEMO_ONLY_SUBSECTIONS = ("data.train", "data.validation", "data.default", "policy.tokenizer")


@attrs.frozen
class Table:
    """NeMo RL's dialect as one host has it: the shared sections' rules with the installed
    engine sections' laid over them."""

    rules: dict[str, Rule]
    switched: dict[str, bool]
    unsupported: dict[str, str]
    opaque: tuple[str, ...]
    frozen_inert: tuple[str, ...]
    critic_layouts: tuple[str, ...]
    #: the installed engine sections, in the registry's order
    sections: tuple[tuple[DialectSection, SectionRules], ...] = ()
    #: a first-party engine's section whose plugin is not loaded -> why, with how to get it
    absent: dict[str, str] = attrs.field(factory=dict)

    def absent_section(self, path: str) -> str | None:
        """The section of a plugin not loaded that ``path`` lies in, or None."""
        return next((s for s in self.absent if path == s or path.startswith(s + ".")), None)


_TABLES: weakref.WeakKeyDictionary[Any, Table] = weakref.WeakKeyDictionary()


def table(host: PluginHost | None = None) -> Table:
    """NeMo RL's dialect as ``host`` (None: this process's, :func:`corerl.plugin_manager.process_host`)
    has it, built once per collection of its registries."""
    host = host if host is not None else plugin_manager.process_host()
    registry = host.registry(DialectSection)
    found = _TABLES.get(registry)
    if found is None:
        found = _TABLES[registry] = _build(host, [r for r in registry if r.dialect == DIALECT])
    return found


def _build(host: PluginHost, registrations: list[DialectSection]) -> Table:
    sections = tuple((registration, registration.section_rules()) for registration in registrations)
    rules, switched, unsupported = dict(core.RULES), dict(core.SWITCHED_SECTIONS), dict(core.UNSUPPORTED_SECTIONS)
    opaque, frozen, critic = list(core.OPAQUE_KEYS), list(core.FROZEN_INERT), list(core.CRITIC_LAYOUTS)
    for registration, own in sections:
        rules.update(own.rules)
        switched.update(own.switched)
        unsupported.update(own.unsupported)
        opaque += own.opaque
        frozen += own.frozen_inert
        critic += [f"{section}." for section in registration.sections if section.startswith("value.")]
    owned = {section for registration, _ in sections for section in registration.sections}
    absent = {}
    for plugin in FIRST_PARTY:
        why = _not_loaded(host, plugin)
        for section in [s for s in plugin.sections if s.startswith("policy.")] if why else ():  # the engines'
            mirrors = (section, "value." + section[len("policy."):]) if section.count(".") == 1 else (section,)
            absent.update({s: f"{why}; it translates NeMo RL's {section}" for s in mirrors if s not in owned})
    return Table(rules, switched, unsupported, tuple(opaque), tuple(frozen), tuple(critic), sections, absent)


def _not_loaded(host: PluginHost, plugin: KnownPlugin) -> str | None:
    """Why the first-party ``plugin`` is not loaded in ``host`` (None: it is)."""
    info = next((i for i in host.plugins.values() if plugin.name in (i.name, i.distribution)
                 or plugin.distribution in (i.name, i.distribution)), None)
    if info is None:
        return f"plugin {plugin.name!r} ({plugin.distribution}) is not installed (install it with: {plugin.install})"
    if info.status == "disabled":
        return f"plugin {plugin.name!r} is disabled by CORERL_DISABLE_PLUGINS or CORERL_LOAD_PLUGINS"
    if info.status != "loaded":
        return f"plugin {plugin.name!r} failed to load (`corerl plugins` says why; reinstall: {plugin.install})"
    return None


def markdown_table(host: PluginHost | None = None) -> str:
    """The rows of the dialect's table (the shared sections', then each installed engine
    section's) as the Markdown table of ``docs/migrating-from-nemo-rl.md``."""
    lines = ["| NeMo RL key | in corerl |", "| --- | --- |"]
    for key, rule in table(host).rules.items():
        if rule.fate == "acts":
            text = f"acts: `{rule.target}`" + (" (converted)" if rule.convert else "") + (
                f": {rule.reason}" if rule.reason else "")
        elif rule.fate == "derived":
            text = f"acts together with other keys: {rule.reason}" if rule.reason else \
                "acts together with other keys (above)"
        elif rule.fate == "refused":
            text = f"refused: {rule.reason}"
        else:
            text = f"inert: {rule.reason}"
            if rule.refuse_if is not None:
                text += "; another value is refused"
            if rule.warn_if is not None:
                text += "; on, with a warning"
        lines.append(f"| `{key}` | {text} |")
    return "\n".join(lines) + "\n"


def looks_like(raw: dict[str, Any]) -> bool:
    """A NeMo RL recipe: an algorithm section of NeMo RL's (``grpo``, ``ppo``, ``dpo``,
    ``distillation``, ``rm``; ``sft`` in NeMo RL's form), or one of its own top-level sections
    (``loss_fn``, ``teacher``, an evaluation recipe's ``generation``; ``env`` and ``logger`` are
    corerl's too)."""
    sft = raw.get("sft")
    nemo_sft = isinstance(sft, dict) and any(k in sft for k in ("max_num_steps", "max_num_epochs", "val_period"))
    return nemo_sft or any(s in raw for s in ALGORITHM_SECTIONS if s != "sft") or any(
        s in raw for s in NEMO_ONLY_SECTIONS if s not in ("env", "logger"))


def is_eval_recipe(raw: dict[str, Any]) -> bool:
    """NeMo RL's evaluation recipe (examples/configs/evals): ``generation`` at the top level, no policy."""
    return isinstance(raw.get("generation"), dict) and "policy" not in raw


def aliased(path: str) -> str:
    """The corerl path an evaluation recipe's key means: ``generation.x`` is ``policy.generation.x``."""
    return f"policy.{path}" if path.split(".")[0] in EVAL_RECIPE_ALIASES else path


def _leaves(node: dict[str, Any], prefix: str = "", host: PluginHost | None = None) -> list[tuple[str, Any]]:
    opaque = table(host).opaque
    out = []
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and aliased(path) not in opaque:
            out += _leaves(value, f"{path}.", host)
        else:
            out.append((path, value))
    return out


def nemo_only(path: str) -> bool:
    """Whether ``path`` lies in a section only NeMo RL has (corerl has no key of that name)."""
    return path.split(".")[0] in (*ALGORITHM_SECTIONS, *NEMO_ONLY_SECTIONS) or any(
        path == sub or path.startswith(sub + ".") for sub in NEMO_ONLY_SUBSECTIONS)


def is_env_workers_key(path: str) -> bool:
    """``env.<id>.num_workers``: a key every corerl environment section has."""
    return re.fullmatch(r"env\.[a-z][a-z0-9_]*\.num_workers", path) is not None


def rule_for(path: str, host: PluginHost | None = None) -> Rule | None:
    """The rule of ``path``: its own, else that of the nearest ``prefix.*`` above it. NeMo RL's
    ``ppo`` and ``distillation`` sections share their keys with ``grpo``, ``rm`` with ``dpo``: a
    ``ppo.<key>`` without a rule of its own takes ``grpo.<key>``'s (:data:`SHARED_KEYS`). A
    ``value.<backend>_cfg`` or ``value.optimizer`` key takes the rule of ``policy.<key>``, moved to
    ``critic.<key>`` (see :func:`critic_rule`); an evaluation recipe's ``generation.<key>`` takes
    ``policy.generation.<key>``'s (:func:`aliased`)."""
    found = _own_rule(path, host)
    section = path.split(".")[0]
    if found is None and section in SHARED_KEYS:
        found = _own_rule(SHARED_KEYS[section] + path[len(section):], host)
    if found is None and path.startswith(table(host).critic_layouts):
        return critic_rule(path, host)
    return found


def critic_rule(path: str, host: PluginHost | None = None) -> Rule:
    """``value.<key>``: ``policy.<key>``'s rule with its target moved from ``policy.`` to ``critic.``;
    a key the policy passes through goes to ``critic.<key>``."""
    rest = path[len("value."):]
    found = _own_rule("policy." + rest, host)
    if found is None:
        return acts("critic." + rest)
    if found.fate == "acts" and found.target is not None and found.target.startswith("policy."):
        return attrs.evolve(found, target="critic." + found.target[len("policy."):])
    return found


def _own_rule(path: str, host: PluginHost | None = None) -> Rule | None:
    name = _rule_name(path, host)
    return None if name is None else table(host).rules[name]


def _rule_name(path: str, host: PluginHost | None = None) -> str | None:
    """The entry of the table that is ``path``'s own: ``path`` itself, else the nearest ``prefix.*``;
    for an evaluation recipe's ``generation.<key>`` without one, ``policy.generation.<key>``'s."""
    rules = table(host).rules
    for candidate in dict.fromkeys((path, aliased(path))):
        if candidate in rules:
            return candidate
        parts = candidate.split(".")
        for end in range(len(parts), 0, -1):  # an empty section is a leaf: its own prefix.* applies
            name = ".".join(parts[:end]) + ".*"
            if name in rules:
                return name
    return None


def _refused_section(path: str, host: PluginHost | None = None) -> str | None:
    """The section whose ``prefix.*`` rule refuses ``path`` (None: a rule of the key's own), named
    as the recipe names it."""
    name = _rule_name(path, host)
    if name is None or not name.endswith(".*"):
        return None
    return name[:-2] if path.startswith(name[:-2]) else name[len("policy."):-2]


def _switched_off(path: str, raw: dict[str, Any], host: PluginHost | None = None) -> str | None:
    switched = table(host).switched
    for section in sorted(switched, key=len, reverse=True):
        if path.startswith(section + ".") and value_at(raw, section + ".enabled") is False:
            if path == section + ".enabled" and switched[section]:
                return None
            return section
    return None
