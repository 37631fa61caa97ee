"""The ``algorithm.async`` section (light: validation imports it without torch or Ray): the
section itself lives in :mod:`corerl.config.async_section` and is re-exported here, beside its
check against the chosen algorithm and generation placement."""

from __future__ import annotations

from corerl.config.async_section import IN_FLIGHT, SAMPLERS, SECTION, AsyncSettings, async_settings
from corerl.config.tree import origin_of
from corerl.errors import SelectionError

__all__ = ["IN_FLIGHT", "SAMPLERS", "SECTION", "AsyncSettings", "async_settings", "check_async", "check_async_chosen"]


def check_async(config: object, algorithm: object, asynchronous_ids: list[str]) -> None:
    """Refuse, in one line naming the key, ``algorithm.async.enabled`` for an algorithm without
    an asynchronous step, with generation colocated with training, or a simulated trainer
    (``simulate_training``) without the asynchronous loop it stands in for."""
    core, origins = config.core, config.origins  # type: ignore[attr-defined]
    settings = async_settings(config)
    if settings.simulate_training and not settings.enabled:
        raise SelectionError("a simulated trainer stands in for asynchronous GRPO's training steps, and "
                             "asynchronous GRPO is off", key=f"{SECTION}.simulate_training",
                             source=origin_of(f"{SECTION}.simulate_training", origins),
                             hint="set algorithm.async.enabled=true (with a dedicated generation group), or "
                                  "algorithm.async.simulate_training=false")
    if not settings.enabled:
        return
    if algorithm is not None and not getattr(algorithm, "asynchronous", False):
        raise SelectionError(f"algorithm {algorithm.id!r} has no asynchronous step", key=f"{SECTION}.enabled",  # type: ignore[attr-defined]
                             source=origin_of(f"{SECTION}.enabled", origins),
                             hint=f"use an algorithm that has one ({', '.join(asynchronous_ids) or 'none installed'}), "
                                  "or set algorithm.async.enabled=false")
    if core.policy.generation.colocated.enabled:
        raise SelectionError("asynchronous RL generates while training runs, but colocated generation shares the "
                             "training workers' devices, so the two would only take turns",
                             key="policy.generation.colocated.enabled",
                             source=origin_of("policy.generation.colocated.enabled", origins) or
                             origin_of(f"{SECTION}.enabled", origins),
                             hint="set policy.generation.colocated.enabled=false and "
                                  "policy.generation.colocated.resources.gpus_per_node (GPUs of its own; on a machine "
                                  "without GPUs, a process of its own)")


def check_async_chosen(config: object, chosen: object) -> None:
    """The validation table's row (:mod:`corerl.config.validation`, phase ``"algorithm"``):
    :func:`check_async` against the chosen algorithm, naming the installed ones that have an
    asynchronous step."""
    host = chosen.host  # type: ignore[attr-defined]
    check_async(config, chosen.algorithm, [a.id for a in host.algorithms if a.asynchronous])  # type: ignore[attr-defined]
