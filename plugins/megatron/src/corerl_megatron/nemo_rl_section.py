"""NeMo RL's megatron sections (``policy.megatron_cfg``, the critic's ``value.megatron_cfg`` and
megatron generation's ``policy.generation.mcore_generation_config``) in corerl's configuration:
the rules this plugin contributes to the core's NeMo RL dialect (a key without a rule means what
the same key of corerl's ``policy.megatron_cfg`` means). No engine is imported here."""

from __future__ import annotations

from typing import Any

from corerl.sdk import Rule, SectionRules

acts, inert, inert_with_warning, refused = Rule.acts, Rule.inert, Rule.inert_with_warning, Rule.refused
_truthy, _not, _OFF, _PERF, _ENV = Rule.truthy, Rule.other_than, Rule.OFF, Rule.PERF, Rule.ENV

MEGATRON_UNPACKED = ("with sequence parallelism the megatron backend trains unpacked rows (its packed rows run on "
                     "megatron-core's local layer spec, which refuses sequence parallelism): the same loss, less "
                     "throughput")
MEGATRON_UNPACKED_CP = ("with context parallelism the megatron backend trains unpacked rows (its packed rows run on "
                        "megatron-core's local layer spec, which has no context-parallel attention): the same loss, "
                        "less throughput")
MEGATRON_UNPACKED_FP8 = ("with FP8 training the megatron backend trains unpacked rows (its packed rows run on "
                         "megatron-core's local layer spec, which has no FP8 layers): the same loss, less throughput")
MEGATRON_VLM = ("megatron trains the vision-language models Qwen2.5-VL and Qwen2-VL only (their vision tower as "
                "transformers builds it), not this one's; use policy.dtensor_cfg")
MEGATRON_VLM_HINT = "set policy.megatron_cfg.enabled=false and policy.dtensor_cfg.enabled=true"
MEGATRON_FREEZE = ("a setting of Megatron-Bridge's multimodal models (Nemotron omni, Qwen3.5), which megatron does "
                   "not train in corerl; a Qwen2.5-VL's tower is kept fixed with policy.freeze_vision_tower")


def _load_balancing(value: Any) -> str:
    """NeMo RL's ``moe_router_load_balancing_type`` as corerl's ``policy.moe.load_balancing_type``."""
    if value in (None, "none"):
        return "none"
    if value not in ("aux_loss", "seq_aux_loss"):
        raise ValueError(f"the {value!r} load balancing is not built into corerl yet (none, aux_loss and "
                         "seq_aux_loss are)")
    return str(value)


RULES: dict[str, Rule] = {
    "policy.megatron_cfg.env_vars": inert_with_warning(_ENV, _truthy),
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
    # multi-token prediction: mtp_num_layers, mtp_loss_scaling_factor, mtp_detach_heads and mtp_use_repeated_layer
    # mean what corerl's keys of the same names do; with heads, the heads learn the labels (derived below)
    "policy.megatron_cfg.mtp_num_layers": Rule.derived(
        "policy.megatron_cfg.mtp_num_layers, with policy.megatron_cfg.mtp_loss_target=labels (NeMo RL's heads learn "
        "the row's tokens; corerl's default target is the policy's own distribution)"),
    "policy.megatron_cfg.moe_router_enable_expert_bias": Rule.derived(
        "true: policy.moe.expert_bias (the router must pick experts with a per-expert bias: GLM-4.5's "
        "e_score_correction_bias; refused for a model without one); false: the model routes as its checkpoint says"),
    **{f"policy.generation.mcore_generation_config.{key}": inert("megatron-core's inference-engine layout; corerl's "
                                                                  "megatron generation uses the training layout")
       for key in ("transformer_impl", "activation_checkpointing", "tensor_model_parallel_size",
                   "expert_model_parallel_size", "sequence_parallel", "unified_memory_level",
                   "inference_grouped_gemm_backend", "moe_router_num_groups", "moe_router_group_topk",
                   "moe_router_dtype")},
    **{f"policy.generation.mcore_generation_config.{key}": inert("megatron-core's inference-engine layout; corerl's "
                                                                  "megatron generation uses the training layout")
       for key in ("buffer_guaranteed_fraction", "mamba_inference_ssm_states_dtype", "pipeline_model_parallel_size",
                   "expert_tensor_parallel_size", "context_parallel_size")},
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
    # Megatron-Bridge's multimodal freezing: the vision tower (its patch merger, NeMo RL's projection, with it)
    "policy.megatron_cfg.freeze_config.freeze_vision_model": acts("policy.freeze_vision_tower"),
    "policy.megatron_cfg.freeze_config.freeze_vision_projection": Rule.derived(
        "accepted where it equals freeze_vision_model: corerl's vision tower holds its patch merger (the projection)"),
    "policy.megatron_cfg.freeze_config.freeze_language_model": inert("corerl trains the language model", _truthy),
    **{f"policy.megatron_cfg.{key}": refused(MEGATRON_FREEZE)
       for key in ("freeze_config.*", "freeze_vision_model", "freeze_vision_projection", "freeze_sound_encoder",
                   "freeze_sound_projection", "radio_force_cpe_eval_mode")},
    "policy.generation.mcore_generation_config.inference_moe_token_dispatcher_type": inert(
        "corerl's megatron generation dispatches tokens as the training layout does"),
    "policy.megatron_cfg.clear_memory_caches_before_refit": inert(_PERF),
    "policy.megatron_cfg.peft.lora_A_init_method": acts("policy.lora.lora_A_init"),
    "policy.megatron_cfg.peft.lora_B_init_method": inert("B starts at zero, so a new adapter changes nothing",
                                                         _not("zero")),
    "policy.megatron_cfg.peft.a2a_experimental": inert(_OFF, _truthy),
    "policy.megatron_cfg.peft.lora_dtype": inert("the adapter trains in float32 (the optimizer's precision)",
                                                 lambda value: value not in (None, "None", "float32")),
    "policy.megatron_cfg.pipeline_dtype": inert("pipeline stages exchange activations in policy.precision"),
    "policy.megatron_cfg.moe_router_dtype": inert_with_warning(
        "the router's softmax and top-k run in float32 (megatron-core's and transformers' default): routing in "
        "float64 is not applied, so near-ties between experts may break differently", lambda value: value == "fp64"),
    "policy.megatron_cfg.moe_router_bias_update_rate": Rule.derived(
        "with moe_router_enable_expert_bias: policy.moe.expert_bias_update_rate; without it, inert (NeMo RL moves no "
        "bias then)"),
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
    # LoRA: the section maps to policy.lora, which the megatron backend trains with adapters of its own
    # (corerl_megatron.training.lora); an empty target_modules is every linear layer, as in Megatron-Bridge
    **{f"policy.megatron_cfg.peft.{key}": acts(f"policy.lora.{target}")
       for key, target in (("enabled", "enabled"), ("target_modules", "target_modules"),
                           ("exclude_modules", "exclude_modules"), ("dim", "dim"), ("alpha", "alpha"),
                           ("dropout", "dropout"), ("dropout_position", "dropout_position"))},
}


def before(raw: dict[str, Any], out: Any) -> dict[str, str]:
    """Sequence packing on with megatron's sequence or context parallelism, or its FP8 training: the
    packing keys are inert, with a warning (packed rows run on the local layer spec, which takes none
    of them; without them they are packed)."""
    if out.value("policy.megatron_cfg.enabled") is not True or out.value("policy.sequence_packing.enabled") is not True:
        return {}
    why = (MEGATRON_UNPACKED if out.value("policy.megatron_cfg.sequence_parallel") is True
           else MEGATRON_UNPACKED_CP if (out.value("policy.megatron_cfg.context_parallel_size") or 1) > 1
           else MEGATRON_UNPACKED_FP8 if out.value("policy.megatron_cfg.fp8_cfg.enabled") is True else None)
    if why is None:
        return {}
    out.warnings.append(f"policy.sequence_packing.enabled=true: {why}")
    return {"policy.sequence_packing": why}


def derived(raw: dict[str, Any], out: Any) -> None:
    """A vision-language recipe on megatron whose model megatron does not build (Qwen3-VL, by its Hub
    name; a local checkpoint's family is checked at validation) is refused in one line.
    The ``peft`` section is Megatron-Bridge's LoRA (``policy.megatron_cfg.lora_type: lora``); its
    ``target_modules``, where it names some, are the layers adapted (corerl's
    ``policy.lora.match_all_linear``, on by default, would adapt every linear layer instead)."""
    if out.value("policy.megatron_cfg.peft.enabled") is True:
        # NeMo RL builds Megatron-Bridge's LoRA: one adapter over linear_qkv's (linear_fc1's) rows
        out.set("policy.megatron_cfg.peft.enabled", "policy.megatron_cfg.lora_type", "lora")
        if out.value("policy.megatron_cfg.peft.target_modules"):
            out.set("policy.megatron_cfg.peft.target_modules", "policy.lora.match_all_linear", False)
    _expert_bias(out)
    _mtp_heads(out)
    _vision_projection(out)
    refused_already = any(error.message.startswith((MEGATRON_VLM, MEGATRON_FREEZE)) for error in out.errors)
    model = str(out.value("policy.model_name") or "")
    if out.vision_language and out.value("policy.megatron_cfg.enabled") is True and not refused_already \
            and "qwen3-vl" in model.lower():
        out.refuse("policy.megatron_cfg.enabled", MEGATRON_VLM, MEGATRON_VLM_HINT)


def _vision_projection(out: Any) -> None:
    """``freeze_config.freeze_vision_projection``: the patch merger is part of corerl's vision tower,
    so it is frozen or trained with it; another choice than ``freeze_vision_model``'s is refused."""
    key = "policy.megatron_cfg.freeze_config.freeze_vision_projection"
    projection, tower = out.value(key), out.value("policy.megatron_cfg.freeze_config.freeze_vision_model")
    if projection is None:
        return
    if tower is not None and bool(projection) != bool(tower):
        out.refuse(key, f"freeze_vision_projection={projection} with freeze_vision_model={tower}: corerl's vision "
                        "tower holds its patch merger, frozen or trained with it",
                   "set both alike (policy.freeze_vision_tower)")
        return
    out.inert(key, "frozen or trained with the vision tower (policy.freeze_vision_tower)")


def _mtp_heads(out: Any) -> None:
    """``mtp_num_layers``: NeMo RL's heads are megatron-core's, trained on the labels."""
    key = "policy.megatron_cfg.mtp_num_layers"
    section = (out.raw.get("policy") or {}).get("megatron_cfg") or {}
    if out.switched_off(key) or not isinstance(section, dict) or "mtp_num_layers" not in section:
        return
    heads = out.value(key)
    if heads is None:  # NeMo RL's null: no heads (corerl's null would build the checkpoint's)
        out.inert(key, "null: no multi-token-prediction heads")
        return
    out.put(key, key, heads)
    if heads:
        out.set(key, "policy.megatron_cfg.mtp_loss_target", "labels")


def _expert_bias(out: Any) -> None:
    """``moe_router_enable_expert_bias`` and ``moe_router_bias_update_rate``: with the bias on, the
    router must have one (``policy.moe.expert_bias``) and it moves at the rate; off, the rate moves
    nothing in NeMo RL, so it is inert."""
    enable, rate = "policy.megatron_cfg.moe_router_enable_expert_bias", "policy.megatron_cfg.moe_router_bias_update_rate"
    if out.switched_off(enable):  # megatron_cfg.enabled is false: its keys are inert
        return
    on = out.value(enable) is True
    if on:
        out.put(enable, "policy.moe.expert_bias", True)
    elif out.value(enable) is not None:
        out.inert(enable, "false: the model routes as its checkpoint says")
    if out.value(rate) is not None:
        if on:
            out.put(rate, "policy.moe.expert_bias_update_rate", float(out.value(rate)))
        else:
            out.inert(rate, "moe_router_enable_expert_bias is off: NeMo RL moves no bias")


SECTION = SectionRules(
    rules=RULES,
    switched={"policy.megatron_cfg": True, "policy.megatron_cfg.peft": False, "policy.megatron_cfg.fp8_cfg": False,
              "value.megatron_cfg": True, "value.megatron_cfg.fp8_cfg": False, "value.megatron_cfg.peft": False},
    opaque=("policy.megatron_cfg.env_vars",),
    frozen_inert=("megatron_cfg.optimizer", "megatron_cfg.scheduler", "megatron_cfg.activation_checkpointing",
                  "megatron_cfg.peft", "megatron_cfg.distributed_data_parallel_config", "megatron_cfg.checkpoint",
                  "megatron_cfg.train_iters", "megatron_cfg.empty_unused_memory_level",
                  "megatron_cfg.force_reconvert_from_hf"),
    before=before,
    derived=derived,
)
