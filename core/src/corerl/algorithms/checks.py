"""The support checks of the core's algorithms: config logic only, nothing heavy imported
(validation calls them; ``corerl validate`` stays free of torch)."""

from __future__ import annotations

from operator import attrgetter
from typing import Any

from corerl.errors import ConfigError


def check_sample_batches(config: Any) -> None:
    """``algorithm.optimizer_batch_size`` must divide a step's samples (GRPO and PPO)."""
    algorithm = config.core.algorithm
    samples = algorithm.batch_size * algorithm.num_generations_per_prompt
    rows = algorithm.optimizer_batch_size
    if rows is not None and samples % rows:
        raise ConfigError(f"must divide the {samples} samples of a step (algorithm.batch_size x "
                          f"num_generations_per_prompt), got {rows}", key="algorithm.optimizer_batch_size",
                          hint="pick a divisor of algorithm.batch_size x algorithm.num_generations_per_prompt")
    if algorithm.dynamic_sampling.enabled:
        if algorithm.name != "grpo":
            raise ConfigError(f"DAPO's dynamic sampling is built into GRPO only, not {algorithm.name!r}",
                              key="algorithm.dynamic_sampling.enabled", hint="set it to false")
        if _async_on(config):
            raise ConfigError("dynamic sampling draws more prompts until a step has enough informative groups, "
                              "which the asynchronous loop's rollout buffer does not do",
                              key="algorithm.dynamic_sampling.enabled",
                              hint="set algorithm.dynamic_sampling.enabled=false or algorithm.async.enabled=false")


#: the ``algorithm`` keys that act on a sampled rollout (GRPO and PPO read them)
ROLLOUT_SHAPING_KEYS = ("reward_scaling.enabled", "overlong_penalty.enabled", "dynamic_sampling.enabled",
                        "overlong_filtering")


def check_nothing_sampled(config: Any) -> None:
    """SFT's and DPO's check: refuse, in one line, a rollout-shaping key switched on (they sample
    nothing, so it would be dropped silently)."""
    algorithm = config.core.algorithm
    algorithm_id = algorithm.name
    if algorithm_id not in ("sft", "dpo"):  # SFT as another algorithm's warm start: that one samples
        return
    for key in ROLLOUT_SHAPING_KEYS:
        if attrgetter(key)(algorithm):
            raise ConfigError(f"acts on sampled rollouts, and {algorithm_id} samples none",
                              key=f"algorithm.{key}", hint="remove it, or use grpo or ppo")


def _async_on(config: Any) -> bool:
    from corerl.asynchronous.settings import async_settings

    return bool(async_settings(config).enabled)
