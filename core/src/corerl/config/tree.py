"""Nested-mapping helpers shared by recipe loading and overrides, with origin tracking.

``origins`` maps a dotted key path to where its value came from (a file, an override), so
that an error can say where to fix it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corerl.errors import origin_of  # noqa: F401 (it lives with the errors whose source it names)

Origins = dict[str, str]


def record_origins(data: Mapping[str, Any], source: str, origins: Origins, prefix: str = "") -> None:
    """Note ``source`` as the origin of every key path in ``data``."""
    for key, value in data.items():
        path = f"{prefix}{key}"
        origins[path] = source
        if isinstance(value, Mapping):
            record_origins(value, source, origins, prefix=f"{path}.")


#: a mapping holding this key set to true replaces what is below it instead of merging into it
#: (the spelling NeMo RL's recipes use: ``data: {_override_: true, ...}``)
OVERRIDE = "_override_"


def deep_merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``: mappings merge key by key, anything else (lists too) replaces, and so
    does a mapping of ``top`` that holds :data:`OVERRIDE` set to true (the marker itself is dropped).
    The result shares no mapping with ``top`` (renaming a key in it leaves the caller's intact)."""
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping):
            below = merged.get(key)
            if value.get(OVERRIDE) is True:
                below, value = {}, {k: v for k, v in value.items() if k != OVERRIDE}
            merged[key] = deep_merge(dict(below) if isinstance(below, Mapping) else {}, value)
        else:
            merged[key] = value
    return merged


def rename_key(data: dict[str, Any], path: str, new_name: str) -> bool:
    """Rename the key at dotted ``path`` to ``new_name`` in place; False if absent."""
    *parents, leaf = path.split(".")
    node: Any = data
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            return False
    if not isinstance(node, dict) or leaf not in node:
        return False
    node[new_name] = node.pop(leaf)
    return True


_ABSENT = object()


def value_at(data: Mapping[str, Any], path: str, default: Any = None) -> Any:
    """The value at dotted ``path`` in nested mappings, or ``default`` where it is absent."""
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def set_at(data: dict[str, Any], path: str, value: Any) -> None:
    """Set dotted ``path`` in nested dicts to ``value``, creating the sections on the way."""
    *parents, leaf = path.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def drop_at(data: dict[str, Any], path: str) -> None:
    """Remove the key at dotted ``path`` and every section it leaves empty."""
    *parents, leaf = path.split(".")
    chain = [data]
    for part in parents:
        chain.append(chain[-1][part])
    del chain[-1][leaf]
    for depth in range(len(parents), 0, -1):
        if chain[depth]:
            break
        del chain[depth - 1][parents[depth - 1]]


def has_path(data: Mapping[str, Any], path: str) -> bool:
    """Whether dotted ``path`` is set in nested mappings (to anything, None included)."""
    return value_at(data, path, _ABSENT) is not _ABSENT
