"""The validation phase's check of dedicated generation against the cluster: GPUs of its own that
the cluster can never give are refused before a run starts anything.

It reads the recipe (``policy.generation.colocated``, ``algorithm.async``, ``cluster.ray_address``)
and asks :mod:`corerl.distributed.placement` whether the pool fits; it lives with the config,
above both, so that placement needs neither the config's sections nor a Ray connection of its
own (:func:`corerl.distributed.worker_group.ensure_ray`, looked up when called).
"""

from __future__ import annotations

import os
from typing import Any

from corerl.config.async_section import async_settings
from corerl.distributed import worker_group
from corerl.distributed.placement import (
    ClusterView,
    async_generation_layout,
    check_fits,
    dedicated_generation_layout,
)


def check_dedicated_generation(config: Any) -> None:
    """Before a run starts anything: refuse dedicated generation GPUs the cluster can never give
    (connects to Ray, as the engine would; nothing to do for colocated generation)."""
    colocated = config.core.policy.generation.colocated
    if colocated.enabled:
        return
    layout = dedicated_generation_layout(colocated.resources)
    if async_settings(config).enabled:  # the asynchronous worker: GPUs where the cluster has them, else CPUs
        layout = async_generation_layout(colocated.resources)
    local = None if config.core.cluster.ray_address or os.environ.get("RAY_ADDRESS") else ClusterView.local()
    if local is None:
        worker_group.ensure_ray(config.core.cluster.ray_address)
    check_fits(layout, 1, "generation engine", local or ClusterView.from_ray())


def check_dedicated_generation_chosen(config: Any, chosen: Any) -> None:
    """The validation table's row (:mod:`corerl.config.validation`): :func:`check_dedicated_generation`."""
    check_dedicated_generation(config)
