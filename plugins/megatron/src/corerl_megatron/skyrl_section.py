"""SkyRL's Megatron sections (``trainer.policy.megatron_config``, ``trainer.ref.megatron_config``
and the SFT entry point's ``megatron_config``) in corerl's configuration, and the
``trainer.strategy`` value this plugin runs (``megatron``, and SkyRL's SFT default): the rules
this plugin contributes to the core's SkyRL dialect. No engine is imported here."""

from __future__ import annotations

from typing import Any

from corerl.sdk import Rule, SectionRules

acts, inert, refused = Rule.acts, Rule.inert, Rule.refused
_truthy, _not = Rule.truthy, Rule.other_than
_PERF = "a memory or speed switch of SkyRL's: the same updates; corerl leaves the choice to its backend"

_CKPT = "Megatron's distributed-checkpoint settings; corerl saves its own checkpoints"


def _dispatcher(value: Any) -> str:
    if value not in ("allgather", "alltoall", "flex"):
        raise ValueError(f"the {value!r} token dispatcher is not built into corerl (allgather, alltoall, flex are)")
    return str(value)


def _lora_type(value: Any) -> str:
    if value not in ("lora", "canonical_lora"):
        raise ValueError(f"the {value!r} LoRA type is not built into corerl's megatron backend (lora and "
                         "canonical_lora are)")
    return str(value)


def _load_balancing(value: Any) -> str:
    if value in (None, "none"):
        return "none"
    if value not in ("aux_loss", "seq_aux_loss"):
        raise ValueError(f"the {value!r} load balancing is not built into corerl (none, aux_loss and seq_aux_loss "
                         "are)")
    return str(value)


def _policy(prefix: str) -> dict[str, Rule]:
    """The policy's ``megatron_config`` (RL's ``trainer.policy.megatron_config``, SFT's ``megatron_config``)."""
    to = "policy.megatron_cfg."
    return {
        **{f"{prefix}.{key}": acts(to + key) for key in (
            "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
            "expert_model_parallel_size", "freeze_moe_router", "moe_grouped_gemm")},
        f"{prefix}.expert_tensor_parallel_size": acts(to + "expert_tensor_parallel_size",
                                                      lambda value: 1 if value is None else value, "null: 1"),
        f"{prefix}.moe_token_dispatcher_type": acts(to + "moe_token_dispatcher_type", _dispatcher),
        f"{prefix}.moe_router_load_balancing_type": acts("policy.moe.load_balancing_type", _load_balancing),
        f"{prefix}.moe_aux_loss_coeff": acts("policy.moe.aux_loss_coeff"),
        f"{prefix}.moe_enable_routing_replay": acts("policy.moe.router_replay", lambda on: "r3" if on else "none",
                                                    "true: the sampled routes are replayed in training (r3)"),
        # the router the checkpoint has: sigmoid with a per-expert bias (GLM-4.5's) or softmax (Qwen3-MoE's, Mixtral's)
        f"{prefix}.moe_router_score_function": Rule.derived(
            "sigmoid: policy.moe.expert_bias (corerl's sigmoid routers pick experts with a per-expert bias: the model "
            "must have one); softmax: the checkpoint's own router"),
        f"{prefix}.moe_router_enable_expert_bias": Rule.derived(
            "true: policy.moe.expert_bias (the model's router must have a per-expert bias); false: the checkpoint's "
            "own router"),
        f"{prefix}.moe_router_dtype": inert("the router computes in policy.precision", _not("fp32")),
        f"{prefix}.moe_per_layer_logging": inert("corerl logs the MoE metrics per step"),
        f"{prefix}.ddp_config.*": inert(_PERF),
        f"{prefix}.hf_export_config.*": inert("corerl exports Hugging Face checkpoints with `corerl export`"),
        # lora (SkyRL's default, Megatron-Bridge's LoRA): one adapter over linear_qkv's and linear_fc1's rows;
        # canonical_lora: one per projection; both are corerl_megatron.training.lora's
        f"{prefix}.lora_config.lora_type": acts(to + "lora_type", _lora_type),
        f"{prefix}.lora_config.merge_lora": acts("checkpointing.merge_lora_on_export"),
        **{f"{prefix}.optimizer_config_kwargs.{key}": inert(_PERF) for key in (
            "optimizer_cpu_offload", "optimizer_offload_fraction", "overlap_cpu_optimizer_d2h_h2d")},
        f"{prefix}.optimizer_config_kwargs.use_precision_aware_optimizer": Rule.inert_with_warning(
            "corerl's megatron optimizer keeps its states in fp32: the updates of full precision, with more memory",
            _truthy),
        f"{prefix}.optimizer_config_kwargs.*": refused("a Megatron optimizer argument corerl does not pass"),
        f"{prefix}.transformer_config_kwargs.num_layers_in_last_pipeline_stage": acts(
            to + "num_layers_in_last_pipeline_stage"),
        f"{prefix}.transformer_config_kwargs.num_layers_in_first_pipeline_stage": acts(
            to + "num_layers_in_first_pipeline_stage"),
        f"{prefix}.transformer_config_kwargs.recompute_granularity": acts(
            to + "activation_checkpointing", lambda value: value is not None, "any: activation checkpointing on"),
        f"{prefix}.transformer_config_kwargs.recompute_method": inert("corerl checkpoints every layer's activations "
                                                                      "(policy.megatron_cfg.activation_checkpointing)"),
        f"{prefix}.transformer_config_kwargs.recompute_num_layers": inert(
            "corerl checkpoints every layer's activations"),
        f"{prefix}.transformer_config_kwargs.*": refused("a Megatron transformer argument corerl does not pass"),
        f"{prefix}.model_config_kwargs": inert("the checkpoint's own model configuration", _truthy),
        f"{prefix}.empty_cuda_cache": inert(_PERF),
        f"{prefix}.dist_ckpt_optim_fully_reshardable": inert(_CKPT),
        f"{prefix}.async_dist_ckpt_save": inert(_CKPT),
        f"{prefix}.async_dist_ckpt_strategy": inert(_CKPT),
        f"{prefix}.async_save_prestage_to_cpu": inert(_CKPT),
        f"{prefix}.mtp_num_layers": Rule.derived(
            "policy.megatron_cfg.mtp_num_layers, the multi-token-prediction heads trained (null: the checkpoint's, "
            "with trainer.mtp.enabled; 0: none)"),
        f"{prefix}.mtp_loss_weight": Rule.derived("policy.megatron_cfg.mtp_loss_scaling_factor where heads are "
                                                  "trained and trainer.mtp.loss_weight is not set"),
        f"{prefix}.mtp_loss_chunk_size": acts(to + "mtp_loss_chunk_size"),
        f"{prefix}.mtp_loss_topk": acts(to + "mtp_loss_topk"),
    }


RULES: dict[str, Rule] = {
    "trainer.strategy": acts("policy.megatron_cfg.enabled", lambda _: True, "corerl's megatron backend"),
    "strategy": acts("policy.megatron_cfg.enabled", lambda _: True, "corerl's megatron backend"),
    **_policy("trainer.policy.megatron_config"),
    **_policy("megatron_config"),
    "trainer.ref.megatron_config.*": inert("the reference scores in the policy's layout"),
    # trainer.mtp.num_speculative_tokens is the generation plugin's (its drafter's depth)
    "trainer.mtp.enabled": Rule.derived("true: the checkpoint's multi-token-prediction heads are trained with the "
                                        "decoupled draft loss (policy.megatron_cfg.mtp_num_layers: "
                                        "megatron_config.mtp_num_layers, null: the checkpoint's) and draft in "
                                        "generation; with trainer.strategy=megatron only"),
    "trainer.mtp.loss_weight": Rule.derived("policy.megatron_cfg.mtp_loss_scaling_factor (w in policy_loss + w * "
                                            "draft_loss) with trainer.mtp.enabled"),
}

_MTP = "trainer.policy.megatron_config."

def derived(raw: dict[str, Any], out: Any) -> None:
    """SkyRL's default LoRA type on megatron is Megatron-Bridge's ``lora`` (one adapter over a whole
    layer), where corerl's is ``canonical_lora``: a script that does not set it gets SkyRL's. And
    the multi-token-prediction heads (:func:`_mtp`)."""
    keys = ("trainer.policy.megatron_config.lora_config.lora_type", "megatron_config.lora_config.lora_type")
    megatron = ((out.tree.get("policy") or {}).get("megatron_cfg") or {}).get("enabled") is True
    if megatron and all(out.value(key) is None for key in keys):
        out.set(keys[0], "policy.megatron_cfg.lora_type", "lora")
    _mtp(out, megatron)
    _router(out)


def _router(out: Any) -> None:
    """``moe_router_score_function`` and ``moe_router_enable_expert_bias``: a sigmoid router or an
    expert bias asks for a model whose router picks experts with a per-expert bias
    (``policy.moe.expert_bias``, checked against the model); softmax and false are its own router."""
    for prefix in ("trainer.policy.megatron_config.", "megatron_config."):
        score, bias = prefix + "moe_router_score_function", prefix + "moe_router_enable_expert_bias"
        for key, asks in ((score, out.value(score) == "sigmoid"), (bias, out.value(bias) in (True, "true", "True"))):
            if asks:
                out.put(key, "policy.moe.expert_bias", True)
            elif out.value(key) is not None:
                if key == score and out.value(key) != "softmax":
                    out.refuse(key, f"{out.value(key)!r}: corerl's routers score by softmax, or by sigmoid with a "
                               "per-expert bias", "use softmax or sigmoid (the checkpoint's own)")
                else:
                    out.inert(key, f"{out.value(key)}: the checkpoint's own router")


def _mtp(out: Any, megatron: bool) -> None:
    """``trainer.mtp.enabled`` trains the checkpoint's heads (``mtp_num_layers`` null: all of them)
    with ``trainer.mtp.loss_weight`` (else ``mtp_loss_weight``) as w; without it, heads are trained
    where ``mtp_num_layers`` names a count above 0 (SFT's ``megatron_config`` too). SkyRL trains
    them on megatron only."""
    to = "policy.megatron_cfg."
    enabled = out.value("trainer.mtp.enabled") in (True, "true", "True")
    layers = {prefix: out.value(prefix + "mtp_num_layers") for prefix in (_MTP, "megatron_config.")}
    given = [prefix for prefix, count in layers.items() if (count or 0) > 0]
    heads = (enabled and layers[_MTP] != 0) or bool(given)
    if not megatron:  # this section's keys are inert in the script already; heads asked for are refused
        if heads:
            key = "trainer.mtp.enabled" if enabled else given[0] + "mtp_num_layers"
            out.refuse(key, "multi-token-prediction heads are trained by the megatron backend only (as in SkyRL)",
                       "set trainer.strategy=megatron, or trainer.mtp.enabled=false")
        return
    if enabled:
        out.put("trainer.mtp.enabled", to + "mtp_num_layers", layers[_MTP],
                "the heads are trained (policy.megatron_cfg.mtp_num_layers, null: the checkpoint's) and draft in "
                "generation (the generation plugin's speculative decoding)")
    elif out.value("trainer.mtp.enabled") is not None:
        out.inert("trainer.mtp.enabled", "false: no multi-token-prediction heads")
    for prefix, count in layers.items():
        if prefix in given or (enabled and prefix == _MTP and count is not None):
            out.put(prefix + "mtp_num_layers", to + "mtp_num_layers", count)
        elif count is not None:
            out.inert(prefix + "mtp_num_layers", "no multi-token-prediction heads are trained")
    weight = out.value("trainer.mtp.loss_weight")
    if heads and enabled and weight is not None:
        out.put("trainer.mtp.loss_weight", to + "mtp_loss_scaling_factor", weight)
    elif weight is not None:
        out.inert("trainer.mtp.loss_weight", "used only with trainer.mtp.enabled")
    for prefix in layers:
        own = out.value(prefix + "mtp_loss_weight")
        if own is None:
            continue
        if heads and not (enabled and weight is not None):
            out.put(prefix + "mtp_loss_weight", to + "mtp_loss_scaling_factor", own)
        else:
            out.inert(prefix + "mtp_loss_weight", "trainer.mtp.loss_weight sets the draft loss's weight" if heads
                      else "no multi-token-prediction heads are trained")

SECTION = SectionRules(
    rules=RULES,
    derived=derived,
    claims={"trainer.strategy": ("megatron",), "strategy": ("megatron", None)},
)
