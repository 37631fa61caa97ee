"""The installed memory models a plan is made with: the training backends' (by backend id) and
the generation engines' (by engine id, the default first), as the plugins register them
(``corerl_register_memory_models``). Below the planner and the request, which both read them."""

from __future__ import annotations

from typing import Any

from corerl.planning.memory import GenerationMemory, MemoryModel

__all__ = ["default_generation", "installed_generation_models", "installed_models"]


def installed_models(host: Any) -> dict[str, MemoryModel]:
    """The memory model of every registered one whose training backend is installed, by backend id."""
    return {registration.id: registration.create() for registration in host.memory_models
            if registration.id in host.training_backends}


def installed_generation_models(host: Any = None) -> dict[str, GenerationMemory]:
    """The memory model of every installed generation engine that registers one, by engine id,
    in the engines' order (highest priority first: the first is the default engine). ``host``
    None: this process's."""
    if host is None:
        from corerl.config.presets import default_host

        host = default_host()
    registered = {registration.id: registration for registration in host.memory_models}
    out: dict[str, GenerationMemory] = {}
    for engine in host.generation_backends:
        registration = registered.get(engine.id)
        if registration is None:
            continue
        model = registration.create()
        if isinstance(model, GenerationMemory):  # a backend that samples with its training weights has none
            out[engine.id] = model
    return out


def default_generation(engines: dict[str, GenerationMemory]) -> str | None:
    """The id of the engine a layout that names none samples with (None when no engine has a
    memory model)."""
    return next(iter(engines), None)
