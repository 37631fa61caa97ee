"""Which rule of SkyRL's dialect a key takes: the core's shared sections
(:mod:`corerl.config.dialects.skyrl.keys`) with the installed plugins' engine sections
(``DialectSection(dialect="skyrl")``) laid over them (:func:`table`), the value switches the
engine sections claim (``SectionRules.claims``: ``trainer.strategy``), and the Markdown table of
``docs/migrating-from-skyrl.md`` (:func:`markdown_table`)."""

from __future__ import annotations

import weakref
from typing import Any

import attrs

from corerl import plugin_manager
from corerl.config.dialects.rules import Rule, SectionRules
from corerl.config.dialects.skyrl import keys as core
from corerl.plugin_manager import PluginHost
from corerl.registry import DialectSection

#: this dialect's id, as ``--dialect`` and a DialectSection's ``dialect`` name it
DIALECT = "skyrl"
#: the entry point whose keys lie at the top level (SkyRL's SFT trainer)
SFT = "sft"


@attrs.frozen
class Table:
    """SkyRL's dialect as one host has it."""

    rules: dict[str, Rule]
    sft_rules: dict[str, Rule]
    #: key or ``prefix.*`` -> the engine section whose rule it is (absent: the core's)
    owner: dict[str, DialectSection]
    #: the installed engine sections, in the registry's order
    sections: tuple[tuple[DialectSection, SectionRules], ...]
    opaque: tuple[str, ...]

    def claims(self, key: str) -> list[tuple[DialectSection, SectionRules]]:
        """The sections claiming values of the switch ``key``."""
        return [(reg, own) for reg, own in self.sections if key in own.claims]

    def switch_keys(self) -> list[str]:
        return list(dict.fromkeys(key for _, own in self.sections for key in own.claims))


_TABLES: weakref.WeakKeyDictionary[Any, Table] = weakref.WeakKeyDictionary()


def table(host: PluginHost | None = None) -> Table:
    """SkyRL's dialect as ``host`` (None: this process's) has it, built once per registry."""
    host = host if host is not None else plugin_manager.process_host()
    registry = host.registry(DialectSection)
    found = _TABLES.get(registry)
    if found is None:
        found = _TABLES[registry] = _build([r for r in registry if r.dialect == DIALECT])
    return found


def _build(registrations: list[DialectSection]) -> Table:
    sections = tuple((registration, registration.section_rules()) for registration in registrations)
    rules, sft_rules, owner = dict(core.RULES), dict(core.SFT_RULES), {}
    opaque = list(core.OPAQUE_KEYS)
    for registration, own in sections:
        for key, rule in own.rules.items():
            if key in own.claims:
                continue  # a switch's rule is the claiming section's own (the value decides whose)
            (sft_rules if _is_sft_key(key) else rules)[key] = rule
            owner[key] = registration
        opaque += own.opaque
    return Table(rules, sft_rules, owner, sections, tuple(opaque))


def _is_sft_key(key: str) -> bool:
    """A key of the SFT entry point's top-level layout (an RL key starts with its section)."""
    return key.split(".")[0] not in ("trainer", "generator", "data", "environment")


def rule_name(path: str, entry_point: str, host: PluginHost | None = None) -> str | None:
    """The entry of the table that is ``path``'s: ``path`` itself, else the nearest ``prefix.*``;
    an SFT key without one of its own takes the rule of the RL key it aliases."""
    found = table(host)
    for rules, candidate in _candidates(path, entry_point, found):
        if candidate in rules:
            return candidate
        parts = candidate.split(".")
        for end in range(len(parts), 0, -1):
            name = ".".join(parts[:end]) + ".*"
            if name in rules:
                return name
    return None


def _candidates(path: str, entry_point: str, found: Table) -> list[tuple[dict[str, Rule], str]]:
    if entry_point != SFT:
        return [(found.rules, path)]
    return [(found.sft_rules, path), (found.rules, aliased(path))]


def rule_for(path: str, entry_point: str, host: PluginHost | None = None) -> Rule | None:
    name = rule_name(path, entry_point, host)
    if name is None:
        return None
    found = table(host)
    own = found.sft_rules if entry_point == SFT and name in found.sft_rules and (
        name == path or path.startswith(name[:-2])) else found.rules
    return own.get(name) or found.rules.get(name) or found.sft_rules.get(name)


def owner_of(path: str, entry_point: str, host: PluginHost | None = None) -> DialectSection | None:
    """The engine section whose rule ``path`` takes (None: the core's)."""
    name = rule_name(path, entry_point, host)
    return None if name is None else table(host).owner.get(name)


def aliased(path: str) -> str:
    """The RL key an SFT key means (``model.path``: ``trainer.policy.model.path``), else ``path``."""
    for alias, target in core.SFT_ALIASES.items():
        if path == alias or path.startswith(alias + "."):
            return target + path[len(alias):]
    return path


def known_keys(entry_point: str, host: PluginHost | None = None) -> list[str]:
    """Every key SkyRL has for ``entry_point``'s layout (the table's and SkyRL's configuration's):
    what a misspelt key is compared with."""
    found = table(host)
    if entry_point == SFT:
        own = [*core.SFT_KEYS, *found.sft_rules, *(k for k in found.switch_keys() if _is_sft_key(k))]
    else:
        own = [*core.TRAIN_KEYS, *found.rules, *(k for k in found.switch_keys() if not _is_sft_key(k))]
    return sorted({key[:-2] if key.endswith(".*") else key for key in own})


def is_skyrl_key(path: str, entry_point: str, host: PluginHost | None = None) -> bool:
    """Whether ``path`` is a key SkyRL has (or lies in a mapping it takes whole)."""
    keys = set(known_keys(entry_point, host))
    return path in keys or any(path.startswith(key + ".") for key in keys)


def leaves(node: dict[str, Any], host: PluginHost | None = None, prefix: str = "") -> list[tuple[str, Any]]:
    """The script's keys with their values; a mapping taken whole is one key."""
    opaque = table(host).opaque
    out = []
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and path not in opaque and aliased(path) not in opaque:
            out += leaves(value, host, f"{path}.")
        else:
            out.append((path, value))
    return out


def _describe(rule: Rule) -> str:
    if rule.fate == "acts":
        return f"acts: `{rule.target}`" + (" (converted)" if rule.convert else "") + (
            f": {rule.reason}" if rule.reason else "")
    if rule.fate == "derived":
        return f"acts together with other keys: {rule.reason}" if rule.reason else \
            "acts together with other keys"
    if rule.fate == "refused":
        return f"refused: {rule.reason}"
    text = f"inert: {rule.reason}"
    if rule.refuse_if is not None:
        text += "; another value is refused"
    if rule.warn_if is not None:
        text += "; on, with a warning"
    return text


def markdown_table(host: PluginHost | None = None) -> str:
    """The dialect's table as the Markdown of ``docs/migrating-from-skyrl.md``: the RL entry
    points' keys (the shared sections', then each installed engine section's), the value switches
    and which engine each value picks, then the SFT entry point's own keys."""
    found = table(host)
    lines = ["| SkyRL key | in corerl |", "| --- | --- |"]
    lines += [f"| `{key}` | {_describe(rule)} |" for key, rule in found.rules.items()]
    for key in found.switch_keys():
        for registration, own in found.claims(key):
            values = ", ".join("unset" if v is None else f"`{v}`" for v in own.claims[key])
            rule = own.rules.get(key)
            what = _describe(rule) if rule is not None else f"the {registration.backend} backend"
            lines.append(f"| `{key}` = {values} | {what} (plugin {registration.plugin}) |")
    lines += [f"| `{key}` (SFT) | {_describe(rule)} |" for key, rule in found.sft_rules.items()]
    lines += [f"| `{alias}` (SFT) | as `{target}` |" for alias, target in core.SFT_ALIASES.items()]
    return "\n".join(lines) + "\n"
