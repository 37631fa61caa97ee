"""NeMo RL's algorithm sections in corerl's configuration: ``grpo`` (and ``async_rl``), ``sft``,
``dpo``, ``loss_fn``, ``distillation`` and its ``teacher``, ``ppo`` and its critic (``value``,
``value_loss_fn``), ``rm``; NeMo RL's sections of algorithms corerl does not have are refused."""

from __future__ import annotations

from typing import Any

from corerl.config.dialects.rules import (
    _OFF,
    _PERF,
    DERIVED,
    Rule,
    _above,
    _not,
    _truthy,
    acts,
    derived,
    inert,
    inert_with_warning,
    refused,
)

_FLEET = ("NeMo RL's generation-fleet resiliency (retries per prompt, watchdogs, shard health, a router); corerl "
          "restarts its generation worker and requeues its prompts, up to algorithm.async.max_generation_failures")


def _estimator(name: Any) -> str:
    """NeMo RL's GRPO advantage estimator as corerl's ``algorithm.advantage_estimator`` (``opd``, on-policy
    distillation, is another algorithm: :mod:`corerl.config.dialects.nemo_rl_opd`)."""
    if name not in ("grpo", "gdpo", "reinforce_plus_plus"):
        raise ValueError(f"the {name!r} advantage estimator is not built into corerl yet (grpo, gdpo, "
                         "reinforce_plus_plus and opd are)")
    return str(name)


def _aggregation(token_level: Any) -> str:
    """NeMo RL's ``loss_fn.token_level_loss`` as corerl's ``algorithm.loss_aggregation``."""
    return "token_mean" if token_level else "sequence_mean"


def _step_count(value: Any) -> int | None:
    """NeMo RL's ``max_num_steps``, where -1 means "until max_num_epochs epochs are done" (corerl's
    ``algorithm.max_steps`` unset: ``algorithm.max_epochs`` decides)."""
    if value == -1:
        return None
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{value} is not a step count: give one above 0, or -1 to train max_num_epochs epochs")
    return value


EPOCHS = "algorithm.max_epochs"


# NeMo RL key (or prefix.*) -> what corerl does with it
RULES: dict[str, Rule] = {
    # -- grpo --
    "grpo.num_prompts_per_step": acts("algorithm.batch_size"),
    "grpo.num_generations_per_prompt": acts("algorithm.num_generations_per_prompt"),
    "grpo.max_num_steps": acts("algorithm.max_steps", _step_count),
    "grpo.seed": acts("algorithm.seed"),
    "grpo.normalize_rewards": acts("algorithm.scale_rewards_by_std"),
    "grpo.use_leave_one_out_baseline": acts("algorithm.leave_one_out_baseline"),
    "grpo.max_val_samples": acts("data.held_out_size"),
    "grpo.max_num_epochs": acts(EPOCHS),
    "grpo.max_rollout_turns": acts("algorithm.max_rollout_turns"),
    "grpo.val_period": derived("above 0: eval.every_n_steps (greedy, mean@n and pass@n on the held-out prompts); 0 "
                               "or -1: no evaluation during training, the held-out reward before and after it"),
    "grpo.val_at_start": derived("with evaluation during training: eval.at_start"),
    "grpo.val_batch_size": inert("the held-out rows are generated in one batch"),
    "grpo.overlong_filtering": acts("algorithm.overlong_filtering"),
    "grpo.val_at_end": inert("corerl evaluates after the last step whenever eval.every_n_steps is set, and reports "
                             "the held-out reward after training in any case"),
    "grpo.use_dynamic_sampling": acts("algorithm.dynamic_sampling.enabled"),
    "grpo.batch_multiplier": acts("algorithm.dynamic_sampling.batch_multiplier"),
    "grpo.dynamic_sampling_max_gen_batches": acts("algorithm.dynamic_sampling.max_generation_batches"),
    "grpo.async_grpo": inert("null: asynchronous GRPO's section is off (an async_rl section, where given, decides)"),
    "grpo.async_grpo.enabled": acts("algorithm.async.enabled"),
    "grpo.async_grpo.max_trajectory_age_steps": acts("algorithm.async.max_staleness"),
    "grpo.async_grpo.max_generation_failures": acts("algorithm.async.max_generation_failures"),
    "grpo.async_grpo.in_flight_weight_updates": DERIVED,
    "grpo.async_grpo.recompute_kv_cache_after_weight_updates": DERIVED,
    # -- async_rl (NeMo RL's single-controller asynchronous loop) --
    "async_rl.sampler.name": acts("algorithm.async.sampler"),
    "async_rl.sampler.max_staleness_versions": acts("algorithm.async.max_staleness"),
    "async_rl.sampler.max_lookahead_versions": acts("algorithm.async.max_staleness"),
    "async_rl.recompute_kv_cache_after_weight_updates": DERIVED,
    "async_rl.max_inflight_prompts": acts("algorithm.async.max_inflight_prompts"),
    "async_rl.max_buffered_rollouts": acts("algorithm.async.max_buffered_rollouts"),
    "async_rl.min_groups_for_streaming_train": inert("a corerl step trains on algorithm.batch_size groups "
                                                     "(grpo.num_prompts_per_step) and waits for them"),
    "async_rl.diagnostics": inert("corerl logs each step's rollout metrics; CORERL_DEBUG=1 logs more"),
    "async_rl.rollout_failure.*": inert(_FLEET),
    "async_rl.stall_watchdog.*": inert(_FLEET),
    "async_rl.generation_fleet_health.*": inert(_FLEET),
    "async_rl.generation_router.*": inert(_FLEET),
    # -- sft --
    "sft.max_num_steps": acts("algorithm.max_steps", _step_count),
    "sft.seed": acts("algorithm.seed"),
    "sft.max_num_epochs": acts(EPOCHS),
    "sft.val_period": inert("corerl evaluates the held-out rows before and after training"),
    "sft.val_batches": inert("the held-out rows are evaluated in one batch"),
    "sft.val_global_batch_size": inert("the held-out rows are evaluated in one batch"),
    "sft.val_micro_batch_size": inert("the held-out rows are evaluated in one batch"),
    "sft.val_at_start": inert("corerl always evaluates before training"),
    "sft.val_at_end": inert("corerl always evaluates after training"),
    # -- dpo --
    "dpo.max_num_steps": acts("algorithm.max_steps", _step_count),
    "dpo.seed": acts("algorithm.seed"),
    "dpo.reference_policy_kl_penalty": acts("algorithm.dpo.beta"),
    "dpo.preference_loss_weight": acts("algorithm.dpo.preference_weight"),
    "dpo.sft_loss_weight": acts("algorithm.dpo.sft_weight"),
    "dpo.preference_average_log_probs": acts("algorithm.dpo.preference_average_log_probs"),
    "dpo.sft_average_log_probs": acts("algorithm.dpo.sft_average_log_probs"),
    "dpo.max_num_epochs": acts(EPOCHS),
    "dpo.val_period": inert("corerl scores the held-out pairs before and after training"),
    "dpo.val_batches": inert("every held-out pair is scored"),
    "dpo.val_global_batch_size": inert("every held-out pair is scored"),
    "dpo.val_micro_batch_size": inert("the held-out pairs are scored in the logprob micro-batches"),
    "dpo.val_at_start": inert("corerl always scores the held-out pairs before training"),
    "dpo.val_at_end": inert("corerl always scores the held-out pairs after training"),
    # -- loss_fn --
    "loss_fn.reference_policy_kl_penalty": acts("algorithm.kl_penalty"),
    "loss_fn.ratio_clip_min": acts("algorithm.ratio_clip_min"),
    "loss_fn.ratio_clip_max": acts("algorithm.ratio_clip_max"),
    "loss_fn.ratio_clip_c": acts("algorithm.ratio_clip_c"),
    "loss_fn.use_on_policy_kl_approximation": acts("algorithm.on_policy_kl_approximation"),
    "loss_fn.use_importance_sampling_correction": acts("algorithm.importance_sampling_correction"),
    "loss_fn.truncated_importance_sampling_ratio": acts("algorithm.importance_weight_cap"),
    "loss_fn.truncated_importance_sampling_ratio_min": acts("algorithm.importance_weight_min"),
    "loss_fn.truncated_importance_sampling_type": acts("algorithm.importance_sampling_type",
                                                       lambda value: "tis" if value is None else value),
    "loss_fn.sequence_level_importance_ratios": acts("algorithm.sequence_level_ratios"),
    "loss_fn.token_level_loss": acts("algorithm.loss_aggregation", _aggregation),
    "loss_fn.reference_policy_kl_type": acts("algorithm.kl_type"),
    "loss_fn.kl_input_clamp_value": acts("algorithm.kl_input_clamp"),
    "loss_fn.kl_output_clamp_value": acts("algorithm.kl_output_clamp"),
    # -- NeMo RL main (HEAD) keys: validation, the advantage estimator, engines' serving and tuning --------
    "grpo.val_start_at": inert_with_warning("corerl's periodic evaluation starts at step eval.every_n_steps: the "
                                            "evaluations before this step are run too", _above(0)),
    "grpo.val_num_generations_per_prompt": derived("with evaluation during training: eval.num_samples (unset: 1, "
                                                   "NeMo RL's default)"),
    "grpo.stop_at_validation_metric": inert(_OFF, _truthy),
    "grpo.stop_at_validation_threshold": inert(_OFF, lambda value: value is not None),
    "grpo.seq_logprob_error_threshold": acts("algorithm.seq_logprob_error_threshold"),
    "grpo.invalid_tool_call_advantage": inert(_OFF, lambda value: value is not None),
    "grpo.malformed_thinking_advantage": inert(_OFF, lambda value: value is not None),
    "grpo.advantage_clip_low": acts("algorithm.advantage_clip_low"),
    "grpo.advantage_clip_high": acts("algorithm.advantage_clip_high"),
    "grpo.adv_estimator.name": DERIVED,  # corerl.config.dialects.nemo_rl_opd: opd is on-policy distillation
    "grpo.adv_estimator.normalize_rewards": acts("algorithm.scale_rewards_by_std"),
    "grpo.adv_estimator.use_leave_one_out_baseline": acts("algorithm.leave_one_out_baseline"),
    "grpo.adv_estimator.minus_baseline": acts("algorithm.minus_baseline"),
    "loss_fn.use_kl_in_reward": acts("algorithm.use_kl_in_reward"),
    "loss_fn.use_cispo": acts("algorithm.use_cispo"),
    "loss_fn.disable_ppo_ratio": DERIVED,  # true: with opd only (corerl.config.dialects.nemo_rl_opd)
    "loss_fn.positive_example_nll_weight": inert(_OFF, _truthy),
    "loss_fn.force_on_policy_ratio": DERIVED,
    "reward_penalties.*": inert(_OFF, _truthy),
    "sft.only_unmask_final": inert(_OFF, _truthy),
    "grpo.skip_reference_policy_logprobs_calculation": inert("corerl scores the reference only where the KL penalty "
                                                             "needs it (algorithm.kl_penalty > 0)"),
    "grpo.penalize_invalid_tool_call": inert(_OFF, _truthy),
    "grpo.penalize_malformed_thinking": inert(_OFF, _truthy),
    "grpo.invalid_tool_call_strategy": inert("used only with grpo.penalize_invalid_tool_call"),
    "grpo.calculate_advantages_on_gpu": inert(_PERF),
    "grpo.adv_estimator.reward_weights": inert("null: the gdpo estimator sums the reward's parts with equal "
                                               "weights; other weights are not built into corerl yet", _truthy),
    "grpo.reward_shaping.enabled": acts("algorithm.overlong_penalty.enabled"),
    "grpo.reward_shaping.overlong_buffer_length": acts("algorithm.overlong_penalty.buffer_length"),
    "grpo.reward_shaping.overlong_buffer_penalty": acts("algorithm.overlong_penalty.penalty"),
    "grpo.reward_shaping.max_response_length": acts("algorithm.overlong_penalty.max_response_length"),
    "grpo.reward_shaping.stop_properly_penalty_coef": acts("algorithm.overlong_penalty.truncated_reward_factor"),
    "grpo.reward_shaping.*": refused("a DAPO reward-shaping option corerl does not have"),
    **{f"grpo.reward_scaling.{key}": acts(f"algorithm.reward_scaling.{key}")
       for key in ("enabled", "source_min", "source_max", "target_min", "target_max")},
    "grpo.reward_scaling.*": refused("a reward-scaling option corerl does not have"),
    # -- distillation (NeMo RL's distillation: and teacher: sections) --
    "loss_fn.kl_type": acts("algorithm.distillation.kl_type", note="reverse on the student's sampled tokens; "
                            "forward and mixed over the teacher's top-k next tokens"),
    "loss_fn.mixed_kl_weight": acts("algorithm.distillation.mixed_kl_weight"),
    "loss_fn.zero_outside_topk": acts("algorithm.distillation.zero_outside_topk", note="true renormalises the "
                                      "teacher over its top-k"),
    "distillation.topk_logits_k": acts("algorithm.distillation.topk_logits_k"),
    "teacher.model_name": acts("algorithm.distillation.teacher_model"),
    "teacher.logprob_batch_size": acts("algorithm.distillation.teacher_micro_batch_size"),
    "teacher.*": derived("the teacher is frozen and only scores: its training and generation settings are inert; "
                         "a layout, precision or other setting of its own goes to "
                         "algorithm.distillation.teacher_overrides where the policy's key acts (else refused in one "
                         "line); tokenizer.name must be the teacher's own"),
    **{f"loss_fn.{key}": refused("a loss option of NeMo RL's cross-tokenizer (off-policy) distillation, which corerl "
                                 "does not have")
       for key in ("gold_loss", "xtoken_loss", "temperature",
                   "vocab_topk", "uncommon_topk", "reverse_kl", "exact_token_match_only", "kl_loss_weight",
                   "ce_loss_scale", "dynamic_loss_scaling", "kd_loss_mode", "sum_weights_metric", "alpha",
                   "normalize_teacher_by_vocab")},
    # -- ppo (its other keys are grpo's: rule_for reads grpo.<key>'s rule for ppo.<key>) --
    "ppo.ppo_epochs": acts("algorithm.optimization_passes"),
    "ppo.policy_training_start_step": acts("algorithm.ppo.critic_warmup_steps"),
    "ppo.adv_estimator.name": inert("PPO's advantages are GAE's over the critic's values", _not("gae")),
    "ppo.adv_estimator.gae_lambda": DERIVED,
    "ppo.adv_estimator.gae_lambda_policy": DERIVED,
    "ppo.adv_estimator.gae_lambda_value": acts("algorithm.ppo.value_lam"),
    "ppo.adv_estimator.gae_gamma": acts("algorithm.ppo.gamma"),
    "ppo.adv_estimator.normalize_advantages": acts("algorithm.ppo.whiten_advantages"),
    "ppo.adv_estimator.length_adaptive_alpha": inert("VAPO's length-adaptive lambda is not built into corerl yet; "
                                                     "only 0 is accepted", _truthy),
    "ppo.async_ppo": inert("null: asynchronous PPO's section is off"),
    "ppo.async_ppo.*": inert("used only by asynchronous PPO (ppo.async_ppo.enabled=true is refused)"),
    "value_loss_fn.scale": acts("critic.loss_scale"),
    "value_loss_fn.cliprange": acts("critic.value_clip"),
    # -- value: the critic (its engine sections' and optimizer keys take the policy's rules, on critic.*) --
    "value.model_name": DERIVED,
    "value.tokenizer.*": inert("the critic reads the policy's tokens"),
    "value.hf_config_overrides": inert("the critic starts from the policy's checkpoint (policy.hf_config_overrides "
                                       "applies to both)", _truthy),
    "value.train_global_batch_size": DERIVED,
    "value.max_total_sequence_length": DERIVED,
    "value.precision": DERIVED,
    "value.train_micro_batch_size": acts("critic.train_micro_batch_size"),
    "value.logprob_batch_size": acts("critic.value_micro_batch_size"),
    "value.max_grad_norm": acts("critic.max_grad_norm"),
    "value.make_sequence_length_divisible_by": inert("corerl pads rows as its tensor-parallel plan needs"),
    "value.reward_model_cfg.*": inert("NeMo RL's value worker is a one-output regression head on the policy's model; "
                                      "corerl's critic is the same (a one-label token classifier)"),
    "value.dynamic_batching.*": inert("the critic's micro-batches follow the policy's (policy.dynamic_batching)"),
    "value.sequence_packing.*": inert("the critic packs rows as the policy does (policy.sequence_packing)"),
    "value.scheduler": DERIVED,
    "value.scheduler.*": DERIVED,
    "grpo.deduplicate_multimodal_data": inert("NeMo RL's sharing of a prompt's images among its group's rows in the "
                                              "payloads its Ray workers exchange: transport and memory only, the "
                                              "same samples and loss (corerl's rows carry their prompt's images)"),
    "grpo.zero_variance_prompt_filtering": inert(_OFF, _truthy),
    "grpo.debug_payload_metrics": inert("NeMo RL's debug telemetry of its Ray payload sizes: metrics only, the same "
                                        "samples and loss"),
    "grpo.num_val_generations_per_prompt": derived("an older spelling of grpo.val_num_generations_per_prompt"),
    # sections of algorithms corerl does not have: every key refused with the feature it needs
    "teachers": refused("several teachers (NeMo RL's cross-tokenizer off-policy distillation) are not built into "
                        "corerl yet"),
    "on_policy_distillation": inert("null: no on-policy distillation", _truthy),
    # the opd estimator's section (corerl.config.dialects.nemo_rl_opd); its other keys are refused
    **{f"on_policy_distillation.{key}": DERIVED
       for key in ("enabled", "teacher_model_by_agent_name.*", "default_teacher_alias", "strict_agent_name_match",
                   "deduplicate_shared_teacher_checkpoints", "use_orm_advantage", "orm_advantage_weight")},
    "on_policy_distillation.non_colocated_teachers.*": inert("the layout of teachers on GPUs of their own, whose "
                                                             "enabled is refused"),
    "on_policy_distillation.*": refused("an on-policy distillation option corerl does not have"),
    # -- rm: a Bradley-Terry reward model (its other keys are dpo's: rule_for reads dpo.<key>'s rule for rm.<key>) --
}

# sections whose keys are all inert while their ``enabled`` is false (``enabled`` itself acts)
SWITCHED_SECTIONS = {
    "on_policy_distillation": False, "on_policy_distillation.non_colocated_teachers": False,
    "grpo.reward_scaling": False, "grpo.reward_shaping": False, "grpo.async_grpo": True, "ppo.reward_scaling": False,
    "ppo.reward_shaping": False, "ppo.async_ppo": False,
}
# on in these sections is refused: corerl has no such feature
UNSUPPORTED_SECTIONS = {
    "on_policy_distillation.non_colocated_teachers": (
        "NeMo RL's teachers on GPUs of their own are not translated: give the teacher its layout and ranks with "
        "algorithm.distillation.teacher_overrides"),
    "ppo.async_ppo": "asynchronous PPO is not built into corerl yet (asynchronous GRPO is: grpo.async_grpo)",
}
