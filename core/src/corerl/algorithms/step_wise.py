"""The support check of step-wise trajectories (``algorithm.step_wise_trajectories``): config
logic only, nothing heavy imported (validation can call it; ``corerl validate`` stays free of
torch). The rows are built by the environment rollout (:func:`corerl.environments.rollout.step_wise`)
and expanded for training by :func:`corerl.algorithms.batches.step_rows`."""

from __future__ import annotations

from typing import Any

from corerl.errors import ConfigError

KEY = "algorithm.step_wise_trajectories"


def check_step_wise(config: Any) -> None:
    """Refuse, in one line, step-wise trajectories where they would not act: an algorithm other
    than GRPO (whose loss is the only one that expands episodes into rows), and a KL taken from
    each sample's reward (``use_kl_in_reward`` sums a sequence's KL, and an episode's turns are
    rows of their own)."""
    algorithm = config.core.algorithm
    if not algorithm.step_wise_trajectories:
        return
    if algorithm.name != "grpo":
        raise ConfigError(f"step-wise trajectories are built into GRPO only, not {algorithm.name!r}", key=KEY,
                          hint="set it to false, or use algorithm.name=grpo")
    if algorithm.use_kl_in_reward:
        raise ConfigError("takes each sequence's KL from its reward, and step-wise trajectories train an episode's "
                          "turns as rows of their own", key="algorithm.use_kl_in_reward",
                          hint="remove it (algorithm.kl_penalty in the loss works step-wise), or set "
                               f"{KEY}=false")


def check_step_wise_chosen(config: Any, chosen: Any) -> None:
    """The validation table's row (:mod:`corerl.config.validation`): :func:`check_step_wise`,
    once the algorithm is chosen, whichever it is."""
    check_step_wise(config)
