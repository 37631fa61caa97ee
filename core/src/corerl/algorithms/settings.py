"""The config sections the core's algorithms own (``algorithm.dpo``, ``algorithm.ppo``), declared
by their registrations (:mod:`corerl.builtin_plugin`) as any plugin's algorithm declares its own.
Light: validation imports them without torch."""

from __future__ import annotations

from operator import attrgetter
from typing import Any, Literal

import attrs

from corerl.config.fields import setting


@attrs.define(kw_only=True)
class DPOConfig:
    """``algorithm.dpo``: the preference loss (NeMo RL's ``dpo`` section maps here)."""

    beta: float = setting(0.1, min=0.0, min_exclusive=True,
                          help="strength of the pull towards the reference (NeMo RL: reference_policy_kl_penalty)")
    loss_type: Literal["sigmoid", "ipo"] = setting("sigmoid", help="sigmoid: DPO's logistic loss; ipo: IPO's squared loss")
    label_smoothing: float = setting(0.0, min=0.0, help="sigmoid loss: the assumed share of flipped preference labels")
    preference_weight: float = setting(1.0, min=0.0, help="weight of the preference term")
    sft_weight: float = setting(0.0, min=0.0, help="weight of an NLL term on the chosen response")
    preference_average_log_probs: bool = setting(False, help="per-token mean instead of summed logprobs in the "
                                                             "preference term")
    sft_average_log_probs: bool = setting(True, help="per-token mean NLL in the SFT term")
    precompute_reference_logprobs: bool = setting(
        True, help="score every pair with the starting weights once before training (no second model); false: a "
                   "frozen copy scores each batch (policy.reference.cpu_offload keeps it off the accelerator)")


@attrs.define(kw_only=True)
class PPOConfig:
    """``algorithm.ppo``: PPO's advantage estimation (the policy's clipped loss reads the
    ``algorithm`` keys GRPO uses; the critic is the ``critic`` section)."""

    gamma: float = setting(1.0, min=0.0, max=1.0, help="discount per response token")
    lam: float = setting(0.95, min=0.0, max=1.0, help="GAE's lambda: 0 one-step TD, 1 Monte Carlo returns")
    value_lam: float | None = setting(None, min=0.0, max=1.0, help="GAE's lambda for the critic's targets (VAPO's "
                                                                   "decoupled GAE); unset: lam")
    whiten_advantages: bool = setting(True, help="centre and scale the step's advantages over its response tokens")
    critic_warmup_steps: int = setting(0, min=0, help="steps that train only the critic before the policy moves")


@attrs.define(kw_only=True)
class DistillationConfig:
    """``algorithm.distillation``: on-policy distillation. The student (``policy``) samples; a
    frozen teacher scores the student's own tokens; the loss is the per-token reverse KL from the
    teacher to the student on those samples (NeMo RL's ``teacher`` and ``loss_fn.kl_type`` map here)."""

    teacher_model: str | None = setting(None, model=True, help="the teacher: a Hugging Face checkpoint folder (or "
                                                               "builtin:...) with the student's tokenizer; required")
    teacher_training_backend: str | None = setting(None, help="the training backend that hosts the frozen teacher; "
                                                              "unset: the policy's, with its layout")
    teacher_overrides: dict[str, Any] | None = setting(
        None, help="policy and cluster keys the teacher runs with instead of the policy's: its own layout (e.g. "
                   "{policy: {<backend>_cfg: {tensor_parallel_size: 2}}}) and, with cluster keys, ranks of its own "
                   "in a placement pool apart from the policy's; unset: the policy's layout, on its devices")
    teacher_cpu_offload: bool = setting(False, help="keep the teacher's weights in CPU memory except while it scores")
    teacher_micro_batch_size: int | None = setting(None, min=1, help="rows per teacher forward; unset: "
                                                                     "policy.logprob_micro_batch_size")
    kl_type: Literal["reverse", "forward", "mixed"] = setting(
        "reverse", help="reverse: KL(student || teacher) on the student's sampled tokens; forward: KL(teacher || "
                        "student) over the teacher's topk_logits_k most likely tokens at each position; mixed: "
                        "mixed_kl_weight x forward + the rest x reverse")
    mixed_kl_weight: float = setting(0.5, min=0.0, max=1.0, help="kl_type mixed: the forward KL's weight")
    topk_logits_k: int = setting(64, min=1, help="kl_type forward or mixed: how many of the teacher's most likely "
                                                 "next tokens the forward KL sums over")
    zero_outside_topk: bool = setting(False, help="kl_type forward or mixed: renormalise the teacher over its top-k "
                                                  "(false: its own probabilities, the rest of the vocabulary left out)")
    outcome_advantage_weight: float = setting(
        0.0, min=0.0, help="adds this times each sample's GRPO advantage of the task's reward (its group's mean "
                           "taken away, scaled by algorithm.scale_rewards_by_std) to its tokens' advantages, beside "
                           "the teacher's (NeMo RL's OPD with use_orm_advantage); 0: the teacher is the only signal")


def check_distillation(config: Any) -> None:
    """Distillation's support check: a teacher is named (whether its folder is here is the run
    inputs' check, :mod:`corerl.run.inputs`, as for the policy's); the teacher's own keys
    validate; the reward-shaping keys, which act on rewards distillation does not train on, are
    off; mini-batches divide the step."""
    from corerl.algorithms.checks import (
        ROLLOUT_SHAPING_KEYS,
        check_clipped_loss,
        check_sample_batches,
    )
    from corerl.errors import ConfigError

    key = "algorithm.distillation.teacher_model"
    teacher = config.section("algorithm.distillation").teacher_model
    if teacher is None:
        raise ConfigError("on-policy distillation needs a teacher", key=key,
                          hint="name a Hugging Face checkpoint folder with the student's tokenizer (e.g. a run's final/)")
    from corerl.config.own_layout import with_own_layout

    with_own_layout(config, config.section("algorithm.distillation").teacher_overrides,
                    "algorithm.distillation.teacher_overrides", "teacher")  # the teacher's own keys validate
    if config.core.reward_model.kind is not None:
        raise ConfigError("distillation trains on the teacher's logprobs, not on a reward model's scores",
                          key="reward_model.kind", hint="unset reward_model.kind")
    algorithm = config.core.algorithm
    for name in ROLLOUT_SHAPING_KEYS:
        path = name.removesuffix(".enabled")
        if attrgetter(name)(algorithm):
            raise ConfigError("distillation trains on the teacher's logprobs, not on rewards, so reward shaping "
                              "would do nothing", key=f"algorithm.{name}", hint=f"unset algorithm.{path}")
    settings = config.section("algorithm.distillation")
    if settings.outcome_advantage_weight and settings.kl_type == "forward":
        raise ConfigError("the forward KL reads the teacher's top-k, not advantages, so an outcome advantage would "
                          "do nothing", key="algorithm.distillation.outcome_advantage_weight",
                          hint="set kl_type reverse or mixed, or the weight to 0")
    check_clipped_loss(algorithm, "distillation")
    check_sample_batches(config)
