"""Registers the ``example_reinforce`` algorithm. Keep this module light: no torch here."""

from __future__ import annotations

from collections.abc import Callable

from corerl.sdk import Algorithm, PlotSpec, hookimpl
from corerl_example_algorithm.config import ExampleReinforceConfig


@hookimpl
def corerl_register_algorithms(register: Callable[[Algorithm], None]) -> None:
    register(
        Algorithm(
            id="example_reinforce",
            factory="corerl_example_algorithm.algorithm:ExampleReinforce",
            config_section="algorithm.example_reinforce",
            config_schema=ExampleReinforceConfig,
            check_supported="corerl_example_algorithm.config:check_supported",
            environments=True,  # its rollout is RunServices.training_rollout(): data.env_name works
            plot=PlotSpec(metrics=("reward/mean", "baseline"), title="reward and baseline"),
            description="REINFORCE with a running-mean or group-mean baseline (template)",
        )
    )


#: the plugin contract this plugin was written against (docs/plugins.md, "Contract changelog")
corerl_contract = "2.18"
