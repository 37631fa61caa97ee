"""What validation can know of the policy model before anything starts, from its ``config.json``
(or a built-in model's spec): the longest sequence it takes, whether its heads divide a
tensor-parallel size. Read once per check, without torch or transformers; a model that is not
local (or not a dense decoder the shape reader knows) is not checked here."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from corerl.errors import ConfigError


def model_shape(config: Any) -> Any | None:
    """The :class:`~corerl.planning.shape.ModelShape` of ``policy.model_name`` where it can be read
    here (a built-in model, or a local folder whose ``config.json`` describes a dense decoder);
    None otherwise. The checks of one validation share one read of ``config.json``."""
    name = config.core.policy.model_name
    try:
        stamp = os.stat(Path(name) / "config.json").st_mtime_ns
    except OSError:
        stamp = None  # a built-in model, or nothing local to read
    return _shape_of(name, stamp)


@functools.lru_cache(maxsize=8)
def _shape_of(name: str, stamp: int | None) -> Any | None:
    """``name``'s shape as its ``config.json`` stood at modification time ``stamp``."""
    from corerl.planning.shape import ModelShape

    try:
        return ModelShape.of_model(name)
    except (ConfigError, OSError, ValueError):
        return None


def _source(config: Any) -> str:
    """Where the model's facts were read: its ``config.json``, or the built-in model's spec."""
    name = config.core.policy.model_name
    return name if name.startswith("builtin:") else f"{name}/config.json"


def tensor_parallel_fits(shape: Any, size: int) -> bool:
    """Whether ``size`` ranks can split the model's attention and key-value heads evenly."""
    return shape.heads % size == 0 and shape.kv_heads % size == 0


def check_tensor_parallel(config: Any, size: int, key: str) -> None:
    """Refuse, at ``key``, a tensor-parallel ``size`` that does not divide the local model's heads."""
    shape = model_shape(config)
    if size > 1 and shape is not None and not tensor_parallel_fits(shape, size):
        fitting = [n for n in range(1, size + 1) if tensor_parallel_fits(shape, n)]
        raise ConfigError(f"{size} ranks cannot split the model's {shape.heads} attention heads and {shape.kv_heads} "
                          f"key-value heads evenly ({_source(config)})", key=key,
                          hint=f"use one of {', '.join(map(str, fitting))}")


def check_model_limits(config: Any) -> None:
    """Refuse a ``policy.max_seq_length`` beyond the local model's ``max_position_embeddings``."""
    shape = model_shape(config)
    longest = config.core.policy.max_seq_length
    if shape is not None and longest > shape.max_positions:
        raise ConfigError(f"{longest} tokens is longer than the model takes (max_position_embeddings "
                          f"{shape.max_positions} in {_source(config)})",
                          key="policy.max_seq_length", hint=f"set policy.max_seq_length={shape.max_positions} or less")
