"""SkyRL's ``trainer.*`` but its algorithm (:mod:`.algorithm`) and its engines' sections (the
plugins' ``DialectSection(dialect="skyrl")``): the model, optimizer, batch sizes, placement,
evaluation, checkpoints and logging. The batch sizes, step counts, evaluation, checkpoints and
placement are decided together (:mod:`corerl.config.dialects.skyrl.derived`)."""

from __future__ import annotations

from typing import Any

from corerl.config.dialects.rules import Rule, _truthy, acts, derived, inert, refused

_PERF = "a memory or speed switch of SkyRL's: the same updates; corerl leaves the choice to its backend"

_T = "trainer."
_LOG = "SkyRL's logging and bookkeeping; corerl logs each step's metrics under run.output_dir"
_OFF = "a switch SkyRL leaves off by default; corerl has no such feature, so only false is accepted"
_PLACEMENT = ("derived: corerl lays the policy, reference and generation out over cluster.num_nodes x "
              "cluster.gpus_per_node")


def _scheduler(name: Any) -> str:
    """SkyRL's ``optimizer_config.scheduler`` (a transformers schedule) as corerl's scheduler."""
    known = {"constant_with_warmup": "constant", "constant": "constant", "linear": "linear", "cosine": "cosine"}
    if name not in known:
        raise ValueError(f"the {name!r} learning-rate schedule is not built into corerl (constant_with_warmup, "
                         "constant, linear and cosine are)")
    return known[name]


def _token_budget(value: Any) -> dict[str, Any]:
    """SkyRL's ``max_tokens_per_microbatch`` as corerl's ``policy.dynamic_batching`` (-1: off)."""
    if not isinstance(value, int) or isinstance(value, bool) or value == 0 or value < -1:
        raise ValueError(f"{value!r} is not a token budget: give a count above 0, or -1 (off)")
    return {"enabled": False} if value == -1 else {"enabled": True, "train_mb_tokens": value,
                                                   "logprob_mb_tokens": value}


def _lora_targets(value: Any) -> list[str]:
    return [] if value in (None, "all-linear") else ([value] if isinstance(value, str) else list(value))


def _model(prefix: str, target: str) -> dict[str, Rule]:
    """A model's section (``trainer.policy``, ``trainer.critic``): its checkpoint, optimizer and LoRA."""
    return {
        f"{prefix}.optimizer_config.lr": acts(f"{target}.optimizer.lr"),
        f"{prefix}.optimizer_config.adam_betas": acts(f"{target}.optimizer.betas"),
        f"{prefix}.optimizer_config.weight_decay": acts(f"{target}.optimizer.weight_decay"),
        f"{prefix}.optimizer_config.max_grad_norm": acts(f"{target}.max_grad_norm"),
        f"{prefix}.optimizer_config.num_warmup_steps": acts(f"{target}.scheduler.warmup_steps"),
        f"{prefix}.optimizer_config.scheduler": acts(f"{target}.scheduler.name", _scheduler,
                                                     "constant_with_warmup: constant after warmup_steps"),
        f"{prefix}.optimizer_config.offload_after_step": inert(_PERF),
        f"{prefix}.sequence_parallel_size": inert("corerl shards long sequences with the backend's context "
                                                  "parallelism (its own section), not Ulysses", lambda v: v != 1),
        f"{prefix}.model_config_kwargs": acts("policy.hf_config_overrides"),
        f"{prefix}.use_torch_compile": inert(_PERF),
        f"{prefix}.record_memory": inert(_LOG),
        f"{prefix}.torch_profiler_config.*": inert("SkyRL's profiler; CORERL_PROFILE profiles a corerl run"),
        f"{prefix}.language_model_only": inert("corerl loads the model's language part for text prompts"),
        f"{prefix}.inference_only_init": inert(_PERF),
        f"{prefix}.model.fake_int4_qat.*": refused("fake int4 quantisation-aware training is not built into corerl"),
        f"{prefix}.model.fake_int4_qat": refused("fake int4 quantisation-aware training is not built into corerl"),
        f"{prefix}.model.lora.lora_sync_path": inert("corerl hands LoRA weights to generation in memory"),
        f"{prefix}.model.lora.max_loras": inert(_PERF),
        f"{prefix}.model.lora.max_cpu_loras": inert(_PERF),
    }


RULES: dict[str, Rule] = {
    _T + "policy.model.path": acts("policy.model_name"),
    **_model(_T + "policy", "policy"),
    _T + "policy.model.lora.rank": derived("above 0: policy.lora.enabled and policy.lora.dim"),
    _T + "policy.model.lora.alpha": acts("policy.lora.alpha"),
    _T + "policy.model.lora.dropout": acts("policy.lora.dropout"),
    _T + "policy.model.lora.target_modules": acts("policy.lora.target_modules", _lora_targets,
                                                  "all-linear: every linear layer"),
    _T + "policy.model.lora.exclude_modules": acts("policy.lora.exclude_modules", _lora_targets),
    _T + "policy.model.lora.init_method": inert("PEFT initialises the adapters (kaiming A, zero B)"),
    # the reference model: the policy's initial weights, frozen
    _T + "ref.model.path": derived("unset or the policy's checkpoint: the reference is the policy's initial "
                                   "weights; another checkpoint is refused"),
    _T + "ref.sequence_parallel_size": inert("the reference scores with the policy's layout"),
    _T + "ref.model_config_kwargs": inert("the reference is the policy's checkpoint (its overrides apply)"),
    _T + "ref.language_model_only": inert("the reference is the policy's checkpoint"),
    _T + "ref.model.lora.*": inert("the reference is the policy's initial weights: LoRA is the policy's"),
    _T + "ref.model.fake_int4_qat": inert("the reference only scores"),
    _T + "ref.model.fake_int4_qat.*": inert("the reference only scores"),
    # the critic (PPO: advantage_estimator gae)
    _T + "critic.model.path": acts("critic.model_name"),
    **_model(_T + "critic", "critic"),
    _T + "critic.model.lora.*": inert("the critic trains whole in corerl (LoRA is the policy's)"),
    _T + "critic.model_config_kwargs": inert("the critic starts from its checkpoint as it is", _truthy),
    _T + "critic.use_torch_compile": inert(_PERF),
    # batch sizes, steps, evaluation
    _T + "train_batch_size": acts("algorithm.batch_size"),
    _T + "policy_mini_batch_size": derived("prompts per optimizer step: algorithm.optimizer_batch_size = "
                                           "policy_mini_batch_size x generator.n_samples_per_prompt sequences"),
    _T + "critic_mini_batch_size": derived("PPO: the critic's optimizer steps follow the policy's"),
    _T + "micro_train_batch_size_per_gpu": acts("policy.train_micro_batch_size"),
    _T + "micro_forward_batch_size_per_gpu": acts("policy.logprob_micro_batch_size"),
    _T + "max_tokens_per_microbatch": acts("policy.dynamic_batching", _token_budget,
                                           "above 0: enabled, train and logprob micro-batches of at most that many "
                                           "tokens (corerl counts a micro-batch's rows x its longest row, SkyRL its "
                                           "unpadded tokens: other cuts, the same updates); -1: off"),
    _T + "update_epochs_per_batch": acts("algorithm.optimization_passes"),
    _T + "epochs": derived("without max_training_steps: the steps of that many epochs, counted from the training "
                           "rows (algorithm.max_steps)"),
    _T + "max_training_steps": acts("algorithm.max_steps"),
    _T + "num_dummy_steps": derived("the full_context entry point's steps: algorithm.max_steps"),
    _T + "seed": acts("algorithm.seed"),
    _T + "eval_interval": derived("above 0: eval.every_n_steps; 0 or less: no evaluation during training"),
    _T + "eval_before_train": derived("with eval_interval: eval.at_start"),
    _T + "eval_batch_size": inert("the held-out rows are generated in one batch"),
    _T + "max_prompt_length": derived("with generator.sampling_params.max_generate_length: policy.max_seq_length"),
    _T + "recompute_old_logprobs_per_minibatch": inert("corerl scores the old policy's logprobs once per step"),
    _T + "remove_microbatch_padding": inert("memory and speed only: corerl pads a micro-batch's rows (packing is "
                                            "policy.sequence_packing)"),
    _T + "gradient_checkpointing": inert(_PERF),
    _T + "gradient_checkpointing_use_reentrant": inert(_PERF),
    _T + "flash_attn": inert("corerl picks the attention kernel the model and device support"),
    _T + "use_expandable_segments": inert(_PERF),
    _T + "sequence_parallel_backend": inert("corerl shards long sequences with the backend's context "
                                            "parallelism"),
    _T + "bf16": acts("policy.precision", lambda v: "bfloat16" if v else "float32", "true: bfloat16"),
    _T + "disable_fast_tokenizer": inert("corerl loads the checkpoint's tokenizer as transformers does", _truthy),
    _T + "logprobs_chunk_size": inert(_PERF),
    _T + "vocab_entropy_chunk_size": inert(_PERF),
    _T + "vocab_entropy_chunk_memory_mb": inert(_PERF),
    _T + "fused_lm_head_logprob": inert(_PERF),
    _T + "fused_lm_head_logprob_backend": inert(_PERF),
    # placement: SkyRL's per-model GPU counts
    _T + "placement.colocate_all": acts("policy.generation.colocated.enabled"),
    _T + "placement.colocate_policy_ref": inert("corerl's reference shares the policy's workers"),
    _T + "placement.policy_num_nodes": acts("cluster.num_nodes"),
    _T + "placement.policy_num_gpus_per_node": acts("cluster.gpus_per_node"),
    _T + "placement.ref_num_nodes": inert("corerl's reference shares the policy's workers"),
    _T + "placement.ref_num_gpus_per_node": inert("corerl's reference shares the policy's workers"),
    _T + "placement.critic_num_nodes": inert("corerl's critic shares the policy's workers"),
    _T + "placement.critic_num_gpus_per_node": inert("corerl's critic shares the policy's workers"),
    _T + "placement.reward_num_nodes": inert("corerl scores rewards in the driver's environment workers"),
    # checkpoints and logging
    _T + "ckpt_interval": derived("above 0: checkpointing.enabled and checkpointing.save_period"),
    _T + "max_ckpts_to_keep": derived("above 0: checkpointing.keep_last (-1: corerl keeps its default)"),
    _T + "ckpt_path": derived("run.output_dir (corerl writes its checkpoints and logs there); empty: corerl's "
                              "default run.output_dir"),
    _T + "resume_mode": derived("latest: run.resume auto (a run in run.output_dir goes on); none: a new run"),
    _T + "resume_path": refused("resuming from a given checkpoint folder is not built into corerl (a run resumes "
                                "from its own run.output_dir)"),
    _T + "hf_save_interval": inert("corerl exports the final Hugging Face checkpoint (corerl export)"),
    _T + "export_path": inert("corerl exports with `corerl export` from run.output_dir"),
    _T + "log_path": inert(_LOG),
    _T + "project_name": inert(_LOG),
    _T + "run_name": acts("run.name"),
    _T + "logger": inert("corerl logs to run.output_dir (TensorBoard, JSON lines); its logger plugins add others"),
    _T + "enable_ray_gpu_monitor": inert(_LOG),
    _T + "tags": inert(_LOG),
    _T + "dump_data_batch": inert(_LOG),
    _T + "dump_eval_results": inert(_LOG),
    _T + "print_example_interval": inert(_LOG),
    _T + "num_logger_eval_samples": inert(_LOG),
    _T + "num_logger_train_samples": inert(_LOG),
    _T + "log_example_interval": inert(_LOG),
}
