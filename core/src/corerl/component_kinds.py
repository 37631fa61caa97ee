"""Every kind of component a plugin registers, read from the hook specs, and the plugin contract's
names that both public faces export.

A kind is a registration class (its facts: ``hook``, ``registry_name``, ``kind``, ``label``; see
:mod:`corerl.registry`) with a hook spec whose ``register`` parameter takes it
(:mod:`corerl.hookspecs`). Nothing here lists the kinds: :func:`kinds_in` finds them in a module
of hook specs, so a new kind is two edits, its class and its hook spec.

``__all__`` is the one list of what a plugin registers with: :data:`corerl.hookimpl`,
:data:`corerl.sdk.CONTRACT_VERSION` and the registration classes (``corerl.registry.__all__``).
``corerl`` and ``corerl.sdk`` both export it.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

import attrs

from corerl import hookspecs, registry
from corerl.hookspecs import CONTRACT_VERSION, PROJECT_NAME, hookimpl
from corerl.registry import *  # noqa: F403  (the registration classes, re-exported)
from corerl.registry import Registration

REGISTRATION_HOOK_PREFIX = f"{PROJECT_NAME}_register_"

__all__ = ["hookimpl", "CONTRACT_VERSION"]
__all__ += registry.__all__


@attrs.frozen
class ComponentKind:
    """One kind of registered component, as its registration class describes it."""

    hook: str
    registry: str
    registration: type[Registration]
    label: str

    @classmethod
    def of(cls, registration: type[Registration]) -> ComponentKind:
        """The kind ``registration`` (a registration class) carries."""
        return cls(registration.hook, registration.registry_name, registration, registration.label)


def registration_class(spec: Callable[..., Any]) -> type[Registration] | None:
    """The registration class a hook spec's ``register`` callback takes (``register:
    Callable[[TrainingBackend], None]``), or None for a hook spec without a ``register`` parameter."""
    if "register" not in inspect.signature(spec).parameters:
        return None
    hint = typing.get_type_hints(spec).get("register")
    args = typing.get_args(hint) if hint is not None else ()
    taken = args[0] if len(args) == 2 and isinstance(args[0], list) and len(args[0]) == 1 else None
    cls = taken[0] if taken else None
    if not (isinstance(cls, type) and issubclass(cls, Registration)):
        raise TypeError(f"hook spec {spec.__name__}: annotate register as Callable[[<a Registration class>], None], "
                        f"not {hint!r}")
    return cls


def kinds_in(specs: object) -> tuple[ComponentKind, ...]:
    """The kinds whose hook specs ``specs`` (a module or class of hook specs) holds, in the order
    it defines them; raises ``TypeError`` where a hook spec and its registration class disagree."""
    kinds = []
    for name, spec in vars(specs).items():
        if not (callable(spec) and hasattr(spec, f"{PROJECT_NAME}_spec")):
            continue
        cls = registration_class(spec)
        if cls is None:
            if name.startswith(REGISTRATION_HOOK_PREFIX):
                raise TypeError(f"hook spec {name} takes no register callback; a registration hook takes "
                                "register: Callable[[<a Registration class>], None]")
            continue
        if cls.hook != name or not cls.registry_name or not cls.label:
            raise TypeError(f"hook spec {name} registers {cls.__name__}, whose facts say hook={cls.hook!r}, "
                            f"registry_name={cls.registry_name!r}, label={cls.label!r}: set all three on the class, "
                            f"hook={name!r}")
        kinds.append(ComponentKind.of(cls))
    return tuple(kinds)


#: the core's kinds, in the order of :mod:`corerl.hookspecs`
KINDS: tuple[ComponentKind, ...] = kinds_in(hookspecs)
