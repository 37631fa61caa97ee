"""Reading YAML the way recipes expect: ``1e-5`` is a number, errors name file and line."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from corerl.errors import ConfigError


class RecipeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that also reads ``1e-5`` and ``3E+2`` as floats (YAML 1.2 style)."""


RecipeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d[\d_]*)?(?:\.\d*)?[eE][-+]?\d+$"),
    list("-+0123456789."),
)


def parse_value(text: str) -> Any:
    """A YAML-typed scalar or flow collection, as in ``key=value`` overrides."""
    return yaml.load(text, Loader=RecipeLoader)


def read_yaml_file(path: Path, *, needed_by: str | None = None) -> dict[str, Any]:
    """Load one recipe file as a mapping; every failure is a one-line :class:`ConfigError`."""
    where = f" (named by {needed_by})" if needed_by else ""
    if not path.exists():
        raise ConfigError(f"recipe file not found: {path}{where}", hint="check the path")
    if path.is_dir():
        raise ConfigError(f"recipe path is a directory, not a YAML file: {path}{where}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read recipe file {path}: {exc}") from exc
    try:
        data = yaml.load(text, Loader=RecipeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        position = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"YAML syntax error at {position}: {problem}", hint="fix the YAML") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"recipe {path} must be a mapping of sections at the top level, got {type(data).__name__}"
        )
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise ConfigError(f"recipe {path} has a non-string top-level key {bad[0]!r}")
    return data
