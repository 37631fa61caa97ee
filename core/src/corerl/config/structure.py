"""Strict structuring of plain YAML data into attrs classes.

Every problem becomes a :class:`~corerl.errors.ConfigError` naming the key path: unknown keys
(with a "did you mean"), wrong types (with the expected type), values out of bounds,
missing required keys. All problems in a config are collected in one pass.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, Union

import attrs

from corerl.config.tree import Origins, origin_of
from corerl.errors import ConfigError

# key path -> schema (attrs class) of a section some plugin owns, or None when the owning
# plugin is known but not installed (the section is then kept as a plain mapping).
OwnedSections = Mapping[str, type | None]


@attrs.define
class StructureContext:
    """What one structuring pass needs and collects."""

    origins: Origins
    owned_sections: OwnedSections
    errors: list[ConfigError] = attrs.field(factory=list)
    sections: dict[str, Any] = attrs.field(factory=dict)
    default_source: str | None = None

    def error(self, path: str, message: str, hint: str | None = None) -> None:
        source = origin_of(path, self.origins) or self.default_source
        self.errors.append(ConfigError(message, key=path, source=source, hint=hint))


_INVALID = object()


def describe_type(tp: Any) -> str:
    """How a type is named in error messages."""
    origin = typing.get_origin(tp)
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if tp is Any:
        return "any value"
    if tp is dict or origin is dict:
        return "a mapping"
    if tp is list or origin is list:
        return "a list"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        named = [describe_type(a) for a in args if a is not type(None)]
        text = " or ".join(named)
        return text + (" or null" if type(None) in args else "")
    if attrs.has(tp):
        return "a section (mapping)"
    return getattr(tp, "__name__", str(tp))


def _describe_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} {value!r}"


def structure(cls: type, data: Any, path: str, ctx: StructureContext) -> Any:
    """Build ``cls`` from ``data`` at key path ``path``; problems go to ``ctx.errors``."""
    result = _structure_value(cls, data, path, ctx)
    return None if result is _INVALID else result


def _structure_value(tp: Any, value: Any, path: str, ctx: StructureContext) -> Any:
    origin = typing.get_origin(tp)
    if attrs.has(tp):
        return _structure_class(tp, value, path, ctx)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        return _structure_union(tp, value, path, ctx)
    if origin is Literal:
        if value in typing.get_args(tp) and not isinstance(value, bool):
            return value
        return _type_error(tp, value, path, ctx)
    if tp is dict or origin is dict:
        if isinstance(value, dict):
            return dict(value)
        return _type_error(tp, value, path, ctx)
    if tp is list or origin is list:
        if not isinstance(value, list):
            return _type_error(tp, value, path, ctx)
        (item_type,) = typing.get_args(tp) or (Any,)
        items = [_structure_value(item_type, v, f"{path}[{i}]", ctx) for i, v in enumerate(value)]
        return _INVALID if any(i is _INVALID for i in items) else items
    if tp is bool:
        return value if isinstance(value, bool) else _type_error(tp, value, path, ctx)
    if tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return value if ok else _type_error(tp, value, path, ctx)
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return float(value) if ok else _type_error(tp, value, path, ctx)
    if tp is str:
        return value if isinstance(value, str) else _type_error(tp, value, path, ctx)
    raise TypeError(f"corerl schema at {path} uses unsupported type {tp!r}")  # a bug in a schema


def _structure_union(tp: Any, value: Any, path: str, ctx: StructureContext) -> Any:
    args = typing.get_args(tp)
    if value is None:
        return None if type(None) in args else _type_error(tp, value, path, ctx)
    for arg in args:
        if arg is type(None):
            continue
        probe = StructureContext(ctx.origins, ctx.owned_sections, default_source=ctx.default_source)
        result = _structure_value(arg, value, path, probe)
        if result is not _INVALID and not probe.errors:
            ctx.sections.update(probe.sections)
            return result
    return _type_error(tp, value, path, ctx)


def _type_error(tp: Any, value: Any, path: str, ctx: StructureContext) -> Any:
    ctx.error(path, f"expected {describe_type(tp)}, got {_describe_value(value)}")
    return _INVALID


def _check_bounds(field: attrs.Attribute, value: Any, path: str, ctx: StructureContext) -> bool:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return True
    low, high = field.metadata.get("min"), field.metadata.get("max")
    strict = field.metadata.get("min_exclusive", False)
    if low is not None and (value <= low if strict else value < low):
        bound = f"greater than {low}" if strict else f"at least {low}"
        ctx.error(path, f"must be {bound}, got {value!r}")
        return False
    if high is not None and value > high:
        ctx.error(path, f"must be at most {high}, got {value!r}")
        return False
    return True


def suggest(name: str, candidates: list[str]) -> str | None:
    """The closest candidate to a misspelled ``name``, if any is close."""
    matches = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return matches[0] if matches else None


def _structure_class(cls: type, value: Any, path: str, ctx: StructureContext) -> Any:
    if not isinstance(value, Mapping):
        return _type_error(cls, value, path, ctx)
    fields = {f.name: f for f in attrs.fields(attrs.resolve_types(cls))}
    prefix = f"{path}." if path else ""
    owned_here = {
        p[len(prefix):]: schema for p, schema in ctx.owned_sections.items()
        if p.startswith(prefix) and "." not in p[len(prefix):]
    }
    kwargs: dict[str, Any] = {}
    failed = False
    suggested: set[str] = set()
    for key, raw in value.items():
        key_path = f"{prefix}{key}"
        if not isinstance(key, str):
            ctx.error(key_path, f"keys must be strings, got {key!r}")
            failed = True
        elif key in fields:
            result = _structure_value(fields[key].type, raw, key_path, ctx)
            if result is _INVALID or not _check_bounds(fields[key], result, key_path, ctx):
                failed = True
            else:
                kwargs[key] = result
        elif key in owned_here:
            _structure_owned(owned_here[key], raw, key_path, ctx)
        else:
            known = sorted([*fields, *owned_here])
            close = suggest(key, known)
            if close:
                suggested.add(close)
            hint = f"did you mean {prefix}{close}?" if close else f"known keys here: {', '.join(known)}"
            ctx.error(key_path, "unknown key", hint=hint)
            failed = True
    for name, field in fields.items():
        if name not in kwargs and field.default is attrs.NOTHING and name not in value:
            failed = True
            if name not in suggested:  # a misspelling of it is already reported
                what = "section" if attrs.has(field.type) else f"key ({describe_type(field.type)})"
                ctx.error(f"{prefix}{name}", f"missing required {what}")
    if failed:
        return _INVALID
    return cls(**kwargs)


def _structure_owned(schema: type | None, raw: Any, path: str, ctx: StructureContext) -> None:
    if schema is None:
        if isinstance(raw, Mapping):
            ctx.sections[path] = dict(raw)
        else:
            ctx.error(path, f"expected a section (mapping), got {_describe_value(raw)}")
        return
    result = _structure_value(schema, raw, path, ctx)
    if result is not _INVALID:
        ctx.sections[path] = result

