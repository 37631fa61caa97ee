"""SkyRL's keys translated into corerl's configuration: every key of a launch script (or of the
``key=value`` overrides given by hand) acts, is inert with a reason, or is refused in one line.

The table is :mod:`corerl.config.dialects.skyrl.lookup`'s: the core's shared sections with the
installed plugins' engine sections laid over them. A value switch (``trainer.strategy``, the
inference engine's ``backend``) goes to the one installed section that claims its value
(``SectionRules.claims``); the other sections claiming the key are inert in that script. What
several keys decide together is :mod:`corerl.config.dialects.skyrl.derived`'s. A key SkyRL does
not have is refused with a did-you-mean; a key SkyRL has that the table has no rule for is left
out with an ``unknown`` fate (``strict``: refused), as in NeMo RL's dialect."""

from __future__ import annotations

import difflib
from typing import Any

from corerl.config.dialects.nemo_rl import Translation, _Translator
from corerl.config.dialects.skyrl import derived, lookup
from corerl.config.tree import origin_of, value_at
from corerl.errors import ConfigError, ConfigErrors
from corerl.plugin_manager import PluginHost

__all__ = ["Translation", "translate"]

UNKNOWN_KEY = "a SkyRL key corerl does not know: nothing in corerl maps it"
UNKNOWN_HINT = "remove it (docs/migrating-from-skyrl.md lists the keys corerl takes)"


class _SkyRLTranslator(_Translator):
    """NeMo RL's translator's record of fates, with this dialect's origins."""

    def set(self, source: str, target: str, value: Any) -> None:
        super().set(source, target, value)
        self.new_origins[target] = origin_of(source, self.origins) or "skyrl dialect"

    def put(self, source: str, target: str, value: Any, detail: str | None = None) -> None:
        super().put(source, target, value, detail)
        self.new_origins[target] = origin_of(source, self.origins) or "skyrl dialect"


def not_skyrl_key(path: str, entry_point: str, origins: dict[str, str], host: PluginHost | None = None) -> ConfigError:
    """The one line for a key SkyRL does not have: where it was written, and the nearest key it has."""
    keys = lookup.known_keys(entry_point, host)
    keys = sorted({*keys, *(k.rsplit(".", n)[0] for k in keys for n in range(1, k.count(".") + 1))})
    near = difflib.get_close_matches(path, keys, n=1, cutoff=0.6)
    if not near:  # a misspelt last part: compare with the keys of the same section
        section, _, last = path.rpartition(".")
        siblings = [k for k in keys if k.startswith(section + ".")]
        near = [f"{section}.{m}" for m in difflib.get_close_matches(
            last, [k[len(section) + 1:] for k in siblings], n=1, cutoff=0.5)]
    where = origin_of(path, origins)
    hint = f"did you mean {near[0]}?" if near else "remove it (docs/migrating-from-skyrl.md lists SkyRL's keys)"
    return ConfigError(f"SkyRL has no such key (entry point {entry_point})", key=path, source=where,
                       hint=hint)


def translate(raw: dict[str, Any], origins: dict[str, str], strict: bool = False, host: PluginHost | None = None,
              entry_point: str = "main_base") -> Translation:
    """Translate the nested tree of a SkyRL script's overrides (``entry_point``: which of SkyRL's
    entry points the script starts); every refusal is reported together (exit 2)."""
    found = lookup.table(host)
    out = _SkyRLTranslator(dict(origins), raw, host)
    refused_entry = _refused_entry_point(entry_point)
    if refused_entry is not None:
        out.errors.append(refused_entry)
    entry_point = _canonical(entry_point)
    chosen: dict[str, Any] = {}  # engine section id -> the switch key that chose it
    inert_sections: dict[int, str] = {}  # id(section) -> why its keys are inert in this script
    known = set(lookup.known_keys(entry_point, host))
    switches = [key for key in found.switch_keys() if key in known]
    for key in switches:
        value = value_at(raw, key)
        claiming = found.claims(key)
        picked = [(reg, own) for reg, own in claiming if value in own.claims[key]]
        for reg, own in claiming:
            if (reg, own) not in picked:
                inert_sections[id(reg)] = (f"{key} is {value!r}: SkyRL reads this section only with "
                                           + ", ".join("unset" if v is None else str(v) for v in own.claims[key]))
        if value is None:
            continue
        if not picked:
            values = sorted({str(v) for _, own in claiming for v in own.claims[key] if v is not None})
            out.refuse(key, f"{value!r}: no installed plugin runs it" + (
                f" (installed: {', '.join(values)})" if values else ""),
                "install the plugin of that engine (`corerl plugins` lists them), or change the value")
            continue
        reg, own = picked[0]
        chosen[reg.id] = key
        rule = own.rules.get(key)
        if rule is not None and rule.fate == "acts" and rule.target is not None:
            out.put(key, rule.target, rule.convert(value) if rule.convert else value,
                    f"{rule.target} (plugin {reg.plugin})")
        else:
            out.inert(key, f"picks plugin {reg.plugin}'s {reg.backend or reg.id} engine")
    for path, value in lookup.leaves(raw, host):
        if path in switches:
            continue
        name = lookup.rule_name(path, entry_point, host)
        rule = lookup.rule_for(path, entry_point, host)
        owner = lookup.owner_of(path, entry_point, host)
        if owner is not None and id(owner) in inert_sections:
            out.inert(path, inert_sections[id(owner)])
            continue
        if rule is None:
            if lookup.is_skyrl_key(path, entry_point, host):
                if strict:
                    out.refuse(path, UNKNOWN_KEY, UNKNOWN_HINT)
                else:
                    out.unknown(path)
            else:
                out.errors.append(not_skyrl_key(path, entry_point, origins, host))
            continue
        _apply(out, path, value, rule, name)
    if entry_point == lookup.SFT:
        derived.derive_sft(raw, out)
    else:
        derived.derive(raw, out, entry_point)
    for _, own in found.sections:
        if own.derived is not None:
            own.derived(raw, out)
    if out.errors:
        raise ConfigErrors(out.errors)
    return Translation(out.tree, out.new_origins, out.fates, out.warnings)


def _entry(entry_point: str) -> Any:
    """H1a's record of the entry point (None: an id the module does not list, taken as it is)."""
    from corerl.config.dialects.skyrl import entry_points

    try:
        return entry_points.by_id(entry_point)
    except Exception:  # noqa: BLE001  (an id the module does not list)
        return None


def _canonical(entry_point: str) -> str:
    """The entry point as the translation reads it: ``sft`` for the SFT family (its top-level
    layout), ``on_policy_distillation`` for distillation, ``fully_async`` for a fully
    asynchronous schedule, ``async`` for the one-step off-policy one, else the id itself."""
    entry = _entry(entry_point)
    if entry is None:
        return entry_point
    if entry.family == "sft":
        return lookup.SFT
    if entry.family == "distillation":
        return "on_policy_distillation"
    return entry.schedule if entry.schedule in ("fully_async", "async") else entry_point


def _refused_entry_point(entry_point: str) -> ConfigError | None:
    """The one line for an entry point whose module adds code corerl does not have, or that trains nothing."""
    entry = _entry(entry_point)
    if entry is None:
        return None
    if entry.adds:
        return ConfigError(f"SkyRL's {entry.id} entry point ({entry.module}) adds {entry.adds}, which corerl does "
                           "not have", hint="start skyrl.train.entrypoints.main_base with the same keys, or use a "
                                            "corerl plugin that provides it")
    return None


def _apply(out: _SkyRLTranslator, path: str, value: Any, rule: Any, name: str | None) -> None:
    if rule.fate == "derived":
        return  # decided together with other keys (derived.py records its fate)
    if rule.fate == "refused":
        section = name[:-2] if name and name.endswith(".*") else None
        if section is not None:
            out.refuse_in_section(section, path, rule.reason)
        else:
            out.refuse(path, rule.reason, "remove the key")
    elif rule.fate == "inert":
        if rule.refuse_if is not None and rule.refuse_if(value):
            out.refuse(path, f"{value!r} is not supported: {rule.reason}",
                       "remove the key or use SkyRL's default")
            return
        out.inert(path, rule.reason)
        if rule.warn_if is not None and rule.warn_if(value):
            out.warnings.append(f"{path}={value}: {rule.reason}")
    elif rule.fate == "acts":
        try:
            out.put(path, rule.target, rule.convert(value) if rule.convert else value)
        except (ValueError, TypeError) as exc:
            out.refuse(path, str(exc), "change the value")
