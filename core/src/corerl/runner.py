"""Running a validated recipe: build the selected components, then the algorithm.

The algorithms (GRPO, SFT) land with their own issue; until then a run builds the selected
training backend (so a backend whose engine is missing says so) and stops with one line.
"""

from __future__ import annotations

from corerl.config import Config
from corerl.errors import EngineNotAvailable
from corerl.plugin_manager import PluginHost
from corerl.selection import Selection


def run_recipe(config: Config, selection: Selection, host: PluginHost) -> int:
    """Run ``config`` with the selected components; returns the exit status."""
    training = selection.training_backend.registration
    assert training is not None
    backend = training.create(config=config)
    try:
        raise EngineNotAvailable(
            f"algorithm {config.core.algorithm.name!r} is not implemented yet (it lands with the GRPO/SFT issue)",
            hint="`corerl validate` checks a recipe meanwhile",
        )
    finally:
        backend.shutdown()
