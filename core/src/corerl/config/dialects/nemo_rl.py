"""NeMo RL's recipe dialect, translated into corerl's configuration.

The whole mapping is the table :data:`RULES`: each NeMo RL key either **acts** (its value goes to
a corerl key, converted where the two differ), is **inert** (accepted with a stated reason: it
has no effect in corerl, or only the value NeMo RL uses by default is accepted), or is
**refused** in one line saying what corerl does not support. Keys the table does not name are
taken to mean what the same key means in corerl and go through corerl's strict validation, so
nothing is dropped silently. A section switched off (``enabled: false``) is inert as a whole.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Literal

import attrs

from corerl.config.dialects import nemo_rl_vision as vision
from corerl.config.dialects.key_fate import KeyFate
from corerl.config.tree import Origins, drop_at, origin_of, set_at, value_at
from corerl.errors import ConfigError, ConfigErrors

ALGORITHM_SECTIONS = ("grpo", "ppo", "sft", "dpo", "distillation", "rm")
# NeMo RL's own top-level sections (``env`` and ``logger`` are corerl's too); ``generation`` and
# ``tokenizer`` are those of its evaluation recipes (examples/configs/evals), which have no policy
NEMO_ONLY_SECTIONS = ("loss_fn", "logger", "env", "value", "value_loss_fn", "teacher", "generation", "tokenizer")
#: an evaluation recipe's top-level sections mean the policy's: ``generation.x`` is ``policy.generation.x``
EVAL_RECIPE_ALIASES = ("generation", "tokenizer")
#: sections whose keys without a rule of their own take another section's rule (NeMo RL shares them)
SHARED_KEYS = {"ppo": "grpo", "distillation": "grpo", "rm": "dpo"}
#: algorithms whose steps sample the policy: NeMo RL validates them by sampling answers to held-out prompts
SAMPLING_ALGORITHMS = ("grpo", "ppo", "distillation")
# NeMo RL's dataset specs: corerl's data section has no such subsections
NEMO_ONLY_SUBSECTIONS = ("data.train", "data.validation", "data.default", "policy.tokenizer")
# mappings taken whole (their keys are not NeMo RL's own: engine arguments, environment variables)
OPAQUE_KEYS = ("policy.generation.vllm_kwargs", "policy.dtensor_cfg.env_vars", "policy.megatron_cfg.env_vars",
               "policy.hf_config_overrides", "policy.generation.vllm_cfg.env_vars")


@attrs.frozen
class Rule:
    """What one NeMo RL key (or every key under a ``prefix.*``) becomes."""

    fate: str  # "acts", "inert", "refused", or "derived" (decided with other keys)
    target: str | None = None  # acts: the corerl key
    convert: Callable[[Any], Any] | None = None  # acts: the value corerl takes
    reason: str = ""
    refuse_if: Callable[[Any], bool] | None = None  # inert: values that would change behaviour
    warn_if: Callable[[Any], bool] | None = None  # inert: values accepted with a warning at every run


def acts(target: str, convert: Callable[[Any], Any] | None = None, note: str = "") -> Rule:
    """``note``: what the conversion does, for the guide's table."""
    return Rule("acts", target, convert, reason=note)


def inert(reason: str, refuse_if: Callable[[Any], bool] | None = None) -> Rule:
    return Rule("inert", reason=reason, refuse_if=refuse_if)


def inert_with_warning(reason: str, warn_if: Callable[[Any], bool]) -> Rule:
    return Rule("inert", reason=reason, warn_if=warn_if)


def refused(reason: str) -> Rule:
    return Rule("refused", reason=reason)


def derived(what: str) -> Rule:
    """A key decided together with other keys, in _derived(); ``what`` says how (the guide's table)."""
    return Rule("derived", reason=what)


DERIVED = Rule("derived")  # decided together with other keys, in _derived()


def _truthy(value: Any) -> bool:
    return bool(value) and value not in ("none", "None")


def _not(expected: Any) -> Callable[[Any], bool]:
    return lambda value: value != expected


_NEMO_GYM = ("NeMo Gym environments run as NeMo Gym's own resource servers, and corerl has no bridge to them "
             "yet: play such an agent with data.env_name=openai_agent, or write a corerl environment")


def _environment_name(value: Any) -> Any:
    """NeMo RL's environment name as corerl's ``data.env_name`` (NeMo Gym's is refused; its VLM
    environment ``clevr-cogent`` is corerl's ``clevr_cogent``)."""
    if value == "nemo_gym":
        raise ValueError(_NEMO_GYM)
    return vision.environment_id(value)


def _estimator(name: Any) -> str:
    """NeMo RL's GRPO advantage estimator as corerl's ``algorithm.advantage_estimator``."""
    if name not in ("grpo", "reinforce_plus_plus"):
        raise ValueError(f"the {name!r} advantage estimator is not built into corerl yet (grpo and "
                         "reinforce_plus_plus are)")
    return str(name)


def _aggregation(token_level: Any) -> str:
    """NeMo RL's ``loss_fn.token_level_loss`` as corerl's ``algorithm.loss_aggregation``."""
    return "token_mean" if token_level else "sequence_mean"


def _load_balancing(value: Any) -> str:
    """NeMo RL's ``moe_router_load_balancing_type`` as corerl's ``policy.moe.load_balancing_type``."""
    if value in (None, "none"):
        return "none"
    if value not in ("aux_loss", "seq_aux_loss"):
        raise ValueError(f"the {value!r} load balancing is not built into corerl yet (none, aux_loss and "
                         "seq_aux_loss are)")
    return str(value)


def _step_count(value: Any) -> int:
    """NeMo RL's ``max_num_steps`` where -1 means "until max_num_epochs epochs are done"."""
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{value} (train for max_num_epochs epochs) is not translated: corerl stops at a step count, "
                         "and an epoch's steps are known only once the data is read; give the steps (an epoch is the "
                         "training pairs / policy.train_global_batch_size)")
    return value


def _above(limit: int) -> Callable[[Any], bool]:
    return lambda value: value is not None and value > limit


def _torch_optimizer(name: Any) -> str:
    known = {"torch.optim.AdamW": "adamw", "torch.optim.Adam": "adam", "torch.optim.SGD": "sgd",
             # Transformer Engine's fused kernel of AdamW (decoupled weight decay, its default adam_w_mode)
             "transformer_engine.pytorch.optimizers.fused_adam.FusedAdam": "adamw"}
    if name not in known:
        raise ValueError(f"optimizer {name!r} is not one corerl builds; use one of {', '.join(known)}")
    return known[name]


_OFF = "a switch NeMo RL leaves off by default; corerl has no such feature, so only false/null is accepted"
_PERF = "a kernel-fusion or memory switch of NeMo RL's engines; corerl leaves the choice to the library"
_ENV = ("corerl sets no environment variables per backend: export them in the shell that starts corerl "
        "(Ray workers inherit it)")
_FLEET = ("NeMo RL's generation-fleet resiliency (retries per prompt, watchdogs, shard health, a router); corerl "
          "restarts its generation worker and requeues its prompts, up to algorithm.async.max_generation_failures")
_DEFAULT_ONLY = "corerl behaves as NeMo RL's default value; another value is refused"

# NeMo RL key (or prefix.*) -> what corerl does with it
RULES: dict[str, Rule] = {
    # -- grpo --
    "grpo.num_prompts_per_step": acts("algorithm.batch_size"),
    "grpo.num_generations_per_prompt": acts("algorithm.num_generations_per_prompt"),
    "grpo.max_num_steps": acts("algorithm.max_steps"),
    "grpo.seed": acts("algorithm.seed"),
    "grpo.normalize_rewards": acts("algorithm.scale_rewards_by_std"),
    "grpo.use_leave_one_out_baseline": acts("algorithm.leave_one_out_baseline"),
    "grpo.max_val_samples": acts("data.held_out_size"),
    "grpo.max_num_epochs": inert("corerl stops at max_num_steps, drawing the shuffled data again epoch after epoch"),
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
    "sft.max_num_steps": acts("algorithm.max_steps"),
    "sft.seed": acts("algorithm.seed"),
    "sft.max_num_epochs": inert("corerl stops at max_num_steps, drawing the shuffled data again epoch after epoch"),
    "sft.val_period": inert("corerl evaluates the held-out rows before and after training"),
    "sft.val_batches": inert("the held-out rows are evaluated in one batch"),
    "sft.val_global_batch_size": inert("the held-out rows are evaluated in one batch"),
    "sft.val_micro_batch_size": inert("the held-out rows are evaluated in one batch"),
    "sft.val_at_start": inert("corerl always evaluates before training"),
    "sft.val_at_end": inert("corerl always evaluates after training"),
    # -- dpo --
    "dpo.max_num_steps": acts("algorithm.max_steps"),
    "dpo.seed": acts("algorithm.seed"),
    "dpo.reference_policy_kl_penalty": acts("algorithm.dpo.beta"),
    "dpo.preference_loss_weight": acts("algorithm.dpo.preference_weight"),
    "dpo.sft_loss_weight": acts("algorithm.dpo.sft_weight"),
    "dpo.preference_average_log_probs": acts("algorithm.dpo.preference_average_log_probs"),
    "dpo.sft_average_log_probs": acts("algorithm.dpo.sft_average_log_probs"),
    "dpo.max_num_epochs": inert("corerl stops at max_num_steps, drawing the shuffled pairs again epoch after epoch"),
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
    # -- checkpointing --
    "checkpointing.keep_top_k": derived("with a metric corerl logs: checkpointing.keep_top_k (the best k, and the "
                                        "newest); else checkpointing.keep_last (the newest k)"),
    "checkpointing.checkpoint_dir": inert("checkpoints live in <run dir>/checkpoints; set run.output_dir and run.name"),
    "checkpointing.metric_name": derived("checkpointing.metric_name: val:accuracy and val:total_reward/mean are "
                                         "eval/mean@n, val:pass_k eval/pass@n (with evaluation during training), "
                                         "train:loss loss, train:total_reward/mean and train:reward reward/mean; "
                                         "another metric, or validation off, keeps the newest checkpoints (with a "
                                         "warning where NeMo RL would rank them)"),
    "checkpointing.higher_is_better": derived("with a metric corerl logs: checkpointing.higher_is_better"),
    "checkpointing.checkpoint_must_save_by": acts("checkpointing.save_by"),
    "checkpointing.model_save_format": inert("a storage format only: corerl's checkpoints are its backends' own "
                                             "format and final/ is safetensors"),
    "checkpointing.save_consolidated": inert("final/ is always a consolidated Hugging Face checkpoint"),
    # -- policy --
    "policy.tokenizer.name": acts("policy.tokenizer_name"),
    "policy.tokenizer.chat_template": DERIVED,
    "policy.tokenizer.chat_template_kwargs": inert(_OFF, _truthy),
    "policy.train_global_batch_size": DERIVED,
    "policy.scheduler": DERIVED,
    "policy.scheduler.*": DERIVED,
    "data.dataset_name": DERIVED,
    "data.train.dataset_name": DERIVED,
    "data.validation.dataset_name": DERIVED,
    "data.default.dataset_name": DERIVED,
    "policy.logprob_batch_size": acts("policy.logprob_micro_batch_size"),
    "policy.max_total_sequence_length": acts("policy.max_seq_length"),
    "policy.generation_batch_size": inert("the hf backend generates the whole step's prompts in one batch"),
    "policy.logprob_chunk_size": inert("computing logprobs in chunks of the sequence saves memory and gives the same "
                                       "values; " + _PERF),
    "policy.make_sequence_length_divisible_by": inert("corerl pads rows as its tensor-parallel plan needs"),
    "policy.offload_optimizer_for_logprob": inert("where the optimizer state sits while logprobs are computed "
                                                  "changes memory only; corerl's is policy.offload.policy"),
    "policy.optimizer": inert("null in NeMo RL's Megatron recipes (no DTensor optimizer); megatron_cfg.optimizer "
                              "configures Megatron's"),
    "policy.optimizer.name": acts("policy.optimizer.name", _torch_optimizer),
    "policy.optimizer.kwargs.lr": acts("policy.optimizer.lr"),
    "policy.optimizer.kwargs.weight_decay": acts("policy.optimizer.weight_decay"),
    "policy.optimizer.kwargs.betas": acts("policy.optimizer.betas"),
    "policy.optimizer.kwargs.eps": acts("policy.optimizer.eps"),
    "policy.optimizer.kwargs.momentum": acts("policy.optimizer.momentum"),
    "policy.optimizer.kwargs.foreach": inert("corerl picks torch's optimizer implementation itself"),
    "policy.optimizer.kwargs.fused": inert("corerl picks torch's optimizer implementation itself"),
    "policy.dtensor_cfg._v2": inert("corerl has one DTensor path (FSDP2 by default)"),
    "policy.dtensor_cfg.env_vars": inert_with_warning(_ENV, _truthy),
    "policy.dtensor_cfg.automodel_kwargs": inert("corerl loads models with transformers directly", _truthy),
    "policy.dtensor_cfg.clear_cache_every_n_steps": inert(_PERF),
    "policy.megatron_cfg.env_vars": inert_with_warning(_ENV, _truthy),
    # -- NeMo RL main (HEAD) keys: validation, the advantage estimator, engines' serving and tuning --------
    "grpo.val_start_at": inert_with_warning("corerl's periodic evaluation starts at step eval.every_n_steps: the "
                                            "evaluations before this step are run too", _above(0)),
    "grpo.val_num_generations_per_prompt": derived("with evaluation during training: eval.num_samples (unset: 1, "
                                                   "NeMo RL's default)"),
    "grpo.stop_at_validation_metric": inert(_OFF, _truthy),
    "grpo.stop_at_validation_threshold": inert(_OFF, lambda value: value is not None),
    "grpo.seq_logprob_error_threshold": inert("a sequence-level train/generation logprob gap check; corerl logs "
                                              "the gap every step (logprob_mismatch/*) and masks nothing",
                                              lambda value: value is not None),
    "grpo.invalid_tool_call_advantage": inert(_OFF, lambda value: value is not None),
    "grpo.malformed_thinking_advantage": inert(_OFF, lambda value: value is not None),
    "grpo.advantage_clip_low": acts("algorithm.advantage_clip_low"),
    "grpo.advantage_clip_high": acts("algorithm.advantage_clip_high"),
    "grpo.adv_estimator.name": acts("algorithm.advantage_estimator", _estimator),
    "grpo.adv_estimator.normalize_rewards": acts("algorithm.scale_rewards_by_std"),
    "grpo.adv_estimator.use_leave_one_out_baseline": acts("algorithm.leave_one_out_baseline"),
    "grpo.adv_estimator.minus_baseline": acts("algorithm.minus_baseline"),
    "loss_fn.use_kl_in_reward": acts("algorithm.use_kl_in_reward"),
    "loss_fn.use_cispo": acts("algorithm.use_cispo"),
    "loss_fn.disable_ppo_ratio": inert(_OFF, _truthy),
    "loss_fn.positive_example_nll_weight": inert(_OFF, _truthy),
    "loss_fn.force_on_policy_ratio": DERIVED,
    "reward_penalties.*": inert(_OFF, _truthy),
    "data_plane.*": inert("NeMo RL's distributed data plane moves rollouts between its workers; corerl's pass "
                          "through the driver"),
    "data.use_multiple_dataloader": inert(_OFF, _truthy),
    "data.validation.repeat": inert("corerl's held-out answers are greedy: repeating a row adds nothing"),
    "policy.tokenizer.use_fastokens": inert(_OFF, _truthy),
    "checkpointing.save_optimizer": inert("a resumable checkpoint always holds the optimizer state", _not(True)),
    "cluster.segment_size": inert("NeMo RL's placement segments; corerl places ranks with Ray placement groups"),
    "cluster.master_port_range_low": inert("corerl picks free rendezvous ports itself"),
    "cluster.master_port_range_high": inert("corerl picks free rendezvous ports itself"),
    "sft.only_unmask_final": inert(_OFF, _truthy),
    "policy.sequence_packing.microbatch_order": inert("the order packed micro-batches run in changes nothing summed "
                                                      "over a step"),
    "policy.draft": inert("null: no draft model (speculative decoding)"),
    "policy.generation.port_range_low": inert("ports of NeMo RL's generation servers; corerl's engines open none"),
    "policy.generation.port_range_high": inert("ports of NeMo RL's generation servers; corerl's engines open none"),
    "policy.generation.val_temperature": derived("with evaluation during training: eval.temperature"),
    **{f"policy.generation.val_{key}": derived(f"evaluation samples with policy.generation.{key}: another value is "
                                               "refused where the recipe evaluates")
       for key in ("top_p", "top_k")},
    "policy.generation.top_k": acts("policy.generation.top_k", lambda value: None if value in (-1, 0) else value,
                                    "-1 and 0 (no top-k, vLLM's spelling) are unset"),
    "policy.generation.refit_transport": inert("how NeMo RL moves weights to its engines; corerl's refit is its own "
                                               "(shared memory on one machine, Ray otherwise)"),
    "policy.generation.refit_cfg.*": inert("how NeMo RL moves weights to its engines; corerl's refit is its own"),
    "policy.generation.real_quant_export_cpu_offload": inert(_PERF),
    "policy.generation.vllm_cfg.kv_cache_dtype": inert("the KV cache is kept in the model's precision; an FP8 KV "
                                                       "cache is refused", _not("auto")),
    "policy.generation.vllm_cfg.logprobs_mode": inert("corerl takes the model's untempered logprobs from vLLM, as "
                                                      "the loss wants them"),
    **{f"policy.generation.vllm_cfg.{key}": inert("vLLM's serving, metrics and refit-server settings; corerl "
                                                  "drives vLLM in process or in a Ray actor")
       for key in ("use_tqdm", "enable_vllm_metrics_logger", "vllm_metrics_logger_interval",
                   "http_refit_api_key_env_var", "reset_encoder_cache_after_weight_update", "http_refit_server_port",
                   "zmq_refit_server_port", "distributed_executor_backend", "http_server_serving_chat_kwargs")},
    **{f"policy.generation.mcore_generation_config.{key}": inert("megatron-core's inference-engine tuning; corerl's "
                                                                  "megatron generation decodes with its own loop")
       for key in ("max_model_len", "cuda_graph_impl", "inference_cuda_graph_scope",
                   "use_cuda_graphs_for_non_decode_steps", "enable_prefix_caching", "max_tokens",
                   "kv_cache_management_mode", "materialize_only_last_token_logits", "num_speculative_tokens",
                   "refit_backend", "parsers", "expose_http_server")},
    **{f"policy.megatron_cfg.{key}": inert(_PERF)
       for key in ("cuda_graph_impl", "cuda_graph_modules", "cuda_graph_warmup_steps",
                   "fine_grained_activation_offloading", "offload_modules", "recompute_granularity",
                   "recompute_modules", "gradient_accumulation_fusion", "use_fused_weighted_squared_relu",
                   "optimizer.overlap_cpu_optimizer_d2h_h2d", "use_fused_linear_logprobs",
                   "fused_linear_logprobs_chunk_size", "attention_backend",
                   "checkpoint.async_save", "checkpoint.ckpt_assume_constant_structure")},
    "policy.megatron_cfg.model_overrides": inert("overriding megatron's model config is not built into corerl yet; "
                                                 "only {} is accepted", _truthy),
    "policy.megatron_cfg.mtp_num_layers": inert("multi-token prediction layers are not built into corerl yet; only "
                                                "0 is accepted", _truthy),
    "policy.megatron_cfg.mtp_loss_scaling_factor": inert("used only with multi-token prediction (mtp_num_layers)"),
    "policy.megatron_cfg.mtp_use_repeated_layer": inert("used only with multi-token prediction (mtp_num_layers)"),
    "policy.megatron_cfg.mtp_detach_heads": inert("used only with multi-token prediction (mtp_num_layers)"),
    "policy.megatron_cfg.moe_router_enable_expert_bias": inert("aux-loss-free balancing (a learned per-expert bias) "
                                                               "is not built into corerl yet; only false is accepted",
                                                               _truthy),
    "policy.dtensor_cfg.automodel_kwargs.*": inert("corerl loads models with transformers directly"),
    # generation engines corerl does not have: their settings, inert (policy.generation.backend naming one is refused)
    **{f"policy.generation.{section}.*": inert(f"settings of the {engine} generation engine, which corerl does not "
                                               "have (policy.generation.backend naming it is refused)")
       for section, engine in (("sglang_cfg", "SGLang"), ("trtllm_cfg", "TensorRT-LLM"),
                               ("trtllm_kwargs", "TensorRT-LLM"), ("dynamo_cfg", "Dynamo"))},
    "policy.generation.vllm_cfg.env_vars": inert_with_warning(_ENV, _truthy),
    "policy.generation.vllm_cfg.expose_http_server": inert("corerl serves the engine over HTTP only to agent "
                                                          "harnesses (env.openai_agent)"),
    "policy.generation.vllm_cfg.is_mx": inert("quantised (MX) generation is not built into corerl yet", _truthy),
    "policy.generation.vllm_cfg.quantization_ignored_layer_kws": inert("used only with quantised generation"),
    "policy.generation.use_async_rollouts": inert(_OFF, _truthy),
    "policy.generation.quant_cfg": inert("quantised (ModelOpt) generation is not built into corerl yet",
                                         lambda value: value is not None),
    **{f"policy.generation.mcore_generation_config.{key}": inert("megatron-core's inference-engine layout; corerl's "
                                                                  "megatron generation uses the training layout")
       for key in ("transformer_impl", "activation_checkpointing", "tensor_model_parallel_size",
                   "expert_model_parallel_size", "sequence_parallel", "unified_memory_level",
                   "inference_grouped_gemm_backend", "moe_router_num_groups", "moe_router_group_topk",
                   "moe_router_dtype")},
    # NeMo RL's router replay takes the experts vLLM chose while generating: corerl's r3
    "policy.router_replay.enabled": acts("policy.moe.router_replay", lambda on: "r3" if on else "none"),
    "policy.activation_checkpointing_enabled": inert(_OFF, _truthy),
    "policy.quant_cfg": inert("quantisation-aware training (ModelOpt) is not built into corerl yet",
                              lambda value: value is not None),
    **{f"policy.{key}": inert("used only with quantisation-aware training (policy.quant_cfg)")
       for key in ("disable_modelopt_layer_spec", "quant_calib_data", "quant_calib_size", "quant_batch_size",
                   "quant_sequence_length")},
    "policy.tokenizer.video.*": refused(vision.AUDIO_VIDEO),
    "grpo.skip_reference_policy_logprobs_calculation": inert("corerl scores the reference only where the KL penalty "
                                                             "needs it (algorithm.kl_penalty > 0)"),
    # NeMo RL's reward-model environment (data.*.env_name: reward_model): corerl's reward_model section
    "env.reward_model.model_name": acts("reward_model.model_name"),
    "env.reward_model.batch_size": acts("reward_model.micro_batch_size"),
    "env.reward_model.dtensor_cfg.cpu_offload": acts("reward_model.cpu_offload"),
    "env.reward_model.reward_model_cfg.enabled": inert("the reward model is loaded with its score head "
                                                       "(reward_model.kind)", _not(True)),
    "env.reward_model.reward_model_cfg.reward_model_type": inert(
        "only Bradley-Terry reward models are built into corerl (reward_model.kind=bradley_terry)",
        _not("bradley_terry")),
    "env.reward_model.*": derived("the reward model is frozen and scores the policy's samples on the policy's "
                                  "training backend, with its layout: training and resource settings are inert; its "
                                  "layout and precision must equal the policy's, else refused in one line"),
    **{f"policy.generation.mcore_generation_config.{key}": inert("megatron-core's inference-engine layout; corerl's "
                                                                  "megatron generation uses the training layout")
       for key in ("buffer_guaranteed_fraction", "mamba_inference_ssm_states_dtype", "pipeline_model_parallel_size",
                   "expert_tensor_parallel_size", "context_parallel_size")},
    **{f"policy.generation.vllm_cfg.{key}": inert("vLLM's serving and parsing settings; corerl drives vLLM in "
                                                  "process or in a Ray actor")
       for key in ("skip_tokenizer_init", "reasoning_parser_plugin", "enable_prefix_caching",
                   "enforce_monotonicity", "http_server_serving_chat_kwargs.*")},
    "policy.generation.real_quant": inert("quantised generation is not built into corerl yet", _truthy),
    "policy.generation.real_quant_ignore": inert("used only with quantised generation"),
    "policy.refit_buffer_size_gb": inert("how NeMo RL buckets weights for its refit; corerl's refit is its own"),
    "policy.sequence_packing.fuse_loss": inert(_PERF),
    "policy.tokenizer.chat_template_kwargs.*": inert(_OFF, _truthy),
    "policy.optimizer.kwargs.*": inert("precision options of NeMo RL's fused optimizer; corerl keeps float32 "
                                       "optimizer state"),
    "policy.dtensor_cfg.moe_parallelizer.*": inert("Automodel's MoE wrapping options; corerl's dtensor backend lays "
                                                   "experts out itself (policy.dtensor_cfg.expert_parallel_size)"),
    "policy.megatron_cfg.freeze_moe_router": acts("policy.moe.freeze_router"),
    "policy.megatron_cfg.moe_aux_loss_coeff": acts("policy.moe.aux_loss_coeff", lambda value: float(value or 0.0)),
    "policy.megatron_cfg.moe_z_loss_coeff": acts("policy.moe.z_loss_coeff", lambda value: float(value or 0.0)),
    "policy.megatron_cfg.moe_router_load_balancing_type": acts("policy.moe.load_balancing_type", _load_balancing),
    **{f"policy.megatron_cfg.{key}": inert("corerl logs each MoE layer's expert load and the router losses at every step")
       for key in ("track_moe_metrics", "moe_per_layer_logging")},
    "policy.megatron_cfg.moe_hybridep_num_sms": inert(_PERF),
    **{f"policy.megatron_cfg.{key}": inert("corerl normalises the loss per token over the whole step itself")
       for key in ("do_not_average_loss", "cp_normalize", "calculate_per_token_loss", "scale_loss_by_dp_cp_size")},
    "policy.megatron_cfg.train_iters": inert("corerl's step count is algorithm.max_steps"),
    "policy.megatron_cfg.scheduler.override_opt_param_scheduler": inert("corerl builds the schedule from "
                                                                        "policy.scheduler"),
    "policy.draft.*": refused("speculative decoding with a draft model is not built into corerl yet"),
    "grpo.penalize_invalid_tool_call": inert(_OFF, _truthy),
    "grpo.penalize_malformed_thinking": inert(_OFF, _truthy),
    "grpo.invalid_tool_call_strategy": inert("used only with grpo.penalize_invalid_tool_call"),
    "grpo.calculate_advantages_on_gpu": inert(_PERF),
    "grpo.adv_estimator.reward_weights": inert("used only by the gdpo estimator (refused)"),
    "grpo.reward_shaping.enabled": acts("algorithm.overlong_penalty.enabled"),
    "grpo.reward_shaping.overlong_buffer_length": acts("algorithm.overlong_penalty.buffer_length"),
    "grpo.reward_shaping.overlong_buffer_penalty": acts("algorithm.overlong_penalty.penalty"),
    "grpo.reward_shaping.max_response_length": acts("algorithm.overlong_penalty.max_response_length"),
    "grpo.reward_shaping.stop_properly_penalty_coef": acts("algorithm.overlong_penalty.truncated_reward_factor"),
    "grpo.reward_shaping.*": refused("a DAPO reward-shaping option corerl does not have"),
    **{f"grpo.reward_scaling.{key}": acts(f"algorithm.reward_scaling.{key}")
       for key in ("enabled", "source_min", "source_max", "target_min", "target_max")},
    "grpo.reward_scaling.*": refused("a reward-scaling option corerl does not have"),
    **{f"env.{name}.*": inert(f"settings of NeMo RL's {name} environment, which corerl does not have "
                              "(data.env_name naming it is refused)")
       for name in ("sliding_puzzle_game", "mmpr-tiny", "math_multi_reward")},
    # NeMo RL's VLM reward environments: corerl's built-in ones (clevr-cogent is clevr_cogent)
    **{f"env.{name}.{key}": acts(f"env.{env_id}.{key}")
       for name, env_id in vision.VLM_ENVIRONMENTS.items() for key in vision.VLM_ENVIRONMENT_KEYS},
    **{f"env.{name}.*": refused(f"a setting NeMo RL's VLM environment {name} does not have (num_workers and "
                                "reward_functions are)")
       for name in vision.VLM_ENVIRONMENTS},
    **{f"env.{key}": inert("NeMo Gym's switches; corerl has no bridge to NeMo Gym")
       for key in ("should_use_nemo_gym", "should_log_nemo_gym_responses", "should_mask_flagged_samples")},
    "data.train": refused("several training datasets at once are not translated yet; give one local file "
                          "(data.train.data_path)"),
    "data.train.*": refused("a NeMo RL dataset option corerl does not translate; give a local file "
                            "(data.train.data_path)"),
    **{f"data.{key}": refused("several or custom data loaders are not built into corerl yet")
       for key in ("_override_", "num_prompts_per_dataloader", "custom_dataloader")},
    "data.add_system_prompt": inert(_OFF, _truthy),
    # -- distillation (NeMo RL's distillation: and teacher: sections) --
    "loss_fn.kl_type": acts("algorithm.distillation.kl_type", note="reverse on the student's sampled tokens; "
                            "forward and mixed over the teacher's top-k next tokens"),
    "loss_fn.mixed_kl_weight": acts("algorithm.distillation.mixed_kl_weight"),
    "loss_fn.zero_outside_topk": acts("algorithm.distillation.zero_outside_topk", note="true renormalises the "
                                      "teacher over its top-k"),
    "distillation.topk_logits_k": acts("algorithm.distillation.topk_logits_k"),
    "teacher.model_name": acts("algorithm.distillation.teacher_model"),
    "teacher.logprob_batch_size": acts("algorithm.distillation.teacher_micro_batch_size"),
    "teacher.dtensor_cfg.cpu_offload": acts("algorithm.distillation.teacher_cpu_offload"),
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
    # -- value: the critic (value.dtensor_cfg, megatron_cfg and optimizer keys take the policy's rules, on critic.*) --
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
    "value.dtensor_cfg.lora_cfg.enabled": inert("the critic trains whole: LoRA is the policy's", _truthy),
    # vision-language models (NeMo RL's VLM recipes): the Qwen-VL image families on dtensor; _vision() checks the
    # model and the datasets, and refuses megatron's VLM path
    "policy.is_vlm": inert("corerl reads whether the model is a vision-language one from its config.json "
                           f"(model_type); a VLM recipe's model must be a {vision.SUPPORTED_FAMILIES} one"),
    **{f"policy.megatron_cfg.{key}": refused(vision.MEGATRON_VLM)
       for key in ("freeze_config.*", "freeze_vision_model", "freeze_vision_projection", "freeze_sound_encoder",
                   "freeze_sound_projection", "radio_force_cpe_eval_mode")},
    "policy.dtensor_cfg.automodel_kwargs.freeze_config.freeze_vision_tower": acts("policy.freeze_vision_tower"),
    "policy.dtensor_cfg.automodel_kwargs.freeze_config.freeze_audio_tower": inert(
        "corerl trains no audio tower (audio models are not built in)"),
    "policy.dtensor_cfg.automodel_kwargs.freeze_config.freeze_language_model": inert(
        "corerl trains the language model (with LoRA, its adapters)", _truthy),
    "policy.dtensor_cfg.automodel_kwargs.freeze_config.*": refused(
        "an Automodel freeze option corerl does not have (freeze_vision_tower is policy.freeze_vision_tower)"),
    **{key: refused(vision.AUDIO_VIDEO)
       for key in ("policy.generation.vllm_cfg.video.*", "data.default.video_target_num_patches",
                   "data.default.video_maintain_aspect_ratio")},
    "grpo.deduplicate_multimodal_data": inert("NeMo RL's sharing of a prompt's images among its group's rows in the "
                                              "payloads its Ray workers exchange: transport and memory only, the "
                                              "same samples and loss (corerl's rows carry their prompt's images)"),
    **{f"policy.generation.vllm_cfg.{key}": inert("vLLM's loading and serving settings; corerl drives vLLM in "
                                                  "process or in a Ray actor")
       for key in ("enable_thinking", "load_format", "cap_max_tokens_to_context")},
    "policy.generation.mcore_generation_config.inference_moe_token_dispatcher_type": inert(
        "corerl's megatron generation dispatches tokens as the training layout does"),
    "policy.generation.bad_words": inert(_OFF, _truthy),
    "policy.dequantize_base_checkpoint": inert(_OFF, _truthy),
    "policy.megatron_cfg.clear_memory_caches_before_refit": inert(_PERF),
    "grpo.zero_variance_prompt_filtering": inert(_OFF, _truthy),
    "grpo.debug_payload_metrics": inert("NeMo RL's debug telemetry of its Ray payload sizes: metrics only, the same "
                                        "samples and loss"),
    "grpo.num_val_generations_per_prompt": derived("an older spelling of grpo.val_num_generations_per_prompt"),
    "data.validation.allowed_problem_types": inert("used by NeMo RL's validation datasets; corerl holds rows of the "
                                                   "training data out"),
    "env._override_": refused("several or custom data loaders are not built into corerl yet"),
    # sections of algorithms corerl does not have: every key refused with the feature it needs
    "teachers": refused("several teachers (NeMo RL's cross-tokenizer off-policy distillation) are not built into "
                        "corerl yet"),
    "on_policy_distillation": inert("null: no on-policy distillation", _truthy),
    "on_policy_distillation.*": refused("on-policy distillation is not built into corerl yet"),
    # -- rm: a Bradley-Terry reward model (its other keys are dpo's: rule_for reads dpo.<key>'s rule for rm.<key>) --
    "rm.max_num_steps": acts("algorithm.max_steps", _step_count, "-1 (train max_num_epochs epochs) is refused: "
                                                                   "corerl stops at a step count"),
    "policy.reward_model_cfg.enabled": derived("true with an rm section: algorithm.name=rm trains a score head on "
                                               "the policy's model; refused in a recipe of another algorithm"),
    "policy.reward_model_cfg.reward_model_type": inert("only Bradley-Terry reward models are built into corerl",
                                                       _not("bradley_terry")),
    "policy.reward_model_cfg.*": refused("a reward-model option corerl does not have"),
    # -- evaluation recipes (examples/configs/evals: eval, generation, tokenizer and data, no policy) --
    "eval.metric": inert("corerl eval reports pass@k (eval/pass@k) beside mean@n and the greedy reward; cons@k "
                         "(majority vote) is not built into corerl yet", _not("pass@k")),
    "eval.num_tests_per_prompt": acts("eval.num_samples"),
    "eval.k_value": acts("eval.pass_k"),
    "eval.seed": acts("algorithm.seed"),
    "eval.save_path": inert("corerl eval writes its figures to the file --output names"),
    "generation.model_name": acts("policy.model_name"),
    "generation.num_prompts_per_step": inert("corerl eval hands the engine the prompts together; how they are "
                                             "batched does not change the answers"),
    "data.problem_key": acts("data.prompt_key"),
    "data.solution_key": acts("data.answer_key"),
    "data.processor": inert(vision.PROCESSOR_REASON),
    "data.repeat": inert("each prompt is answered eval.num_samples times (eval.num_tests_per_prompt)", _not(1)),
    "data.file_format": inert("corerl's dataset task reads JSONL and Parquet files: a CSV is refused (convert it)",
                              lambda value: value not in (None, "json", "jsonl", "parquet")),
    "env.math.verifier_type": inert("corerl's math environment verifies with math-verify (NeMo RL's math verifier); "
                                    "its multiple-choice verifiers are not built into corerl yet",
                                    lambda value: value not in (None, "math")),
    "policy.generation.vllm_cfg.limit_mm_per_prompt.image": derived("policy.generation.vllm_cfg.engine_args."
                                                                   "limit_mm_per_prompt.image (vLLM's images a "
                                                                   "prompt may hold)"),
    "policy.generation.vllm_cfg.limit_mm_per_prompt.*": refused(vision.AUDIO_VIDEO),
    # LoRA: both backends' sections map to policy.lora (PEFT); the megatron backend refuses it in one line
    **{f"policy.{section}.{key}": acts(f"policy.lora.{target}")
       for section in ("dtensor_cfg.lora_cfg", "megatron_cfg.peft")
       for key, target in (("enabled", "enabled"), ("target_modules", "target_modules"),
                           ("exclude_modules", "exclude_modules"), ("dim", "dim"), ("alpha", "alpha"),
                           ("dropout", "dropout"), ("dropout_position", "dropout_position"))},
    "policy.dtensor_cfg.lora_cfg.match_all_linear": acts("policy.lora.match_all_linear"),
    "policy.dtensor_cfg.lora_cfg.lora_A_init": acts("policy.lora.lora_A_init"),
    "policy.dtensor_cfg.lora_cfg.use_triton": inert("PEFT's LoRA layers run (no Triton kernels of NeMo RL's)"),
    "policy.megatron_cfg.peft.lora_A_init_method": acts("policy.lora.lora_A_init"),
    "policy.megatron_cfg.peft.lora_B_init_method": inert("B starts at zero, so a new adapter changes nothing",
                                                         _not("zero")),
    "policy.megatron_cfg.peft.a2a_experimental": inert(_OFF, _truthy),
    "policy.megatron_cfg.peft.lora_dtype": inert("the adapter trains in float32 (the optimizer's precision)",
                                                 lambda value: value not in (None, "None", "float32")),
    "policy.hf_config_overrides": acts("policy.hf_config_overrides", lambda value: dict(value or {})),
    "policy.tokenizer.is_tokenizer_processor": inert("corerl loads the tokenizer, and a vision-language model's "
                                                     "image processor beside it"),
    "policy.megatron_cfg.pipeline_dtype": inert("pipeline stages exchange activations in policy.precision"),
    "policy.megatron_cfg.moe_router_dtype": inert_with_warning(
        "the router's softmax and top-k run in float32 (megatron-core's and transformers' default): routing in "
        "float64 is not applied, so near-ties between experts may break differently", lambda value: value == "fp64"),
    "policy.megatron_cfg.moe_router_bias_update_rate": inert("used only with the expert bias "
                                                             "(moe_router_enable_expert_bias), which is refused"),
    "policy.megatron_cfg.moe_permute_fusion": inert(_PERF),
    "policy.megatron_cfg.moe_shared_expert_overlap": inert(_PERF),
    "policy.megatron_cfg.defer_fp32_logits": inert(_PERF),
    "policy.megatron_cfg.use_gloo_process_groups": inert("corerl creates the process groups megatron-core needs"),
    "policy.megatron_cfg.optimizer.bf16": inert("follows policy.precision"),
    "policy.megatron_cfg.optimizer.fp16": inert("follows policy.precision"),
    "policy.megatron_cfg.optimizer.params_dtype": inert("master weights are float32"),
    "policy.megatron_cfg.optimizer.use_precision_aware_optimizer": inert(_PERF),
    "policy.megatron_cfg.optimizer.optimizer_cpu_offload": inert(_OFF, _truthy),
    "policy.megatron_cfg.optimizer.optimizer_offload_fraction": inert(_OFF, _truthy),
    "policy.megatron_cfg.scheduler.start_weight_decay": inert("weight decay stays at optimizer.weight_decay"),
    "policy.megatron_cfg.scheduler.end_weight_decay": inert("weight decay stays at optimizer.weight_decay"),
    "policy.megatron_cfg.scheduler.weight_decay_incr_style": inert("weight decay stays at optimizer.weight_decay",
                                                                   _not("constant")),
    "policy.megatron_cfg.scheduler.lr_warmup_init": inert("warm-up starts from zero"),
    "policy.megatron_cfg.distributed_data_parallel_config.*": inert(_PERF),
    "policy.sequence_packing.sequence_length_round": inert("corerl packs exact lengths"),
    "policy.dynamic_batching.sequence_length_round": inert("corerl cuts micro-batches at exact lengths"),
    "policy.generation.vllm_cfg.async_engine": inert("corerl hands vLLM a step's prompts in one call; the async engine "
                                                     "changes how NeMo RL drives vLLM, not what is sampled"),
    "policy.generation.vllm_cfg.precision": inert("the engine runs in policy.precision"),
    "policy.generation.vllm_cfg.enable_expert_parallel": inert_with_warning(
        "corerl's vLLM engine keeps the experts split over its tensor-parallel ranks (vllm_cfg.tensor_parallel_size) "
        "rather than laying them out expert-parallel: the same samples, another speed", _truthy),
    "policy.generation.vllm_cfg.expert_parallel_size": inert_with_warning(
        "corerl's vLLM engine keeps the experts split over its tensor-parallel ranks (vllm_cfg.tensor_parallel_size) "
        "rather than laying them out expert-parallel: the same samples, another speed", _above(1)),
    "policy.generation.vllm_cfg.use_deep_gemm": inert(_PERF),
    "policy.generation.vllm_cfg.num_last_layers_in_bf16": inert(_OFF, _truthy),
    "policy.generation.vllm_cfg.num_first_layers_in_bf16": inert(_OFF, _truthy),
    "policy.generation.vllm_kwargs": acts("policy.generation.vllm_cfg.engine_args"),
    # -- data --
    "data.max_input_seq_length": inert("a prompt that leaves no room for a completion in policy.max_seq_length is "
                                       "refused with its row; completions end at policy.max_seq_length"),
    "data.shuffle": acts("data.shuffle"),
    "data.num_workers": inert("rows are read in the driver"),
    "data.add_bos": inert("prompts start with the tokenizer's beginning-of-sequence token", _not(True)),
    "data.add_eos": inert("SFT responses end with the end-of-sequence token", _not(True)),
    "data.add_generation_prompt": inert("prompts end with the template's generation prompt when a chat template "
                                        "is applied"),
    "data.system_prompt_file": acts("data.system_prompt_file"),
    "data.prompt_file": acts("data.prompt_file"),
    "data.input_key": acts("data.prompt_key"),
    "data.output_key": acts("data.answer_key"),
    "data.train_data_path": acts("data.train_files"),
    "data.val_data_path": acts("data.held_out_files"),
    "data.train.data_path": acts("data.train_files"),
    "data.validation.data_path": acts("data.held_out_files"),
    "data.train.input_key": acts("data.prompt_key"),
    "data.train.output_key": acts("data.answer_key"),
    "data.default.input_key": acts("data.prompt_key"),
    "data.default.output_key": acts("data.answer_key"),
    "data.default.prompt_file": acts("data.prompt_file"),
    "data.default.system_prompt_file": acts("data.system_prompt_file"),
    "data.default.processor": inert(vision.PROCESSOR_REASON),
    "data.train.max_samples": acts("data.max_train_rows"),
    "data.train.split": inert("local files are read whole"),
    "data.validation.split": inert("local files are read whole"),
    "data.validation.input_key": inert("the validation rows use the training columns"),
    "data.validation.output_key": inert("the validation rows use the training columns"),
    "data.validation": inert("null: corerl holds data.held_out_size rows of the training data out", _truthy),
    "data.train.split_validation_size": inert("corerl holds data.held_out_size rows (unset: a quarter, at most 32) "
                                              "of the training data out, not a fraction"),
    "data.train.seed": inert("the rows are shuffled with the run's seed (grpo.seed / sft.seed)"),
    "data.split": inert("local files are read whole"),
    "data.seed": inert("the rows are shuffled with the run's seed (grpo.seed / sft.seed)"),
    "data.train_split": inert("local files are read whole"),
    "data.val_split": inert("local files are read whole"),
    # -- env: the environments the episodes are played against --
    "data.env_name": acts("data.env_name", _environment_name),
    "data.default.env_name": acts("data.env_name", _environment_name),
    "data.train.env_name": acts("data.env_name", _environment_name),
    "data.validation.env_name": inert("the held-out rows are played against the training rows' environment"),
    "env.math.num_workers": acts("env.math.num_workers"),
    "env.math.math_verify_impl": acts("env.math.math_verify_impl"),
    "env.math.*": inert("corerl's math environment verifies with math-verify and has no other settings"),
    "env.nemo_gym.*": refused(_NEMO_GYM),
    # -- logger --
    "logger.log_dir": inert("metrics.jsonl and TensorBoard files are written in the run directory"),
    "logger.tensorboard_enabled": acts("logger.tensorboard.enabled"),
    "logger.tensorboard.*": inert("TensorBoard files go to <run dir>/tensorboard"),
    "logger.wandb_enabled": acts("logger.wandb.enabled"),
    "logger.wandb.project": acts("logger.wandb.project"),
    "logger.wandb.name": acts("logger.wandb.name"),
    "logger.wandb.entity": acts("logger.wandb.entity"),
    "logger.wandb.mode": acts("logger.wandb.mode"),  # corerl's own keys, for a laptop without a W&B login
    "logger.wandb.optional": acts("logger.wandb.optional"),
    "logger.wandb.*": inert("a W&B setting corerl's W&B logger does not have (corerl logs metrics and the recipe)"),
    "logger.mlflow_enabled": acts("logger.mlflow.enabled"),
    "logger.mlflow.experiment_name": acts("logger.mlflow.experiment_name"),
    "logger.mlflow.run_name": acts("logger.mlflow.run_name"),
    "logger.mlflow.tracking_uri": acts("logger.mlflow.tracking_uri"),
    "logger.mlflow.optional": acts("logger.mlflow.optional"),
    "logger.mlflow.*": inert("an MLflow setting corerl's MLflow logger does not have"),
    "logger.swanlab_enabled": inert_with_warning("SwanLab logging is not built into corerl yet: the run logs to "
                                              "metrics.jsonl and its other loggers", _truthy),
    "logger.swanlab.*": inert("used only with SwanLab logging"),
    "logger.monitor_gpus": inert("the run reports accelerator memory itself"),
    "logger.gpu_monitoring.*": inert("the run reports accelerator memory itself"),
    "logger.num_val_samples_to_print": inert("no samples are printed"),
}

# sections whose keys are all inert while their ``enabled`` is false (``enabled`` itself acts)
SWITCHED_SECTIONS = {
    "policy.megatron_cfg": True, "policy.dtensor_cfg": True, "policy.dtensor_cfg.lora_cfg": False,
    "policy.megatron_cfg.peft": False, "policy.megatron_cfg.fp8_cfg": False, "policy.dynamic_batching": True,
    "policy.sequence_packing": True, "grpo.reward_scaling": False, "grpo.reward_shaping": False,
    "grpo.async_grpo": True, "policy.draft": False, "ppo.reward_scaling": False, "ppo.reward_shaping": False,
    "ppo.async_ppo": False, "value.megatron_cfg": True, "value.dtensor_cfg": True, "value.dtensor_cfg.lora_cfg": False,
    "value.megatron_cfg.fp8_cfg": False, "value.megatron_cfg.peft": False, "checkpointing": True,
    "policy.reward_model_cfg": True,
}
# on in these sections is refused: corerl has no such feature
UNSUPPORTED_SECTIONS = {
    "policy.draft": "speculative decoding with a draft model is not built into corerl yet",
    "policy.megatron_cfg.fp8_cfg": "FP8 training is not built into corerl yet",
    "value.megatron_cfg.fp8_cfg": "FP8 training is not built into corerl yet",
    "ppo.async_ppo": "asynchronous PPO is not built into corerl yet (asynchronous GRPO is: grpo.async_grpo)",
}


MEGATRON_UNPACKED = ("the megatron backend trains fixed-width unpacked rows (packing is not wired into its pipeline "
                     "schedule): the same loss, less throughput")
UNKNOWN_KEY = "a NeMo RL key corerl does not know: nothing in corerl maps it"
UNKNOWN_HINT = "remove it (docs/migrating-from-nemo-rl.md lists the keys corerl takes)"


def markdown_table() -> str:
    """The rows of ``RULES`` as the Markdown table of ``docs/migrating-from-nemo-rl.md``."""
    lines = ["| NeMo RL key | in corerl |", "| --- | --- |"]
    for key, rule in RULES.items():
        if rule.fate == "acts":
            text = f"acts: `{rule.target}`" + (" (converted)" if rule.convert else "") + (
                f": {rule.reason}" if rule.reason else "")
        elif rule.fate == "derived":
            text = f"acts together with other keys: {rule.reason}" if rule.reason else \
                "acts together with other keys (above)"
        elif rule.fate == "refused":
            text = f"refused: {rule.reason}"
        else:
            text = f"inert: {rule.reason}"
            if rule.refuse_if is not None:
                text += "; another value is refused"
            if rule.warn_if is not None:
                text += "; on, with a warning"
        lines.append(f"| `{key}` | {text} |")
    return "\n".join(lines) + "\n"


def looks_like(raw: dict[str, Any]) -> bool:
    """A NeMo RL recipe: an algorithm section of NeMo RL's (``grpo``, ``ppo``, ``dpo``,
    ``distillation``, ``rm``; ``sft`` in NeMo RL's form), or one of its own top-level sections
    (``loss_fn``, ``teacher``, an evaluation recipe's ``generation``; ``env`` and ``logger`` are
    corerl's too)."""
    sft = raw.get("sft")
    nemo_sft = isinstance(sft, dict) and any(k in sft for k in ("max_num_steps", "max_num_epochs", "val_period"))
    return nemo_sft or any(s in raw for s in ALGORITHM_SECTIONS if s != "sft") or any(
        s in raw for s in NEMO_ONLY_SECTIONS if s not in ("env", "logger"))


def is_eval_recipe(raw: dict[str, Any]) -> bool:
    """NeMo RL's evaluation recipe (examples/configs/evals): ``generation`` at the top level, no policy."""
    return isinstance(raw.get("generation"), dict) and "policy" not in raw


def aliased(path: str) -> str:
    """The corerl path an evaluation recipe's key means: ``generation.x`` is ``policy.generation.x``."""
    return f"policy.{path}" if path.split(".")[0] in EVAL_RECIPE_ALIASES else path


def _leaves(node: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and aliased(path) not in OPAQUE_KEYS:
            out += _leaves(value, f"{path}.")
        else:
            out.append((path, value))
    return out



def nemo_only(path: str) -> bool:
    """Whether ``path`` lies in a section only NeMo RL has (corerl has no key of that name)."""
    return path.split(".")[0] in (*ALGORITHM_SECTIONS, *NEMO_ONLY_SECTIONS) or any(
        path == sub or path.startswith(sub + ".") for sub in NEMO_ONLY_SUBSECTIONS)


def is_env_workers_key(path: str) -> bool:
    """``env.<id>.num_workers``: a key every corerl environment section has."""
    return re.fullmatch(r"env\.[a-z][a-z0-9_]*\.num_workers", path) is not None


def rule_for(path: str) -> Rule | None:
    """The rule of ``path``: its own, else that of the nearest ``prefix.*`` above it. NeMo RL's
    ``ppo`` and ``distillation`` sections share their keys with ``grpo``, ``rm`` with ``dpo``: a
    ``ppo.<key>`` without a rule of its own takes ``grpo.<key>``'s (:data:`SHARED_KEYS`). A
    ``value.<backend>_cfg`` or ``value.optimizer`` key takes the rule of ``policy.<key>``, moved to
    ``critic.<key>`` (see :func:`critic_rule`); an evaluation recipe's ``generation.<key>`` takes
    ``policy.generation.<key>``'s (:func:`aliased`)."""
    found = _own_rule(path)
    section = path.split(".")[0]
    if found is None and section in SHARED_KEYS:
        found = _own_rule(SHARED_KEYS[section] + path[len(section):])
    if found is None and path.startswith(CRITIC_LAYOUTS):
        return critic_rule(path)
    return found


#: the critic's keys that mean what the policy's do, moved from policy.* to critic.*
CRITIC_LAYOUTS = ("value.dtensor_cfg.", "value.megatron_cfg.", "value.optimizer.", "value.optimizer")


def critic_rule(path: str) -> Rule:
    """``value.<key>``: ``policy.<key>``'s rule with its target moved from ``policy.`` to ``critic.``;
    a key the policy passes through goes to ``critic.<key>``."""
    rest = path[len("value."):]
    found = _own_rule("policy." + rest)
    if found is None:
        return acts("critic." + rest)
    if found.fate == "acts" and found.target is not None and found.target.startswith("policy."):
        return attrs.evolve(found, target="critic." + found.target[len("policy."):])
    return found


def _own_rule(path: str) -> Rule | None:
    name = _rule_name(path)
    return None if name is None else RULES[name]


def _rule_name(path: str) -> str | None:
    """The entry of :data:`RULES` that is ``path``'s own: ``path`` itself, else the nearest ``prefix.*``;
    for an evaluation recipe's ``generation.<key>`` without one, ``policy.generation.<key>``'s."""
    for candidate in dict.fromkeys((path, aliased(path))):
        if candidate in RULES:
            return candidate
        parts = candidate.split(".")
        for end in range(len(parts), 0, -1):  # an empty section is a leaf: its own prefix.* applies
            name = ".".join(parts[:end]) + ".*"
            if name in RULES:
                return name
    return None


def _refused_section(path: str) -> str | None:
    """The section whose ``prefix.*`` rule refuses ``path`` (None: a rule of the key's own), named
    as the recipe names it."""
    name = _rule_name(path)
    if name is None or not name.endswith(".*"):
        return None
    return name[:-2] if path.startswith(name[:-2]) else name[len("policy."):-2]


def _switched_off(path: str, raw: dict[str, Any]) -> str | None:
    for section in sorted(SWITCHED_SECTIONS, key=len, reverse=True):
        if path.startswith(section + ".") and value_at(raw, section + ".enabled") is False:
            if path == section + ".enabled" and SWITCHED_SECTIONS[section]:
                return None
            return section
    return None


@attrs.frozen
class Translation:
    """A NeMo RL recipe as a corerl tree, with the origins of its keys and each key's fate."""

    tree: dict[str, Any]
    origins: Origins
    fates: list[KeyFate]
    warnings: list[str]
    #: keys passed through under their own name (corerl's strict validation judges them)
    passthrough: frozenset[str] = frozenset()


class SectionRefused(ConfigError):
    """The refusal of every key a refused ``prefix.*`` section holds, in one line; ``keys`` lists them."""

    def __init__(self, message: str, *, key: str, source: str | None, hint: str) -> None:
        super().__init__(message, key=key, source=source, hint=hint)
        self.keys = [key]


@attrs.define
class _Translator:
    """The corerl tree being built, with what happened to each NeMo RL key on the way."""

    origins: Origins  # of the NeMo RL keys
    tree: dict[str, Any] = attrs.field(factory=dict)
    new_origins: Origins = attrs.field(factory=dict)
    fates: list[KeyFate] = attrs.field(factory=list)
    warnings: list[str] = attrs.field(factory=list)
    errors: list[ConfigError] = attrs.field(factory=list)
    #: section -> its one refusal: a refused section is one line, not one per key
    refused_sections: dict[str, SectionRefused] = attrs.field(factory=dict)

    def put(self, source: str, target: str, value: Any, detail: str | None = None) -> None:
        """Set corerl's ``target`` from NeMo RL's ``source`` key (its fate: acts)."""
        set_at(self.tree, target, value)
        self.new_origins[target] = origin_of(source, self.origins) or "nemo-rl dialect"
        self.fates.append(KeyFate(source, "acts", detail or target))

    def inert(self, source: str, reason: str) -> None:
        self.fates.append(KeyFate(source, "inert", reason))

    def unknown(self, source: str) -> None:
        """A key nothing maps: left out (its fate says so; a warning block lists it)."""
        self.fates.append(KeyFate(source, "unknown", origin_of(source, self.origins) or "override"))

    def refate(self, source: str, fate: Literal["acts", "inert"], detail: str) -> None:
        """Replace what was recorded for ``source`` once other keys have decided its fate."""
        self.fates = [f for f in self.fates if f.key != source] + [KeyFate(source, fate, detail)]

    def make_inert(self, source: str, target: str, value: Any, reason: str) -> None:
        """Undo an acting key whose value has no effect in this recipe: ``target`` gets ``value``."""
        set_at(self.tree, target, value)
        self.refate(source, "inert", reason)

    def refuse(self, path: str, message: str, hint: str) -> None:
        self.errors.append(ConfigError(message, key=path, source=origin_of(path, self.origins), hint=hint))

    def refuse_in_section(self, section: str, path: str, message: str) -> None:
        """Refuse ``path`` for its section's reason: the section's keys share one line (a NeMo Gym
        section holds dozens), keyed by the section once it refuses more than one."""
        error = self.refused_sections.get(section)
        if error is None:
            error = SectionRefused(message, key=path, source=origin_of(path, self.origins), hint="remove the key")
            self.refused_sections[section] = error
            self.errors.append(error)
            return
        error.keys.append(path)
        names = ", ".join(key[len(section) + 1:] for key in error.keys[:3]) + (", ..." if len(error.keys) > 3 else "")
        error.key, error.hint = section, "remove the section"
        error.message = f"{message} ({len(error.keys)} keys under it: {names})"


def translate(raw: dict[str, Any], origins: Origins, strict: bool = False) -> Translation:
    """Translate a resolved NeMo RL tree; every refused key is reported together (exit 2). A
    NeMo RL key nothing maps is left out with an ``unknown`` fate, or with ``strict`` refused."""
    out = _Translator(origins)
    passthrough: set[str] = set()
    algorithm = next((name for name in ("grpo", "ppo", "dpo", "sft", "distillation", "rm") if name in raw), None)
    if algorithm:
        set_at(out.tree, "algorithm.name", algorithm)
        out.new_origins["algorithm.name"] = origin_of(algorithm, origins) or "nemo-rl dialect"
        if algorithm == "sft":
            set_at(out.tree, "sft.enabled", False)
    unpacked = value_at(raw, "policy.megatron_cfg.enabled") is True and value_at(raw, "policy.sequence_packing.enabled") is True
    if unpacked:
        out.warnings.append(f"policy.sequence_packing.enabled=true: {MEGATRON_UNPACKED}")
    played = _played(raw)
    environments = raw.get("env") if isinstance(raw.get("env"), dict) else {}
    if played is None and is_eval_recipe(raw) and len(environments) == 1:
        played = next(iter(environments))  # NeMo RL's evaluation plays its one environment
        set_at(out.tree, "data.env_name", played)
        out.new_origins["data.env_name"] = origin_of(f"env.{played}", origins) or "nemo-rl dialect"
    for path, value in _leaves(raw):
        section = _switched_off(path, raw)
        if section is not None:
            out.inert(path, f"{section}.enabled is false")
            continue
        if unpacked and path.startswith("policy.sequence_packing."):
            out.inert(path, MEGATRON_UNPACKED)
            continue
        if path.endswith(".enabled") and value and path[: -len(".enabled")] in UNSUPPORTED_SECTIONS:
            out.refuse(path, UNSUPPORTED_SECTIONS[path[: -len(".enabled")]], f"set {path}=false")
            continue
        rule = rule_for(path)
        if path.startswith("env.reward_model.") and played != "reward_model":
            out.inert(path, f"env.reward_model is not the environment the recipe plays (data.env_name: {played})")
        elif (vlm_env := vision.vlm_environment_of(path)) is not None and vlm_env != played:
            out.inert(path, f"env.{vlm_env} is not the environment the recipe plays (data.env_name: {played})")
        elif rule is None and is_env_workers_key(path) and (env := path.split(".")[1]) != played:
            out.inert(path, f"env.{env} is not the environment the recipe plays (data.env_name: {played})")
        elif rule is None and is_env_workers_key(path):
            out.put(path, path, value)  # any environment's actors: a key of every env.<id> section
        elif rule is None and nemo_only(aliased(path)):
            if strict:
                out.refuse(path, UNKNOWN_KEY, UNKNOWN_HINT)
            else:
                out.unknown(path)
        elif rule is None:  # the same key in corerl (an evaluation recipe's, under policy): strict validation decides
            out.put(path, aliased(path), value)
            passthrough.add(aliased(path))
        elif rule.fate == "refused" and (refusing := _refused_section(path)) is not None:
            out.refuse_in_section(refusing, path, rule.reason)
        elif rule.fate == "refused":
            out.refuse(path, rule.reason, "remove the key")
        elif rule.fate == "inert":
            if rule.refuse_if is not None and rule.refuse_if(value):
                out.refuse(path, f"{value!r} is not supported: {rule.reason}", "remove the key or use NeMo RL's default")
                continue
            out.inert(path, rule.reason)
            if rule.warn_if is not None and rule.warn_if(value):
                out.warnings.append(f"{path}={value}: {rule.reason}")
        elif rule.fate == "acts":
            assert rule.target is not None
            try:
                out.put(path, rule.target, rule.convert(value) if rule.convert else value)
            except ValueError as exc:
                out.refuse(path, str(exc), "change the value")
    _derived(raw, out, algorithm)
    if out.errors:
        raise ConfigErrors(out.errors)
    return Translation(out.tree, out.new_origins, out.fates, out.warnings, frozenset(passthrough))


def unknown_warning(fates: list[KeyFate], shown: int = 5) -> str | None:
    """One warning block for the keys left out as unknown: their count and the first ``shown``,
    each with its file (None when there are none)."""
    unknown = [f for f in fates if f.fate == "unknown"]
    if not unknown:
        return None
    listed = ", ".join(f"{f.key} ({f.detail})" for f in unknown[:shown])
    more = f", and {len(unknown) - shown} more" if len(unknown) > shown else ""
    return (f"{len(unknown)} NeMo RL key(s) corerl does not know were left out: {listed}{more} (--explain lists "
            "them all; --strict refuses them)")


def _derived(raw: dict[str, Any], out: _Translator, algorithm: str | None) -> None:
    """What several keys decide together: the batch arithmetic, the chat template, the scheduler
    list, the dataset, evaluation and the checkpoints kept, the teacher and reward models."""
    policy = raw.get("policy", {}) if isinstance(raw.get("policy"), dict) else {}
    global_batch = policy.get("train_global_batch_size")
    updates_per_step = 1  # optimizer steps per GRPO step: NeMo RL steps its scheduler once per GRPO step
    if algorithm in SAMPLING_ALGORITHMS and global_batch is not None:
        grpo = raw.get(algorithm, {})
        samples = grpo.get("num_prompts_per_step", 0) * grpo.get("num_generations_per_prompt", 0)
        if samples and (not isinstance(global_batch, int) or global_batch < 1 or samples % global_batch):
            out.refuse("policy.train_global_batch_size",
                       f"{global_batch} sequences per optimizer step do not divide the {samples} a step samples "
                       f"({algorithm}.num_prompts_per_step x num_generations_per_prompt)",
                       "give a divisor of the step's samples")
        elif samples:
            updates_per_step = samples // global_batch
            out.put("policy.train_global_batch_size", "algorithm.optimizer_batch_size", global_batch,
                    f"algorithm.optimizer_batch_size ({updates_per_step} optimizer step(s) per "
                    f"{algorithm.upper()} step)")
    force = value_at(raw, "loss_fn.force_on_policy_ratio")
    if force and updates_per_step > 1:
        out.refuse("loss_fn.force_on_policy_ratio", f"forcing the PPO ratio to 1 over {updates_per_step} optimizer "
                   "steps per GRPO step is not built into corerl yet", "set it to false, or give "
                   "policy.train_global_batch_size all of a step's samples")
    elif force is not None:
        out.inert("loss_fn.force_on_policy_ratio", "with one optimizer step per GRPO step the ratio is 1 already"
                  if force else _DEFAULT_ONLY)
    if global_batch is not None and algorithm not in SAMPLING_ALGORITHMS:
        if algorithm == "sft":
            out.put("policy.train_global_batch_size", "algorithm.batch_size", global_batch)
        elif algorithm in ("dpo", "rm"):  # read as preference pairs per optimizer step
            out.put("policy.train_global_batch_size", "algorithm.batch_size", global_batch,
                    "algorithm.batch_size (pairs per step)")
        else:
            out.inert("policy.train_global_batch_size", "no algorithm section: nothing is trained")
    _dedicated_generation(raw, out)
    _asynchronous(raw, out)
    if value_at(raw, "policy.dtensor_cfg.sequence_parallel") and (
            value_at(raw, "policy.dtensor_cfg.tensor_parallel_size") or 1) == 1 and value_at(
            raw, "policy.dtensor_cfg.enabled") is not False:
        out.make_inert("policy.dtensor_cfg.sequence_parallel", "policy.dtensor_cfg.sequence_parallel", False,
                       "true with tensor_parallel_size 1: no effect in NeMo RL, off in corerl")
    _chat_template(raw, out)
    max_steps = value_at(raw, f"{algorithm}.max_num_steps") if algorithm else None
    _scheduler(policy.get("scheduler"), "policy.scheduler", "policy.scheduler", out, updates_per_step, max_steps)
    if algorithm == "ppo":
        _critic(raw, out, updates_per_step, max_steps)
    keys = ["data.dataset_name", "data.train.dataset_name", "data.validation.dataset_name", "data.default.dataset_name"]
    names = [(key, value_at(raw, key)) for key in keys if value_at(raw, key)]
    if value_at(out.tree, "data.train_files") is not None and algorithm in ("dpo", "rm"):
        set_at(out.tree, "data.task", "preferences")  # prompt/chosen/rejected rows (data.*_key rename them)
        for key, name in names:
            out.inert(key, f"{name!r}: the local files given replace it")
    elif value_at(out.tree, "data.train_files") is not None:
        set_at(out.tree, "data.task", "dataset")
        # NeMo RL's response datasets read the columns input and output unless told otherwise
        for key, column in (("data.prompt_key", "input"), ("data.answer_key", "output")):
            if value_at(out.tree, key) is None:
                set_at(out.tree, key, column)
                out.new_origins[key] = "nemo-rl dialect (NeMo RL's default column)"
        for key, name in names:
            out.inert(key, f"{name!r}: the local files given replace it")
    elif names:
        set_at(out.tree, "data.task", "preferences" if algorithm in ("dpo", "rm") else "dataset")
        (first, name), *others = names  # the first name given is the one refused at run start
        out.put(first, "data.hub_dataset", str(name))
        out.fates += [KeyFate(key, "acts", "data.hub_dataset") for key, _ in others]
    _checkpoint_ranking(raw, out, algorithm, _evaluation(raw, out, algorithm))
    length = value_at(raw, "policy.max_total_sequence_length") or 0
    _frozen_model(raw, out, "teacher", "the teacher", {
        "tokenizer.name": (_always, "the teacher scores the student's token ids: at run start corerl checks that the "
                                    "teacher's checkpoint maps every token as the student's tokenizer does", ""),
        "max_total_sequence_length": (lambda value: value is None or value >= length,
                                      "the teacher scores the student's sequences, at most "
                                      "policy.max_total_sequence_length tokens",
                                      "shorter than policy.max_total_sequence_length: the teacher scores the "
                                      "student's whole sequences")}, own_layout="algorithm.distillation.teacher_overrides")
    _reward_model_environment(raw, out)
    _reward_model_policy(raw, out, algorithm)
    _eval_recipe(raw, out)
    _vision(raw, out)


def _chat_template(raw: dict[str, Any], out: _Translator) -> None:
    """NeMo RL's ``tokenizer.chat_template``: a template formats every prompt (``default``: the
    tokenizer's own); null is its passthrough template, the prompt as it is."""
    key = "tokenizer" if is_eval_recipe(raw) else "policy.tokenizer"
    tokenizer = value_at(raw, key)
    if not isinstance(tokenizer, dict) or "chat_template" not in tokenizer:
        return
    template, key = tokenizer["chat_template"], f"{key}.chat_template"
    if isinstance(template, str) and template.lower() == "default":
        out.put(key, "data.apply_chat_template", True, "data.apply_chat_template (the tokenizer's own template)")
    elif template:
        out.put(key, "policy.chat_template", template, "policy.chat_template, data.apply_chat_template")
        set_at(out.tree, "data.apply_chat_template", True)
    else:
        out.inert(key, "null: NeMo RL's passthrough template, the prompt as it is (no chat template)")


_NO_EVALUATION = "no evaluation during training (val_period); the held-out reward is reported before and after it"


def _evaluation(raw: dict[str, Any], out: _Translator, algorithm: str | None) -> int | None:
    """NeMo RL's validation during training (``<algorithm>.val_period`` and the keys beside it) as
    corerl's ``eval`` section, for the algorithms it validates by sampling answers, except while
    GRPO runs asynchronously (corerl then evaluates only before and after training). Returns the
    answers a prompt each evaluation samples (None: no evaluation during training)."""
    section = raw.get(algorithm) if algorithm in SAMPLING_ALGORITHMS else None
    section = section if isinstance(section, dict) else {}
    period = section.get("val_period")
    every = period if type(period) is int and period > 0 else None
    if every is not None and value_at(out.tree, "algorithm.async.enabled") is True:
        reason = ("asynchronous GRPO's generation runs ahead of training, so corerl evaluates only before and after "
                  "it")
        out.inert(f"{algorithm}.val_period", reason)
        out.warnings.append(f"{algorithm}.val_period={period}: {reason}")
        every = None
    elif every is not None:
        out.put(f"{algorithm}.val_period", "eval.every_n_steps", every)
    elif "val_period" in section:
        out.inert(f"{algorithm}.val_period", f"{period}: {_NO_EVALUATION}")
    named = [key for key in ("val_num_generations_per_prompt", "num_val_generations_per_prompt") if key in section]
    samples = (section[named[0]] if named else None) or 1  # NeMo RL's default: one answer a prompt
    for key, target, value in [("val_at_start", "eval.at_start", section.get("val_at_start")),
                               *((name, "eval.num_samples", samples) for name in named[:1])]:
        if key in section and every is not None:
            out.put(f"{algorithm}.{key}", target, value)
        elif key in section:
            out.inert(f"{algorithm}.{key}", _NO_EVALUATION)
    for name in named[1:]:
        out.inert(f"{algorithm}.{name}", f"{named[0]} is given")
    if every is not None and not named:
        set_at(out.tree, "eval.num_samples", 1)
        out.new_origins["eval.num_samples"] = "nemo-rl dialect (NeMo RL's default: one validation answer a prompt)"
    _validation_sampling(raw, out, every is not None)
    return samples if every is not None else None


def _validation_sampling(raw: dict[str, Any], out: _Translator, evaluates: bool) -> None:
    """``generation.val_temperature``, ``val_top_p``, ``val_top_k``: with evaluation during
    training the temperature is ``eval.temperature``; evaluation samples with the generation's
    top_p and top_k, so another value is refused where the recipe evaluates (an evaluation recipe
    always does, at its generation's temperature too)."""
    recipe = is_eval_recipe(raw)
    prefix = "generation" if recipe else "policy.generation"
    generation = value_at(raw, prefix)
    if not isinstance(generation, dict):
        return
    for name in ("temperature", "top_p", "top_k"):
        key, value, own = f"{prefix}.val_{name}", generation.get(f"val_{name}"), generation.get(name)
        if f"val_{name}" not in generation:
            continue
        if name == "temperature" and evaluates:
            out.put(key, "eval.temperature", value)
        elif (evaluates or recipe) and value != own:
            out.refuse(key, f"{value!r} differs from {prefix}.{name} ({own!r}): corerl samples evaluation answers "
                            f"with {prefix}.{name}", f"give {prefix}.{name}'s value")
        else:
            out.inert(key, f"the same as {prefix}.{name}" if evaluates or recipe else _NO_EVALUATION)


#: NeMo RL's checkpoint metrics (``val:<name>``, ``train:<name>``) and the corerl metric each is
VALIDATION_METRICS = {"accuracy": "eval/mean@{n}", "total_reward/mean": "eval/mean@{n}", "pass_k": "eval/pass@{n}"}
TRAINING_METRICS = {"loss": "loss", "reward": "reward/mean", "total_reward/mean": "reward/mean"}


def _checkpoint_ranking(raw: dict[str, Any], out: _Translator, algorithm: str | None, samples: int | None) -> None:
    """NeMo RL's ``checkpointing.metric_name``, ``higher_is_better`` and ``keep_top_k``: the best
    ``keep_top_k`` checkpoints by a metric corerl logs too (and the newest), else the newest
    ``keep_top_k`` (NeMo RL's own order where the metric is never logged). ``samples``: the
    answers a prompt each evaluation during training samples (None: no such evaluation)."""
    checkpointing = raw.get("checkpointing")
    if not isinstance(checkpointing, dict) or _switched_off("checkpointing.keep_top_k", raw):
        return  # checkpoints off: the loop made every key inert
    name, keep = checkpointing.get("metric_name"), checkpointing.get("keep_top_k")
    kind, _, metric = str(name).partition(":")
    period = value_at(raw, f"{algorithm}.val_period")
    validated = type(period) is int and period > 0  # NeMo RL logs val: metrics during training
    target = (VALIDATION_METRICS[metric].format(n=samples) if kind == "val" and metric in VALIDATION_METRICS
              and samples is not None else TRAINING_METRICS.get(metric) if kind == "train" else None)
    if target is not None and keep is not None:
        out.put("checkpointing.metric_name", "checkpointing.metric_name", target,
                f"checkpointing.metric_name ({target})")
        out.put("checkpointing.keep_top_k", "checkpointing.keep_top_k", keep)
        if "higher_is_better" in checkpointing:
            out.put("checkpointing.higher_is_better", "checkpointing.higher_is_better",
                    checkpointing["higher_is_better"])
        return
    if keep is not None:
        out.put("checkpointing.keep_top_k", "checkpointing.keep_last", keep,
                f"checkpointing.keep_last (the newest {keep})")
    elif "keep_top_k" in checkpointing:
        out.inert("checkpointing.keep_top_k", "null: NeMo RL keeps every checkpoint; corerl keeps "
                                              "checkpointing.keep_last")
    if name is None or (kind == "val" and not validated):
        why = "NeMo RL logs no such metric in this recipe either, so it too keeps the newest checkpoints"
    elif kind == "val" and metric in VALIDATION_METRICS:
        why = "corerl does not evaluate during this run, so the newest checkpoints are kept"
    else:
        why = "corerl logs no such metric during training, so the newest checkpoints are kept"
    for key in ("metric_name", "higher_is_better"):
        if key in checkpointing:
            out.inert(f"checkpointing.{key}", f"{name}: {why}")
    if name is not None and keep is not None and not why.startswith("NeMo RL"):
        out.warnings.append(f"checkpointing.metric_name={name}: {why} (the newest {keep}, not the best {keep})")


#: a frozen model's settings that only training or generation read
FROZEN_INERT = ("optimizer", "scheduler", "generation", "train_global_batch_size", "train_micro_batch_size",
                "generation_batch_size", "max_grad_norm", "offload_optimizer_for_logprob",
                "activation_checkpointing_enabled", "make_sequence_length_divisible_by", "logprob_chunk_size",
                "dynamic_batching", "sequence_packing", "dtensor_cfg._v2", "dtensor_cfg.activation_checkpointing",
                "dtensor_cfg.lora_cfg", "dtensor_cfg.clear_cache_every_n_steps", "megatron_cfg.optimizer",
                "megatron_cfg.scheduler", "megatron_cfg.activation_checkpointing", "megatron_cfg.peft",
                "megatron_cfg.distributed_data_parallel_config", "megatron_cfg.checkpoint", "megatron_cfg.train_iters",
                "megatron_cfg.empty_unused_memory_level", "megatron_cfg.force_reconvert_from_hf")


def _under(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == prefix or path.startswith(prefix + ".") for prefix in prefixes)


def _always(_: Any) -> bool:
    return True


def _frozen_model(raw: dict[str, Any], out: _Translator, section: str, what: str,
                  own: dict[str, tuple[Callable[[Any], bool], str, str]], own_layout: str | None = None) -> None:
    """The keys of ``section``, a frozen model beside the policy (NeMo RL's teacher, its reward
    model environment), that no rule of their own names. What only training or generation reads is
    inert; a key of ``own`` (test, why it is inert, why it is refused) is inert where its test
    passes; any other key must equal the policy's, since corerl runs ``what`` on the policy's
    training backend with the policy's layout and settings, unless ``own_layout`` names where
    corerl takes the frozen model's own ``policy`` keys (the teacher's
    ``algorithm.distillation.teacher_overrides``): a differing key whose policy twin acts on a
    ``policy.*`` key goes there. The keys that still differ are refused together, in one line."""
    tree = value_at(raw, section)
    if not isinstance(tree, dict):
        return
    differing: list[tuple[str, str]] = []
    for rest, value in _leaves(tree):
        path, policy_path = f"{section}.{rest}", f"policy.{rest}"
        if _rule_name(path) != f"{section}.*":
            continue  # a rule of its own: judged in the loop
        off = _switched_off(policy_path, {"policy": tree})
        test, reason, refusal = next((own[key] for key in own if _under(rest, (key,))), (None, "", ""))
        if off is not None:
            out.inert(path, f"{section}{off[len('policy'):]}.enabled is false")
        elif _under(rest, FROZEN_INERT):
            out.inert(path, f"{what} is frozen and only scores: what training and generation read does nothing")
        elif test is not None and test(value):
            out.inert(path, reason)
        elif test is None and value == value_at(raw, policy_path):
            out.inert(path, f"the same as {policy_path}")
        elif test is None and own_layout is not None and (target := _policy_target(policy_path, value)) is not None:
            out.put(path, f"{own_layout}.{target[0]}", target[1])
        else:
            differing.append((path, f"{value!r}: {refusal}" if test is not None else
                              f"{value!r}, the policy's {value_at(raw, policy_path)!r}"))
    if len(differing) == 1:
        (path, detail), = differing
        out.refuse(path, f"{detail}: corerl runs {what} with the policy's layout and settings",
                   "give the policy's value, or remove the key")
    elif differing:
        listed = ", ".join(f"{path[len(section) + 1:]} ({detail})" for path, detail in differing)
        out.refuse(section, f"{len(differing)} keys differ from the policy's: {listed}; corerl runs {what} with the "
                            "policy's layout and settings", "give the policy's values, or remove the keys")


def _policy_target(policy_path: str, value: Any) -> tuple[str, Any] | None:
    """The corerl ``policy.*`` key and value NeMo RL's ``policy_path`` acts on: a key without a rule
    passes through under its own name (validation judges it); None where it acts elsewhere, or
    does not act."""
    rule = rule_for(policy_path)
    if rule is None:
        return (policy_path, value) if not nemo_only(policy_path) else None
    if rule.fate != "acts" or rule.target is None or not rule.target.startswith("policy."):
        return None
    try:
        return rule.target, rule.convert(value) if rule.convert is not None else value
    except ValueError:
        return None


ENV_NAME_KEYS = ("data.env_name", "data.default.env_name", "data.train.env_name")


def _played(raw: dict[str, Any]) -> Any:
    """The environment a recipe names (NeMo RL's data.env_name, or its default or train dataset's)."""
    return next((value_at(raw, key) for key in ENV_NAME_KEYS if value_at(raw, key)), None)


def _reward_model_environment(raw: dict[str, Any], out: _Translator) -> None:
    """NeMo RL's reward-model environment (``env_name: reward_model``): no environment in corerl,
    a Bradley-Terry ``reward_model`` scoring the samples (``env.reward_model.model_name``), frozen
    on the policy's training backend with the policy's layout."""
    source = next((key for key in ENV_NAME_KEYS if value_at(raw, key)), None)
    if source is None or _played(raw) != "reward_model":
        return
    _frozen_model(raw, out, "env.reward_model", "the reward model", {
        "tokenizer.name": (_always, "corerl's reward model reads the policy's token ids (a warning says so)", ""),
        "processor": (_always, "the data processor of NeMo RL's datasets; corerl's dataset task formats rows itself",
                      ""),
        "resources": (_always, "corerl's reward model shares the policy's devices (reward_model.cpu_offload keeps it "
                               "in CPU memory between scorings)", ""),
        "max_model_len": (_always, "corerl's reward model scores each whole sample, at most policy.max_seq_length "
                                   "tokens", ""),
        "checkpoint_path": (lambda path: path is None, "null: the weights of model_name",
                            "corerl loads the reward model from model_name")})
    drop_at(out.tree, "data.env_name")
    out.new_origins.pop("data.env_name", None)
    set_at(out.tree, "reward_model.kind", "bradley_terry")
    out.new_origins["reward_model.kind"] = origin_of(source, out.origins) or "nemo-rl dialect"
    out.refate(source, "acts", "reward_model.kind (bradley_terry): env.reward_model.model_name scores the samples")
    out.warnings.append(f"{source}=reward_model: corerl's reward model scores the prompt and completion token ids "
                        "the policy wrote, without a chat template of its own, so its tokenizer must give the "
                        "policy's ids (NeMo RL's environment re-encodes the conversation with the reward model's)")


def _reward_model_policy(raw: dict[str, Any], out: _Translator, algorithm: str | None) -> None:
    """``policy.reward_model_cfg.enabled``: the rm section's reward model, refused elsewhere."""
    key = "policy.reward_model_cfg.enabled"
    if not isinstance(value_at(raw, "policy.reward_model_cfg"), dict) or "enabled" not in raw["policy"][
            "reward_model_cfg"]:
        return
    if value_at(raw, key) and algorithm != "rm":
        out.refuse(key, f"a reward model is trained by NeMo RL's rm section (algorithm.name=rm), not by {algorithm}",
                   "remove it, or train the reward model with an rm section")
    elif algorithm == "rm" and not value_at(raw, key):
        out.refuse(key, "an rm section trains a reward model (a score head on the policy's model)", "set it to true")
    else:
        out.inert(key, "algorithm.name=rm trains a score head on the policy's model" if algorithm == "rm" else
                  "false: the policy is a language model")


def _eval_recipe(raw: dict[str, Any], out: _Translator) -> None:
    """An evaluation recipe's engine length and precision are the policy's (it has no policy), and
    a local file given is the evaluation set: all of it is held out (``corerl eval`` scores it)."""
    if not is_eval_recipe(raw):
        return
    files = value_at(out.tree, "data.train_files")
    if files is not None and value_at(out.tree, "data.held_out_files") is None:
        set_at(out.tree, "data.held_out_files", files)
        out.new_origins["data.held_out_files"] = "nemo-rl dialect (an evaluation recipe evaluates its whole file)"
    for key, target in (("generation.vllm_cfg.max_model_len", "policy.max_seq_length"),
                        ("generation.vllm_cfg.precision", "policy.precision")):
        value = value_at(raw, key)
        if value is not None:
            set_at(out.tree, target, value)
            out.new_origins[target] = origin_of(key, out.origins) or "nemo-rl dialect"
            detail = next((f.detail for f in out.fates if f.key == key and f.fate == "acts"), None)
            out.refate(key, "acts", f"{detail}, {target}" if detail else target)


def _vision(raw: dict[str, Any], out: _Translator) -> None:
    """A vision-language recipe (:func:`nemo_rl_vision.marker`): its Hub model must be of a Qwen-VL
    image family, its datasets not audio or video ones, and it trains on dtensor (megatron's VLM
    path is refused in one line). vLLM's image limit goes to the engine's arguments in any recipe."""
    _image_limit(raw, out)
    if vision.marker(raw) is None:
        return
    key = vision.model_key(raw)
    why = vision.model_refusal(value_at(raw, key))
    if why is not None:
        out.refuse(key, why, vision.MODEL_HINT)
    for name_key in vision.DATASET_KEYS:
        name = value_at(raw, name_key)
        if vision.is_audio_video_dataset(name):
            out.refuse(name_key, f"{name!r} is an audio or audio-visual dataset: {vision.AUDIO_VIDEO}",
                       "give an image dataset (a local JSONL/Parquet file with an image column, data.image_key)")
    megatron_refused = any(error.message.startswith(vision.MEGATRON_VLM) for error in out.errors)
    if value_at(raw, "policy.megatron_cfg.enabled") is True and not megatron_refused:
        out.refuse("policy.megatron_cfg.enabled", vision.MEGATRON_VLM, vision.MEGATRON_VLM_HINT)


def _image_limit(raw: dict[str, Any], out: _Translator) -> None:
    """``vllm_cfg.limit_mm_per_prompt.image``: vLLM's engine argument, merged into
    ``policy.generation.vllm_cfg.engine_args`` (with what ``vllm_kwargs`` gave)."""
    prefix = "generation" if is_eval_recipe(raw) else "policy.generation"
    source = f"{prefix}.vllm_cfg.limit_mm_per_prompt.image"
    limit = value_at(raw, source)
    if limit is None or _switched_off(source, raw):
        return
    target = "policy.generation.vllm_cfg.engine_args.limit_mm_per_prompt"
    given = value_at(out.tree, target)
    out.put(source, target, {**(given if isinstance(given, dict) else {}), "image": limit},
            f"{target}.image")


LINEAR_LR, CONSTANT_LR = "torch.optim.lr_scheduler.LinearLR", "torch.optim.lr_scheduler.ConstantLR"


def _scheduler(scheduler: Any, source: str, target: str, out: _Translator, updates_per_step: int,
               max_steps: Any = None) -> None:
    """NeMo RL's list of torch schedulers at ``source`` as corerl's schedule at ``target``: an
    optional LinearLR warm-up (ending at factor 1), then a constant rate (ConstantLR, or nothing) or
    one LinearLR decay from 1 to 0 that ends at the run's last step (``max_steps``, NeMo RL's
    ``max_num_steps``: corerl's linear decay reaches zero there); any other list is refused."""
    if scheduler is None:
        return
    if not isinstance(scheduler, list):
        out.refuse(source, "expected NeMo RL's list of torch schedulers",
                   f"write a list, or corerl's {target}.name and warmup_steps in a corerl recipe")
        return
    named = [s for s in scheduler if isinstance(s, dict) and "name" in s]  # the milestones entry has no name

    def factors(entry: dict[str, Any]) -> tuple[float, float, int]:
        kwargs = entry.get("kwargs") or {}
        return (float(kwargs.get("start_factor", 1 / 3)), float(kwargs.get("end_factor", 1.0)),
                int(kwargs.get("total_iters", 5)))  # torch's LinearLR defaults

    warmup = named[:1] if named and named[0]["name"] == LINEAR_LR and factors(named[0])[1] == 1.0 else []
    warmup_iters = factors(warmup[0])[2] if warmup else 0
    rest = named[len(warmup):]
    name, why = "constant", ""
    if all(s["name"] == CONSTANT_LR for s in rest):
        pass
    elif len(rest) == 1 and rest[0]["name"] == LINEAR_LR and factors(rest[0])[:2] == (1.0, 0.0):
        decay_iters = factors(rest[0])[2]
        if updates_per_step > 1:  # the backends' schedules span max_steps optimizer steps
            why = (f"a LinearLR decay with {updates_per_step} optimizer steps per algorithm step is not translated "
                   "(corerl's linear schedule spans algorithm.max_steps optimizer steps)")
        elif isinstance(max_steps, int) and max_steps > 0 and warmup_iters + decay_iters == max_steps:
            name = "linear"
        else:
            why = (f"its LinearLR decay ends after {warmup_iters} + {decay_iters} steps, not at the run's last step "
                   f"({max_steps}), where corerl's linear schedule reaches zero")
    else:
        why = "only a LinearLR warm-up, then a constant rate or one LinearLR decay to zero, is translated"
    if why:
        out.refuse(source, why, f"write corerl's {target}.name (constant, linear, cosine) and warmup_steps")
        return
    # NeMo RL counts warm-up in algorithm steps; corerl's scheduler counts optimizer steps
    steps = warmup_iters * updates_per_step
    out.put(source, target, {"name": name, "warmup_steps": steps},
            f"{target} ({name}, warmup_steps={steps} optimizer steps)")


def _critic(raw: dict[str, Any], out: _Translator, updates_per_step: int, max_steps: Any) -> None:
    """NeMo RL's ``value`` section and PPO's GAE lambdas: what several keys decide together
    (``max_steps``: ``ppo.max_num_steps``, where the critic's schedule ends too)."""
    estimator = value_at(raw, "ppo.adv_estimator") or {}
    policy_lam, lam = estimator.get("gae_lambda_policy"), estimator.get("gae_lambda")
    if policy_lam is not None:  # VAPO's decoupled GAE: the policy's lambda apart from the value targets'
        out.put("ppo.adv_estimator.gae_lambda_policy", "algorithm.ppo.lam", policy_lam)
        if lam is not None:
            out.inert("ppo.adv_estimator.gae_lambda", "gae_lambda_policy is given: it is the policy's lambda")
    else:
        if lam is not None:
            out.put("ppo.adv_estimator.gae_lambda", "algorithm.ppo.lam", lam)
        if "gae_lambda_policy" in estimator:
            out.inert("ppo.adv_estimator.gae_lambda_policy", "null: gae_lambda is the policy's lambda")
    value = raw.get("value")
    if not isinstance(value, dict):
        return
    policy = raw.get("policy") if isinstance(raw.get("policy"), dict) else {}
    name = value.get("model_name")
    if "model_name" in value:
        if name in (None, policy.get("model_name")):
            out.inert("value.model_name", "the policy's model: the critic starts from the policy's starting weights "
                                          "with a zero value head, as NeMo RL's value model does")
        else:
            out.refuse("value.model_name", f"a critic from another model ({name}) than the policy's is not translated: "
                       "corerl's critic.model_name takes a value model (a one-label token classifier)",
                       "remove it, or set critic.model_name to a value-model checkpoint in a corerl recipe")
    for key, what in (("train_global_batch_size", "trains on the policy's optimizer batches"),
                      ("max_total_sequence_length", "reads the policy's rows"),
                      ("precision", "runs in the policy's precision")):
        if key not in value:
            continue
        if value[key] in (None, policy.get(key)):
            out.inert(f"value.{key}", f"the critic {what} (the same value as policy.{key})")
        else:
            out.refuse(f"value.{key}", f"{value[key]!r} differs from policy.{key} ({policy.get(key)!r}): the critic "
                       f"{what}", f"give the policy's value or remove value.{key}")
    _scheduler(value.get("scheduler"), "value.scheduler", "critic.scheduler", out, updates_per_step, max_steps)


def _asynchronous(raw: dict[str, Any], out: _Translator) -> None:
    """NeMo RL's two asynchronous forms: ``grpo.async_grpo`` (in-flight updates on or off, the KV
    cache kept or recomputed after one) and HEAD's ``async_rl`` section (its presence turns the
    asynchronous loop on). Requests in progress at an update: ``wait`` (in-flight updates off),
    ``continue`` (on, KV cache kept), ``abort`` (on, recomputed: corerl resumes each request from
    its tokens under the new weights)."""
    section = value_at(raw, "async_rl")
    if isinstance(section, dict):
        set_at(out.tree, "algorithm.async.enabled", True)
        out.new_origins["algorithm.async.enabled"] = origin_of("async_rl", out.origins) or "nemo-rl dialect"
        recompute = section.get("recompute_kv_cache_after_weight_updates")
        if "recompute_kv_cache_after_weight_updates" in section:
            out.put("async_rl.recompute_kv_cache_after_weight_updates", "algorithm.async.in_flight",
                    "abort" if recompute else "continue")
        return
    grpo = value_at(raw, "grpo.async_grpo")
    if not isinstance(grpo, dict) or not grpo.get("enabled"):
        return
    in_flight, recompute = grpo.get("in_flight_weight_updates"), grpo.get("recompute_kv_cache_after_weight_updates")
    mode = "wait" if not in_flight else "abort" if recompute else "continue"
    for key in ("in_flight_weight_updates", "recompute_kv_cache_after_weight_updates"):
        if key in grpo:
            out.put(f"grpo.async_grpo.{key}", "algorithm.async.in_flight", mode, f"algorithm.async.in_flight ({mode})")


def _dedicated_generation(raw: dict[str, Any], out: _Translator) -> None:
    """NeMo RL's ``cluster`` counts generation's GPUs too: with dedicated generation, training
    gets what the generation resources leave (whole nodes on a multi-node cluster, else GPUs of
    the one node); corerl's ``cluster`` is the training workers alone."""
    colocated = value_at(raw, "policy.generation.colocated")
    if not isinstance(colocated, dict) or colocated.get("enabled") is not False:
        return
    resources = colocated.get("resources") or {}
    nodes = value_at(raw, "cluster.num_nodes") or 1
    gpus = value_at(raw, "cluster.gpus_per_node") or 1
    key = "policy.generation.colocated.resources"
    # what generation takes: whole nodes of a multi-node cluster, else GPUs of the one node
    unit, total, noun = ("num_nodes", nodes, "node") if nodes > 1 else ("gpus_per_node", gpus, "GPU")
    taken = resources.get(unit)
    if not taken or taken >= total:
        out.refuse(f"{key}.{unit}", f"{taken} generation {noun}(s) of the cluster's {total}: training needs at least "
                   f"one {noun}", f"give 1 to {total - 1} {noun}s to generation")
        return
    set_at(out.tree, f"cluster.{unit}", total - taken)
    set_at(out.tree, f"{key}.num_nodes", taken if nodes > 1 else 1)
    set_at(out.tree, f"{key}.gpus_per_node", (resources.get("gpus_per_node") or gpus) if nodes > 1 else taken)
    out.refate("policy.generation.colocated.enabled", "acts",
               "policy.generation.colocated.enabled; cluster.* less the generation resources")
