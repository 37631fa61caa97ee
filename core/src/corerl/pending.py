"""Factories for components that are registered but whose engine has not landed yet.

Registering such a component lets recipes name it and ``corerl validate`` select it; asking
it to run raises :class:`~corerl.errors.EngineNotAvailable` with one clear line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from corerl.errors import EngineNotAvailable


def pending_engine(what: str, lands_with: str) -> Callable[..., NoReturn]:
    """A factory that refuses to build ``what`` and says where its engine will come from."""

    def factory(*args: Any, **kwargs: Any) -> NoReturn:
        raise EngineNotAvailable(
            f"{what} is registered but its engine is not implemented yet (it lands with {lands_with})",
            hint="pick another backend, or use `corerl validate` to check the recipe meanwhile",
        )

    factory.__qualname__ = f"pending_engine[{what}]"
    return factory
