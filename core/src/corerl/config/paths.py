"""Relative paths in recipe files.

A setting declared ``setting(..., path=True)`` names a local file or folder a run reads (data
files, model and tokenizer folders). A relative value written in a recipe file is looked up
beside that file first (the folder of the file that sets it: a ``defaults:`` parent's keys beside
the parent), then in the working directory, and becomes the absolute path where it is found
(the recorded ``recipe.yaml`` of a run then names the same files from anywhere). Found in both
places, the recipe's folder wins, with a warning; found in neither, it is left as written, and the
run's input check (:mod:`corerl.run.inputs`) refuses it, saying where it looked.

A value given on the command line (``KEY=VALUE``) or through the Python API is relative to the
working directory, as any path a program is given. Output folders (``run.output_dir``) are not
path settings: a run writes under the working directory whatever recipe it runs.
"""

from __future__ import annotations

import functools
import os
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

from corerl.config.tree import Origins, origin_of, set_at, value_at


def path_keys_of(schema: type, prefix: str = "", flag: str = "path") -> Iterator[str]:
    """The key path of every path setting of the attrs ``schema`` (nested sections included); with
    ``flag="model"``, of every model setting (``setting(model=True)``)."""
    hints = typing.get_type_hints(schema)
    for field in attrs.fields(schema):
        hint = hints.get(field.name, field.type)
        nested = [t for t in (hint, *typing.get_args(hint)) if isinstance(t, type) and attrs.has(t)]
        if nested:
            yield from path_keys_of(nested[0], f"{prefix}{field.name}.", flag)
        elif field.metadata.get(flag):
            yield f"{prefix}{field.name}"


def path_keys(owned: Mapping[str, type | None]) -> list[str]:
    """The path settings of the core's sections and of each plugin-owned section (key path -> schema)."""
    from corerl.config.schema import CorerlConfig

    keys = list(_path_keys(CorerlConfig, ""))
    for section_path, schema in owned.items():
        if schema is not None and attrs.has(schema):
            keys += _path_keys(schema, f"{section_path}.")
    return keys


@functools.cache
def _path_keys(schema: type, prefix: str) -> tuple[str, ...]:
    return tuple(path_keys_of(schema, prefix))


def recipe_folder(origin: str | None) -> Path | None:
    """The folder of the recipe file ``origin`` names (None: an override, the Python API, a dialect's default)."""
    if origin is None or not os.path.isabs(origin) or not os.path.isfile(origin):
        return None
    return Path(origin).parent


def locate(text: str, folder: Path) -> tuple[str, str | None]:
    """``text`` (a path written in a recipe in ``folder``) as it is used, and a warning when it is
    found both beside the recipe and in the working directory (two different things)."""
    if not text or os.path.isabs(text):
        return text, None
    beside = os.path.abspath(os.path.join(folder, text))
    here = os.path.abspath(text)
    if os.path.exists(beside):
        if os.path.exists(here) and not os.path.samefile(beside, here):
            return beside, (f"{text} is both beside the recipe ({beside}) and in the working directory ({here}): "
                            "the one beside the recipe is used")
        return beside, None
    if os.path.exists(here):
        return here, None
    return text, None


def resolve_recipe_paths(raw: dict[str, Any], origins: Origins, keys: list[str]) -> list[str]:
    """Rewrite, in place, each relative path a recipe file gives at ``keys`` (a string or a list
    of strings) as :func:`locate` finds it; returns the warnings, each naming its key."""
    warnings = []
    for key in keys:
        value = value_at(raw, key)
        folder = recipe_folder(origin_of(key, origins))
        if folder is None or not (isinstance(value, str) or (isinstance(value, list) and value
                                                             and all(isinstance(v, str) for v in value))):
            continue
        located = [locate(text, folder) for text in ([value] if isinstance(value, str) else value)]
        set_at(raw, key, located[0][0] if isinstance(value, str) else [path for path, _ in located])
        warnings += [f"{key}: {warning} ({origin_of(key, origins)})" for _, warning in located if warning]
    return warnings


def where_looked(key: str, value: Any, origins: Origins) -> str | None:
    """For a path setting whose relative ``value`` a recipe file gave and that was found nowhere:
    where it was looked for, as a hint's clause (None otherwise)."""
    folder = recipe_folder(origin_of(key, origins))
    texts = [value] if isinstance(value, str) else list(value) if isinstance(value, list) else []
    if folder is None or not any(isinstance(t, str) and t and not os.path.isabs(t) for t in texts):
        return None
    return (f"a relative path in a recipe is looked up beside it ({folder}), then in the working directory "
            f"({os.getcwd()})")
