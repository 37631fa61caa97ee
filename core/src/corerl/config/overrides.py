"""Command-line ``dotted.key=value`` overrides with YAML-typed values."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import attrs
import yaml

from corerl.config.recipes import canonical_path
from corerl.config.tree import Origins, record_origins
from corerl.config.yaml_io import parse_value
from corerl.errors import ConfigError, UsageError

_KEY = re.compile(r"^[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*$")


@attrs.frozen
class Override:
    """One ``KEY=VALUE`` from the command line, parsed."""

    path: str
    value: Any
    text: str

    @property
    def source(self) -> str:
        return f"override {self.text!r}"


def parse_override(text: str, host: Any = None) -> Override:
    """Parse ``a.b.c=value``; the value is read as YAML (``true``, ``3``, ``1e-5``, ``[1, 2]``)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep:
        raise UsageError(
            f"malformed override {text!r}: expected KEY=VALUE", hint="write e.g. policy.precision=bfloat16"
        )
    if not _KEY.match(key):
        raise UsageError(
            f"malformed override {text!r}: {key!r} is not a dotted key path",
            hint="write e.g. policy.max_seq_length=512",
        )
    try:
        value = parse_value(raw)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(
            f"malformed override {text!r}: the value is not valid YAML ({problem})",
            key=key, hint="quote it, e.g. key='\"a: b\"'",
        ) from exc
    return Override(canonical_path(key, host), value, text)


def apply_overrides(data: dict[str, Any], overrides: Iterable[Override], origins: Origins) -> None:
    """Set each override in ``data`` in place, creating sections as needed."""
    for override in overrides:
        *parents, leaf = override.path.split(".")
        node = data
        walked: list[str] = []
        for part in parents:
            walked.append(part)
            if part not in node:
                node[part] = {}
                origins[".".join(walked)] = override.source
            child = node[part]
            if not isinstance(child, dict):
                raise ConfigError(
                    f"cannot set {override.path}: {'.'.join(walked)} holds a {type(child).__name__}, not a section",
                    key=".".join(walked), source=override.source,
                )
            node = child
        node[leaf] = override.value
        origins[override.path] = override.source
        if isinstance(override.value, dict):
            record_origins(override.value, override.source, origins, prefix=f"{override.path}.")
