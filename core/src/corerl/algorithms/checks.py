"""The support checks of the core's algorithms: config logic only, nothing heavy imported
(validation calls them; ``corerl validate`` stays free of torch)."""

from __future__ import annotations

import logging
from operator import attrgetter
from typing import Any

from corerl.errors import ConfigError

log = logging.getLogger(__name__)


def check_sample_batches(config: Any) -> None:
    """``algorithm.optimizer_batch_size`` must divide a step's samples (GRPO and PPO)."""
    algorithm = config.core.algorithm
    samples = algorithm.batch_size * algorithm.num_generations_per_prompt
    rows = algorithm.optimizer_batch_size
    if rows is not None and samples % rows:
        raise ConfigError(f"must divide the {samples} samples of a step (algorithm.batch_size x "
                          f"num_generations_per_prompt), got {rows}", key="algorithm.optimizer_batch_size",
                          hint="pick a divisor of algorithm.batch_size x algorithm.num_generations_per_prompt")
    if algorithm.advantage_estimator == "gdpo" and (config.core.data.env_name is None or _async_on(config)):
        why = ("the asynchronous loop's rollout buffer keeps each group's rewards, not their parts" if
               config.core.data.env_name is not None else "the reward's named parts come from an environment "
               "(Turn.reward_components), and data.env_name is unset")
        raise ConfigError(f"the gdpo estimator normalises each named part of the reward; {why}",
                          key="algorithm.advantage_estimator",
                          hint="set data.env_name=math_multi_reward (or an environment that names its reward's parts)"
                          if config.core.data.env_name is None else "set algorithm.async.enabled=false, or use grpo")
    if algorithm.dynamic_sampling.enabled:
        if algorithm.name != "grpo":
            raise ConfigError(f"DAPO's dynamic sampling is built into GRPO only, not {algorithm.name!r}",
                              key="algorithm.dynamic_sampling.enabled", hint="set it to false")
        if _async_on(config):
            raise ConfigError("dynamic sampling draws more prompts until a step has enough informative groups, "
                              "which the asynchronous loop's rollout buffer does not do",
                              key="algorithm.dynamic_sampling.enabled",
                              hint="set algorithm.dynamic_sampling.enabled=false or algorithm.async.enabled=false")
    check_policy_loss(algorithm)


def check_policy_loss(algorithm: Any) -> None:
    """The policy-gradient loss's keys (GRPO and PPO): CISPO has no clipped surrogate for dual
    clipping to bound, the maxrl and batch_mean estimators have no leave-one-out baseline, a KL
    folded into the rewards needs REINFORCE++ (GRPO) and a KL penalty, and
    the deprecated ``token_level_loss`` acts with a warning unless it contradicts
    ``loss_aggregation``."""
    loss = algorithm.policy_loss
    if loss != "clipped":
        for key, on in (("use_cispo", algorithm.use_cispo), ("ratio_clip_c", algorithm.ratio_clip_c is not None)):
            if on:
                raise ConfigError(f"is an option of the clipped PPO surrogate, which policy_loss {loss} replaces",
                                  key=f"algorithm.{key}", hint="remove it, or set algorithm.policy_loss=clipped")
        if loss != "sapo" and algorithm.sequence_level_ratios:
            raise ConfigError(f"one ratio per sequence (GSPO) is not built into policy_loss {loss} (clipped and "
                              "sapo take it)", key="algorithm.sequence_level_ratios",
                              hint="set it to false, or use algorithm.policy_loss=clipped")
    if loss == "clip_cov" and algorithm.clip_cov_lb >= algorithm.clip_cov_ub:
        raise ConfigError(f"must be below algorithm.clip_cov_ub ({algorithm.clip_cov_ub}), got "
                          f"{algorithm.clip_cov_lb}", key="algorithm.clip_cov_lb", hint="give a lower bound")
    if algorithm.use_cispo and algorithm.ratio_clip_c is not None:
        raise ConfigError("dual clipping bounds PPO-clip's surrogate, which CISPO replaces (its clipped ratio is a "
                          "detached weight)", key="algorithm.ratio_clip_c", hint="unset it, or set "
                          "algorithm.use_cispo=false")
    if algorithm.advantage_estimator in ("maxrl", "batch_mean") and algorithm.leave_one_out_baseline:
        raise ConfigError(f"is a baseline of the grpo estimator, and advantage_estimator {algorithm.advantage_estimator} "
                          "has its own", key="algorithm.leave_one_out_baseline",
                          hint="remove it, or set algorithm.advantage_estimator=grpo")
    if algorithm.advantage_estimator == "gdpo" and algorithm.use_kl_in_reward:
        raise ConfigError("takes the KL from each sample's reward, and the gdpo estimator reads the reward's named "
                          "parts instead of the reward", key="algorithm.use_kl_in_reward",
                          hint="remove it (the KL stays a loss term, algorithm.kl_penalty), or use another estimator")
    if algorithm.use_kl_in_reward:
        if not algorithm.kl_penalty:
            raise ConfigError("takes kl_penalty x the KL estimate from each token's reward, and kl_penalty is 0",
                              key="algorithm.use_kl_in_reward", hint="set algorithm.kl_penalty > 0, or remove it")
    if algorithm.token_level_loss is not None:
        said = "token_mean" if algorithm.token_level_loss else "sequence_mean"
        if algorithm.loss_aggregation not in ("token_mean", said):
            raise ConfigError(f"is the deprecated spelling of loss_aggregation={said}, and loss_aggregation says "
                              f"{algorithm.loss_aggregation}", key="algorithm.token_level_loss",
                              hint="remove algorithm.token_level_loss")
        log.warning("algorithm.token_level_loss is deprecated: it acts as algorithm.loss_aggregation=%s; write that "
                    "instead", said)


#: the ``algorithm`` keys that act on a sampled rollout or on its policy-gradient loss (GRPO and PPO read them)
ROLLOUT_SHAPING_KEYS = ("reward_scaling.enabled", "overlong_penalty.enabled", "dynamic_sampling.enabled",
                        "overlong_filtering", "use_cispo", "use_kl_in_reward")


def check_nothing_sampled(config: Any) -> None:
    """SFT's and DPO's check: refuse, in one line, a rollout-shaping key switched on (they sample
    nothing, so it would be dropped silently)."""
    algorithm = config.core.algorithm
    algorithm_id = algorithm.name
    if algorithm_id not in ("sft", "dpo", "rm"):  # SFT as another algorithm's warm start: that one samples
        return
    for key in ROLLOUT_SHAPING_KEYS:
        if attrgetter(key)(algorithm):
            raise ConfigError(f"acts on sampled rollouts or their policy-gradient loss, and {algorithm_id} samples "
                              "none", key=f"algorithm.{key}", hint="remove it, or use grpo or ppo")
    check_clipped_loss(algorithm, algorithm_id)


def check_clipped_loss(algorithm: Any, algorithm_id: str) -> None:
    """An algorithm without GRPO's and PPO's policy-gradient loss refuses another ``policy_loss``."""
    if algorithm.policy_loss != "clipped":
        raise ConfigError(f"replaces GRPO's and PPO's policy-gradient surrogate, which {algorithm_id} does not train "
                          "with", key="algorithm.policy_loss", hint="remove it, or use grpo or ppo")


def _async_on(config: Any) -> bool:
    from corerl.asynchronous.settings import async_settings

    return bool(async_settings(config).enabled)
