"""SkyRL's ``key=value`` overrides, parsed as SkyRL parses them, into a nested tree (issue 75).

SkyRL hands its command line to ``OmegaConf.from_cli``: each value is read by YAML's scalar rules
(``null``, ``true``/``True``, numbers such as ``1e-6``, ``['a','b']`` lists, ``{k: v}`` mappings,
anything else a string, an empty value ``None``), later overrides win, and the ``+`` prefix (adding
a key) is refused. Each override keeps where it was written (``run_gsm8k.sh:23``, or ``command
line``) so that every error about its key names it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import attrs

from corerl.errors import ConfigError

__all__ = ["Override", "parse_override", "tree_of"]

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*")


@attrs.frozen
class Override:
    """One ``key=value``: the dotted key, its parsed value, the text as written and where."""

    key: str
    value: Any
    text: str
    origin: str


def parse_override(text: str, origin: str) -> Override:
    """``key=value`` parsed as SkyRL parses it; a malformed one is refused in one line naming
    ``origin``."""
    if text.startswith(("+", "~")):
        what = "adds a key" if text.startswith("+") else "deletes a key"
        raise ConfigError(f"{text!r} {what}: SkyRL's overrides only set the keys its defaults have", source=origin,
                          hint=f"write {text.lstrip('+~')!r} (a key SkyRL has) or leave it out")
    key, sep, raw = text.partition("=")
    if not sep or not _KEY.fullmatch(key):
        raise ConfigError(f"{text!r} is not a key=value override", source=origin,
                          hint="write dotted.key=value (e.g. trainer.epochs=2)")
    return Override(key, parse_value(raw, key, origin), text, origin)


def parse_value(raw: str, key: str = "value", origin: str | None = None) -> Any:
    """A value as ``OmegaConf.from_cli`` reads it (``${...}`` references are kept as written)."""
    from omegaconf import OmegaConf  # a core dependency, imported when a SkyRL override is read

    try:
        return OmegaConf.to_container(OmegaConf.from_dotlist([f"v={raw}"]), resolve=False)["v"]
    except Exception as exc:  # noqa: BLE001 - OmegaConf's grammar errors have several types
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"cannot read the value {raw!r}: {reason}", key=key, source=origin,
                          hint="quote it in the script (key=\"'...'\") or fix its brackets") from None


def tree_of(overrides: Iterable[Override]) -> tuple[dict[str, Any], dict[str, str]]:
    """The nested tree the overrides make, in order (a later one wins; a mapping value merges into
    a mapping already there), and each dotted key's origin (a mapping value's keys too)."""
    tree: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for item in overrides:
        *parents, leaf = item.key.split(".")
        node = tree
        for name in parents:
            if not isinstance(node.get(name), dict):
                node[name] = {}
            node = node[name]
        if isinstance(item.value, dict) and isinstance(node.get(leaf), dict):
            _merge(node[leaf], item.value)
        else:
            for stale in [k for k in origins if k.startswith(item.key + ".")]:
                del origins[stale]
            node[leaf] = item.value
        origins[item.key] = item.origin
        for sub in _leaf_keys(item.value, item.key):
            origins[sub] = item.origin
    return tree, origins


def _merge(into: dict[str, Any], value: dict[str, Any]) -> None:
    for name, sub in value.items():
        if isinstance(sub, dict) and isinstance(into.get(name), dict):
            _merge(into[name], sub)
        else:
            into[name] = sub


def _leaf_keys(value: Any, prefix: str) -> list[str]:
    if not isinstance(value, dict):
        return []
    keys = []
    for name, sub in value.items():
        keys += [f"{prefix}.{name}", *_leaf_keys(sub, f"{prefix}.{name}")]
    return keys
