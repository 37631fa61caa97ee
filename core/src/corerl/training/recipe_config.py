"""What a training engine reads of a validated recipe: :class:`RecipeConfig`, the type the
training contracts (:class:`~corerl.training.rank_worker.RankWorker`,
:class:`~corerl.training.microbatching.MicroBatcher`, :mod:`corerl.training.moe_router`) take.

:class:`corerl.config.Config`, which the config layer builds from a recipe, is one; the contracts
name this protocol so that they need nothing from the layer above them that loads recipes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from corerl.config.schema import CorerlConfig
    from corerl.config.tree import Origins


class RecipeConfig(Protocol):
    """A validated recipe as an engine sees it: the core sections, each plugin-owned section by
    key path, where each key came from, the registrations selection resolved, which model the
    engine trains (``policy`` or ``critic``) and which placement pool it reserves."""

    core: CorerlConfig
    sections: dict[str, Any]
    origins: Origins
    components: dict[str, Any]
    role: str
    pool: str

    def section(self, path: str) -> Any | None:
        """The plugin-owned section at ``path`` (a schema instance, or a mapping when its plugin is absent)."""
        ...

    def section_enabled(self, path: str) -> bool:
        """Whether the section at ``path`` says ``enabled: true``."""
        ...
