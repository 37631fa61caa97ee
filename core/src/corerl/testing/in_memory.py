"""Plugins made in memory from registrations, for one test."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from corerl.hookspecs import hookimpl
from corerl.registry import GenerationBackend, OffloadPolicy, SequencePacker, TrainingBackend


def plugin_from(
    *,
    training_backends: Sequence[TrainingBackend] = (),
    generation_backends: Sequence[GenerationBackend] = (),
    sequence_packers: Sequence[SequencePacker] = (),
    offload_policies: Sequence[OffloadPolicy] = (),
) -> object:
    """A plugin object whose registration hooks register exactly what is given.

    Register it with ``corerl_host.register(plugin_from(...), name="mine")``.
    """

    def registering(items: Sequence[object]) -> Callable[..., None]:
        def hook(self: object, register: Callable[[object], None]) -> None:
            for item in items:
                register(item)

        return hookimpl(hook)

    hooks = {
        "corerl_register_training_backends": training_backends,
        "corerl_register_generation_backends": generation_backends,
        "corerl_register_sequence_packers": sequence_packers,
        "corerl_register_offload_policies": offload_policies,
    }
    methods = {name: registering(items) for name, items in hooks.items() if items}
    return type("InMemoryPlugin", (), methods)()
