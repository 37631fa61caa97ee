"""Plugins made in memory from registrations, for one test."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from corerl.component_kinds import KINDS
from corerl.hookspecs import hookimpl
from corerl.registry import Registration


def plugin_from(**registrations: Sequence[Registration]) -> object:
    """A plugin object whose registration hooks register exactly what is given, by registry
    name (:data:`corerl.component_kinds.KINDS`): ``plugin_from(training_backends=[...],
    algorithms=[...])``.

    Register it with ``corerl_host.register(plugin_from(...), name="mine")``.
    """
    hook_of = {kind.registry: kind.hook for kind in KINDS}
    unknown = sorted(set(registrations) - set(hook_of))
    if unknown:
        raise TypeError(f"plugin_from() got {', '.join(unknown)}; it takes {', '.join(hook_of)}")

    def registering(items: Sequence[object]) -> Callable[..., None]:
        def hook(self: object, register: Callable[[object], None]) -> None:
            for item in items:
                register(item)

        return hookimpl(hook)

    hooks = {hook_of[name]: items for name, items in registrations.items()}
    methods = {name: registering(items) for name, items in hooks.items() if items}
    return type("InMemoryPlugin", (), methods)()
