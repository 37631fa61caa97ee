"""Running a validated recipe: build the selected components, then the algorithm.

The algorithms (GRPO, SFT) land with their own issue; until then a run builds the selected
training and generation backends (so an engine that cannot start says so) and stops with one line.
"""

from __future__ import annotations

from corerl.config import Config
from corerl.errors import EngineNotAvailable
from corerl.plugin_manager import PluginHost
from corerl.selection import Selection


def run_recipe(config: Config, selection: Selection, host: PluginHost) -> int:
    """Run ``config`` with the selected components; returns the exit status."""
    started = []
    try:
        for choice in (selection.training_backend, selection.generation_backend):
            assert choice.registration is not None
            started.append(choice.registration.create(config=config))
        raise EngineNotAvailable(
            f"algorithm {config.core.algorithm.name!r} is not implemented yet (it lands with the GRPO/SFT issue)",
            hint="`corerl validate` checks a recipe meanwhile",
        )
    finally:
        for backend in reversed(started):
            backend.shutdown()
