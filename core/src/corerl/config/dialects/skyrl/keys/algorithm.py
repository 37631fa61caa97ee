"""SkyRL's ``trainer.algorithm.*`` (and DAPO's and the TIS example's additions to it) in corerl's
``algorithm`` section. The advantage estimator, the KL switches, the loss reduction and the
policy-loss type are decided together (:mod:`corerl.config.dialects.skyrl.derived`)."""

from __future__ import annotations

from corerl.config.dialects.rules import Rule, _not, _truthy, acts, derived, inert

_A = "trainer.algorithm."
_OFF = "a switch SkyRL leaves off by default; corerl has no such feature, so only false is accepted"
_LOSS_ONLY = "used only by a policy_loss_type corerl does not have (refused with it)"

RULES: dict[str, Rule] = {
    _A + "advantage_estimator": derived("grpo: GRPO; rloo: GRPO with the leave-one-out baseline, rewards not scaled "
                                        "by their spread; reinforce++: algorithm.advantage_estimator "
                                        "reinforce_plus_plus; maxrl: algorithm.advantage_estimator maxrl; gae: "
                                        "PPO with a critic (algorithm.name ppo); simple_baseline with the "
                                        "custom_advantage_estimator example's entry point (which registers it): "
                                        "algorithm.advantage_estimator batch_mean; another estimator is refused"),
    _A + "use_kl_loss": derived("with kl_loss_coef: algorithm.kl_penalty (the KL term in the loss); false: 0"),
    _A + "kl_loss_coef": derived("algorithm.kl_penalty, where use_kl_loss or use_kl_in_reward is on"),
    _A + "use_kl_in_reward": derived("algorithm.use_kl_in_reward, kl_loss_coef its algorithm.kl_penalty (on-policy "
                                     "distillation: its reward, the teacher's KL)"),
    _A + "kl_estimator_type": acts("algorithm.kl_type", lambda v: _kl_type(v), "k1, k2, k3 (abs is refused)"),
    _A + "kl_ctrl.type": inert("corerl's KL-in-reward coefficient is fixed", _not("fixed")),
    _A + "kl_ctrl.kl_target": inert("used only by the adaptive KL controller (refused)"),
    _A + "kl_ctrl.horizon": inert("used only by the adaptive KL controller (refused)"),
    _A + "use_entropy_loss": inert(_OFF + " (an entropy bonus)", _truthy),
    _A + "entropy_loss_coef": inert("used only with use_entropy_loss (refused)"),
    _A + "temperature": inert("corerl scores the logprobs at the sampling temperature "
                              "(generator.sampling_params.temperature)"),
    _A + "advantage_batch_normalize": inert(_OFF + " (whitening GRPO's advantages over the batch)", _truthy),
    _A + "value_head_prefix": inert("corerl's critic is a one-label token classifier with its own head"),
    _A + "policy_loss_type": derived("regular: the clipped PPO loss; dual_clip: with algorithm.ratio_clip_c; "
                                     "gspo: algorithm.sequence_level_ratios; cispo: algorithm.use_cispo; "
                                     "rollout_is, sapo, clip_cov and kl_cov: algorithm.policy_loss; reinforce with "
                                     "the custom_policy_loss example's entry point (which registers it): "
                                     "algorithm.policy_loss reinforce; another loss is refused"),
    _A + "loss_reduction": derived("token_mean (and token_mean_legacy): algorithm.loss_aggregation token_mean; "
                                   "sequence_mean: sequence_mean; seq_mean_token_sum_norm (Dr. GRPO): "
                                   "constant_length over max_seq_len; prompt_mean is refused"),
    _A + "max_seq_len": derived("the length seq_mean_token_sum_norm divides by: algorithm.loss_aggregation_length"),
    _A + "grpo_norm_by_std": acts("algorithm.scale_rewards_by_std"),
    _A + "zero_variance_filter": inert(_OFF + " (masking groups whose rewards all agree)", _truthy),
    _A + "zero_variance_filter_tol": inert("used only with zero_variance_filter (refused)"),
    _A + "lambd": acts("algorithm.ppo.lam"),
    _A + "gamma": acts("algorithm.ppo.gamma"),
    _A + "eps_clip_low": acts("algorithm.ratio_clip_min"),
    _A + "eps_clip_high": acts("algorithm.ratio_clip_max"),
    _A + "clip_ratio_c": derived("with policy_loss_type dual_clip: algorithm.ratio_clip_c (else unused, inert)"),
    _A + "value_clip": acts("critic.value_clip"),
    _A + "use_tis": derived("with tis_imp_ratio_cap: algorithm.importance_sampling_correction and "
                            "algorithm.importance_weight_cap (token-level TIS)"),
    _A + "tis_imp_ratio_cap": derived("with use_tis: algorithm.importance_weight_cap"),
    _A + "off_policy_correction.tis_ratio_type": derived("token: token-level TIS (algorithm.importance_sampling_"
                                                         "correction, importance_weight_cap from "
                                                         "token_tis_ratio_clip_high); sequence: importance_sampling_"
                                                         "type seq-tis, capped at sequence_tis_ratio_clip_high"),
    _A + "off_policy_correction.token_tis_ratio_clip_high": derived("with tis_ratio_type token: "
                                                                    "algorithm.importance_weight_cap"),
    _A + "off_policy_correction.sequence_tis_ratio_clip_high": derived("with tis_ratio_type sequence: "
                                                                       "algorithm.importance_weight_cap"),
    _A + "off_policy_correction.sequence_mask_metric": derived(
        "geometric (without token TIS): algorithm.importance_sampling_type seq-mask, bounded by geo_mask_low "
        "and geo_mask_high; product, or geometric with tis_ratio_type token, is refused"),
    _A + "off_policy_correction.geo_mask_low": derived("with sequence_mask_metric geometric: "
                                                       "algorithm.importance_weight_min"),
    _A + "off_policy_correction.geo_mask_high": derived("with sequence_mask_metric geometric: "
                                                        "algorithm.importance_weight_cap"),
    **{_A + f"off_policy_correction.{key}": inert("used only with sequence_mask_metric product (refused)")
       for key in ("product_mask_high", "product_mask_low")},
    **{_A + f"off_policy_correction.{key}": inert(_OFF + " (masking outlier tokens by their importance ratio)",
                                                  lambda v: v is not None)
       for key in ("outlier_token_is_threshold_low", "outlier_token_is_threshold_high",
                   "token_mask_is_threshold_low", "token_mask_is_threshold_high")},
    _A + "sapo.tau_pos": derived("with policy_loss_type sapo: algorithm.sapo_tau_pos"),
    _A + "sapo.tau_neg": derived("with policy_loss_type sapo: algorithm.sapo_tau_neg"),
    _A + "clip_cov.clip_ratio": derived("with policy_loss_type clip_cov: algorithm.clip_cov_ratio"),
    _A + "clip_cov.clip_cov_lb": derived("with policy_loss_type clip_cov: algorithm.clip_cov_lb"),
    _A + "clip_cov.clip_cov_ub": derived("with policy_loss_type clip_cov: algorithm.clip_cov_ub"),
    _A + "kl_cov.kl_cov_frac": derived("with policy_loss_type kl_cov: algorithm.kl_cov_ratio"),
    _A + "kl_cov.ppo_kl_coef": derived("with policy_loss_type kl_cov: algorithm.kl_cov_coef"),
    _A + "dppo.*": inert(_LOSS_ONLY + ": dppo"),
    _A + "cispo.cispo_eps_clip_low": derived("with policy_loss_type cispo: algorithm.ratio_clip_min"),
    _A + "cispo.cispo_eps_clip_high": derived("with policy_loss_type cispo: algorithm.ratio_clip_max"),
    _A + "cispo.cispo_anchor": inert("corerl's CISPO clips the ratio to the sampling policy", _not("old")),
    # DAPO's dynamic sampling and overlong buffer (main_dapo's and main_tis_dapo's additions)
    _A + "dynamic_sampling.type": derived("filter: algorithm.dynamic_sampling.enabled (groups whose rewards all "
                                          "agree are dropped and more are sampled); replace is refused"),
    _A + "dynamic_sampling.max_sample_batches": acts("algorithm.dynamic_sampling.max_generation_batches"),
    _A + "dynamic_sampling.min_replace_ratio": inert("used only by dynamic_sampling.type replace (refused)"),
    _A + "overlong_buffer_len": derived("DAPO's overlong buffer: algorithm.overlong_penalty (enabled, "
                                        "buffer_length; max_response_length from "
                                        "generator.sampling_params.max_generate_length)"),
    _A + "overlong_buffer_penalty_factor": acts("algorithm.overlong_penalty.penalty"),
    # fully asynchronous training (the fully_async entry point)
    "trainer.fully_async.enabled": derived("with the fully_async entry point: algorithm.async.enabled"),
    "trainer.fully_async.max_staleness_steps": acts("algorithm.async.max_staleness"),
    "trainer.fully_async.num_parallel_generation_workers": acts("algorithm.async.max_inflight_prompts"),
    "trainer.fully_async.sample_full_batch": inert("a corerl step waits for its whole batch of groups"),
    "trainer.fully_async.clear_kv_cache_on_weight_sync": derived("algorithm.async.in_flight: true aborts what is "
                                                                 "in flight at a weight update, false continues it"),
    "trainer.fully_async.simulate_training": derived("true (SkyRL's fully_async_sim entry point requires it): "
                                                     "algorithm.async.simulate_training, steps sleep instead of "
                                                     "training; false: training runs"),
    "trainer.fully_async.simulate_training_step_seconds": derived("with simulate_training: "
                                                                  "algorithm.async.simulate_training_seconds"),
    "trainer.fully_async.simulate_weight_sync_seconds": derived("with simulate_training: "
                                                                "algorithm.async.simulate_refit_seconds"),
    # a training plugin that trains multi-token-prediction heads (and a generation plugin drafting with them)
    # brings rules of its own for these keys; these are taken where none is installed
    "trainer.mtp.enabled": inert("no installed training plugin trains multi-token-prediction heads, so only false "
                                 "is accepted", _truthy),
    "trainer.mtp.*": inert("used only with trainer.mtp.enabled (refused)"),
    "trainer.update_ref_every_epoch": inert(_OFF + " (refreshing the reference model each epoch)", _truthy),
}


def _kl_type(value: object) -> str:
    if value not in ("k1", "k2", "k3"):
        raise ValueError(f"the {value!r} KL estimator is not built into corerl (k1, k2 and k3 are)")
    return str(value)
