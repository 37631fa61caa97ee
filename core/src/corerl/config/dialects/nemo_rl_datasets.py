"""NeMo RL's several datasets at once: ``data.train`` (and ``data.validation``) as a list of
dataset sections, whose rows NeMo RL concatenates into one pool (``use_multiple_dataloader:
false``, its default; with it on, a custom Python function of the recipe picks the dataloaders,
which corerl does not run).

Before the dialect's rules run, such a list is merged into one section: its ``data_path`` and
``dataset_name`` become lists (corerl's ``data.train_files`` take several files as one pool; the
datasets are all local files or all Hub datasets), and each other key, a dataset's own or else
``data.default``'s, must have one value for every dataset, except the keys corerl leaves inert
(their values may differ: none acts). The merged section then goes through the rules of a single
one; ``max_samples`` then caps each file (``data.train_rows``), as NeMo RL caps each dataset.
"""

from __future__ import annotations

import copy
from typing import Any

#: keys whose values are collected per dataset (a list) rather than required to agree
LISTED = ("data_path", "dataset_name")


def merge_dataset_lists(raw: dict[str, Any], inert: Any) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
    """``raw`` with each dataset list of ``data.train`` and ``data.validation`` merged into one
    section, and the refusals ``(key, reason, hint)`` of what cannot be merged. ``inert(path)``
    says whether the dialect leaves ``path`` inert (a value that may differ between datasets)."""
    data = raw.get("data")
    if not isinstance(data, dict) or not any(isinstance(data.get(s), list) for s in ("train", "validation")):
        return raw, []
    raw = copy.deepcopy(raw)
    refusals: list[tuple[str, str, str]] = []
    for section in ("train", "validation"):
        entries = raw["data"].get(section)
        if not isinstance(entries, list):
            continue
        defaults = raw["data"].get("default") if isinstance(raw["data"].get("default"), dict) else {}
        merged, why = _merge(section, entries, defaults, inert)
        if why is not None:  # refused once, for the key at fault: the list itself says nothing more
            refusals.append(why)
            del raw["data"][section]
            continue
        raw["data"][section] = merged
    return raw, refusals


def _merge(section: str, entries: list[Any], defaults: dict[str, Any],
           inert: Any) -> tuple[dict[str, Any], tuple[str, str, str] | None]:
    """One section for ``entries`` (each laid over ``data.default``), or the refusal."""
    key = f"data.{section}"
    if not entries or not all(isinstance(entry, dict) for entry in entries):
        return {}, (key, "a list of datasets must hold one dataset section (a mapping) per dataset",
                    "give each dataset as a mapping with data_path (a local file) or dataset_name")
    local = [entry.get("data_path") is not None for entry in entries]
    if any(local) and not all(local):  # the local files would be read, the Hub datasets left out
        return {}, (f"{key}.data_path", "some datasets are local files and some are Hub datasets (dataset_name "
                    "without data_path); corerl reads local files and downloads nothing",
                    "give every dataset a local file (data_path)")
    merged: dict[str, Any] = {}
    for name in dict.fromkeys(k for entry in entries for k in entry):
        values = [entry.get(name, defaults.get(name)) for entry in entries]
        if name in LISTED:
            given = [value for value in values if value is not None]
            merged[name] = (given[0] if len(given) == 1 else given) if given else None
            continue
        distinct = [v for i, v in enumerate(values) if v not in values[:i]]
        if len(distinct) > 1 and not inert(f"{key}.{name}"):
            return {}, (f"{key}.{name}", f"differs between the datasets ({', '.join(map(repr, distinct))}); corerl "
                        "reads the datasets as one pool, with one setting for all",
                        f"give every dataset the same {name}, or set it once in data.default")
        merged[name] = next((value for value in values if value is not None), None)
    return merged, None
