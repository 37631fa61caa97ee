"""The rules a dialect's table is written in: what one key of another framework's recipe becomes.

:class:`Rule` and :class:`SectionRules` are the plugin contract's (``corerl.sdk`` exports them:
a plugin's :class:`corerl.sdk.DialectSection` returns its section's rules in them); this module
gives the core's tables their short spellings (``acts``, ``inert``, ...), the predicates and
reasons several tables share, and :class:`Translator`, what a section's translation functions
(``SectionRules.before`` and ``derived``) are handed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol

from corerl.errors import ConfigError
from corerl.registry import Rule, SectionRules

__all__ = ["DERIVED", "Rule", "SectionRules", "Translator", "acts", "derived", "inert", "inert_with_warning",
           "refused"]

acts = Rule.acts
inert = Rule.inert
inert_with_warning = Rule.inert_with_warning
refused = Rule.refused
derived = Rule.derived
DERIVED = Rule("derived")  # decided together with other keys, by a translation function

_truthy = Rule.truthy
_not = Rule.other_than
_above = Rule.above
_OFF = Rule.OFF
_PERF = Rule.PERF
_ENV = Rule.ENV
_DEFAULT_ONLY = "corerl behaves as NeMo RL's default value; another value is refused"


class Translator(Protocol):
    """The corerl tree being built from a recipe, as a section's translation functions see it."""

    origins: dict[str, str]  # of the recipe's keys
    tree: dict[str, Any]
    new_origins: dict[str, str]
    fates: list[Any]
    warnings: list[str]
    errors: list[ConfigError]
    #: the recipe is an evaluation recipe (NeMo RL's ``generation`` at the top, no policy)
    eval_recipe: bool
    #: the recipe is a vision-language one
    vision_language: bool

    def value(self, path: str) -> Any:
        """The recipe's value at ``path`` (None where it has none)."""

    def switched_off(self, path: str) -> str | None:
        """The section switched off (``enabled: false``) that ``path`` lies in, or None."""

    def put(self, source: str, target: str, value: Any, detail: str | None = None) -> None:
        """Set corerl's ``target`` from the recipe's ``source`` key (its fate: acts)."""

    def set(self, source: str, target: str, value: Any) -> None:
        """Set corerl's ``target`` on account of ``source``, recording no fate."""

    def inert(self, source: str, reason: str) -> None:
        """``source`` has no effect, for ``reason``."""

    def refate(self, source: str, fate: Literal["acts", "inert"], detail: str) -> None:
        """Replace what was recorded for ``source``."""

    def make_inert(self, source: str, target: str, value: Any, reason: str) -> None:
        """Undo an acting key whose value has no effect in this recipe: ``target`` gets ``value``."""

    def refuse(self, path: str, message: str, hint: str) -> None:
        """Refuse ``path`` (every refusal is reported together)."""


Predicate = Callable[[Any], bool]
