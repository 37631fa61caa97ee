"""Recipe files: ``defaults:`` inheritance, section aliases, and where each key came from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corerl.config.tree import Origins, deep_merge, has_path, record_origins, rename_key
from corerl.config.yaml_io import read_yaml_file
from corerl.errors import ConfigError


def section_aliases(host: Any) -> dict[str, str]:
    """Spellings that occur in the wild for a plugin's section -> the canonical key path (each
    registration of ``host`` declares its own, e.g. the dtensor plugin's ``policy.dtensor_config``)."""
    return host.section_aliases() if host is not None else {}


def canonical_path(path: str, host: Any) -> str:
    """``path`` with any section aliased by a registration of ``host`` spelled canonically."""
    for alias, canonical in section_aliases(host).items():
        if path == alias or path.startswith(alias + "."):
            return canonical + path[len(alias):]
    return path


def normalise_aliases(data: dict[str, Any], source: str, host: Any) -> None:
    """Rename the sections ``host``'s registrations alias, in place; both spellings at once is an error."""
    for alias, canonical in section_aliases(host).items():
        if has_path(data, alias):
            if has_path(data, canonical):
                raise ConfigError(
                    f"both {canonical} and its alias {alias} are set",
                    key=canonical, source=source, hint="keep one of the two spellings",
                )
            rename_key(data, alias, canonical.rsplit(".", 1)[1])


def load_recipe(path: str | Path, host: Any = None) -> tuple[dict[str, Any], Origins]:
    """Load ``path`` with everything it inherits through ``defaults:``.

    ``defaults`` is a path or a list of paths, relative to the file that names them, or
    ``preset:NAME`` (:mod:`corerl.config.presets`); they merge in order and the file itself goes on top.
    """
    return _load(Path(path).expanduser().resolve(), stack=(), needed_by=None, host=host)


def _defaults_target(path: Path, entry: str, host: Any) -> Path:
    from corerl.config import presets

    if entry.startswith(presets.PREFIX):
        return presets.path_of(entry[len(presets.PREFIX):], key="defaults", source=str(path), host=host)
    return (path.parent / Path(entry).expanduser()).resolve()


def _load(path: Path, stack: tuple[Path, ...], needed_by: str | None, host: Any) -> tuple[dict[str, Any], Origins]:
    if path in stack:
        chain = " -> ".join(p.name for p in (*stack, path))
        raise ConfigError(
            f"inheritance cycle through defaults: {chain}", key="defaults", source=str(stack[-1]),
            hint="remove one of the defaults entries",
        )
    data = read_yaml_file(path, needed_by=needed_by)
    parents = data.pop("defaults", None)
    normalise_aliases(data, str(path), host)
    if parents is None:
        parents = []
    elif isinstance(parents, str):
        parents = [parents]
    if not isinstance(parents, list) or not all(isinstance(p, str) and p for p in parents):
        raise ConfigError(
            "expected a recipe path or a list of recipe paths", key="defaults", source=str(path),
            hint="write e.g. `defaults: base.yaml`",
        )
    merged: dict[str, Any] = {}
    origins: Origins = {}
    for entry in parents:
        target = _defaults_target(path, entry, host)
        parent_data, parent_origins = _load(target, (*stack, path), needed_by=f"defaults: in {path}", host=host)
        merged = deep_merge(merged, parent_data)
        origins.update(parent_origins)
    record_origins(data, str(path), origins)
    return deep_merge(merged, data), origins
