"""The config of a frozen model (a distillation teacher) with a layout or resources of its own.

A frozen model runs on a training backend built from a config shaped like the policy's. By
default it is the policy's own: the same layout, on the policy's devices. ``policy`` and
``cluster`` keys given for it (``algorithm.distillation.teacher_overrides``) are laid over the
recipe and validated again as the recipe is, so that a teacher can have another tensor-parallel
size, precision or micro-batch size, and with ``cluster`` keys ranks of its own: its backend
then reserves a pool of its own (``Config.pool``) instead of sharing the policy's.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from corerl.errors import ConfigError, ConfigErrors

if TYPE_CHECKING:
    from corerl.config import Config

#: the recipe sections a frozen model may give keys of its own for
OWN_SECTIONS = ("policy", "cluster")


def with_own_layout(config: Config, overrides: Mapping[str, Any] | None, key: str, pool: str) -> Config:
    """``config`` with ``overrides`` (``{"policy": {...}, "cluster": {...}}``) laid over its recipe
    and validated: the policy section, its backends' layout sections and the cluster become the
    frozen model's; with cluster keys, ``pool`` names the placement pool its ranks reserve.
    Problems are raised as :class:`~corerl.errors.ConfigErrors` at ``key`` (the overrides' key)."""
    from corerl.config import validate_with_sections
    from corerl.config.tree import deep_merge, origin_of, record_origins

    if not overrides:
        return config
    if not isinstance(overrides, Mapping):
        raise ConfigError(f"expected a mapping of {' and '.join(OWN_SECTIONS)} keys, got {type(overrides).__name__}",
                          key=key, hint="e.g. {policy: {<backend>_cfg: {tensor_parallel_size: 2}}}, <backend> a training backend id")
    for section in overrides:
        if section not in OWN_SECTIONS:
            raise ConfigError(f"{section} is not a section a frozen model can have its own keys for", key=f"{key}.{section}",
                              hint=f"give only {' and '.join(OWN_SECTIONS)} keys")
    raw = deep_merge(copy.deepcopy(config.raw), overrides)
    origins = dict(config.origins)
    given: dict[str, str] = {}
    record_origins(dict(overrides), key, given)
    for path in given:  # each key's own origin: the recipe's line, or the override that set it
        origins[path] = origin_of(f"{key}.{path}", config.origins) or key
    owned = {path: type(value) if attrs.has(type(value)) else None for path, value in config.sections.items()}
    try:
        own = validate_with_sections(raw, origins, owned, config.source)
    except ConfigErrors as exc:  # the problem is the frozen model's: said at its key
        for error in exc.errors:
            if isinstance(error, ConfigError) and error.key and error.key.split(".")[0] in overrides:
                error.key = f"{key}.{error.key}"
        raise ConfigErrors(exc.errors) from None
    sections = {**config.sections, **{path: value for path, value in own.sections.items() if path.startswith("policy.")}}
    core = attrs.evolve(config.core, policy=own.core.policy, cluster=own.core.cluster)
    return attrs.evolve(config, core=core, sections=sections,
                        pool=pool if "cluster" in overrides else config.pool)
