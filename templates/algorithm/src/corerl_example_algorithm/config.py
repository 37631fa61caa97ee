"""``algorithm.example_reinforce``: the section this algorithm owns, and its support check.

Light: validation imports this module (``corerl validate`` never imports torch)."""

from __future__ import annotations

from typing import Any, Literal

import attrs

from corerl.sdk import ConfigError, setting


@attrs.define(kw_only=True)
class ExampleReinforceConfig:
    """Settings of the example algorithm."""

    baseline: Literal["running_mean", "group_mean"] = setting(
        "running_mean", help="running_mean: an exponential mean of past rewards; group_mean: the mean reward of the "
                             "prompt's own samples (needs algorithm.num_generations_per_prompt >= 2)")
    baseline_momentum: float = setting(0.9, min=0.0, max=1.0, help="running_mean: the weight of the past")


def check_supported(config: Any) -> None:
    """Refuse, in one line, what this algorithm cannot run (``corerl validate`` and ``corerl run``
    both call it, once, before anything is built)."""
    settings = config.section("algorithm.example_reinforce")
    if settings.baseline == "group_mean" and config.core.algorithm.num_generations_per_prompt < 2:
        raise ConfigError("a group-mean baseline needs at least two samples per prompt",
                          key="algorithm.num_generations_per_prompt",
                          hint="set it to 2 or more, or algorithm.example_reinforce.baseline=running_mean")
