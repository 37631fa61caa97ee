"""megatron-core's mixture-of-experts settings for a Hugging Face Qwen3-MoE, Mixtral or GLM-4.5 config.

Routing as transformers does it: a softmax over the router's logits, the top-k experts, their
probabilities renormalised to sum to one when the model says so (Qwen3's ``norm_topk_prob``;
Mixtral always), which is megatron-core's top-k-then-softmax; without renormalising, its
``moe_router_pre_softmax``. GLM-4.5 routes by sigmoid scores plus a per-expert bias (its
``e_score_correction_bias``, megatron-core's expert bias: aux-loss-free balancing), weighs the
chosen experts by their unbiased scores renormalised and scaled by ``routed_scaling_factor``, and
adds a shared expert. ``policy.moe`` gives the router's losses, replay and the bias's update rate,
and ``policy.megatron_cfg`` the expert layout and the token dispatcher.
"""

from __future__ import annotations

from typing import Any

#: ``policy.moe.load_balancing_type`` -> megatron-core's ``moe_router_load_balancing_type``
LOAD_BALANCING = {"none": "none", "aux_loss": "aux_loss", "seq_aux_loss": "seq_aux_loss"}


def moe_fields(hf: Any, settings: Any = None, moe: Any = None) -> dict[str, Any]:
    """The TransformerConfig keywords of the experts of ``hf`` (empty for a dense model), with the
    layout of ``settings`` (``policy.megatron_cfg``) and the router settings of ``moe``
    (``policy.moe``); either may be None (defaults: one rank, no router losses)."""
    from corerl_megatron.conversion.convert import expert_count, moe_layer_indices

    experts = expert_count(hf)
    if not experts:
        return {}
    get = (lambda name, default: getattr(settings, name, default)) if settings is not None else (lambda n, d: d)
    moe_layers = set(moe_layer_indices(hf))
    balancing = getattr(moe, "load_balancing_type", "none") if moe is not None else "none"
    aux_coeff = float(getattr(moe, "aux_loss_coeff", 0.0) or 0.0) if moe is not None else 0.0
    z_coeff = float(getattr(moe, "z_loss_coeff", 0.0) or 0.0) if moe is not None else 0.0
    replay = (getattr(moe, "router_replay", "none") if moe is not None else "none") != "none"
    renormalise = bool(getattr(hf, "norm_topk_prob", True))  # Mixtral has no such key: it always renormalises
    biased = router_has_bias(hf)
    return dict(
        num_moe_experts=experts,
        moe_router_topk=int(hf.num_experts_per_tok),
        moe_ffn_hidden_size=int(getattr(hf, "moe_intermediate_size", None) or hf.intermediate_size),
        moe_layer_freq=[1 if i in moe_layers else 0 for i in range(hf.num_hidden_layers)],
        moe_router_pre_softmax=not renormalise,
        moe_router_score_function="sigmoid" if biased else "softmax",
        moe_router_enable_expert_bias=biased,
        moe_router_bias_update_rate=float(getattr(moe, "expert_bias_update_rate", 0.0) or 0.0) if biased else 1e-3,
        moe_router_topk_scaling_factor=float(getattr(hf, "routed_scaling_factor", None) or 1.0) if biased else None,
        moe_router_num_groups=int(hf.n_group) if biased and int(getattr(hf, "n_group", 1) or 1) > 1 else None,
        moe_router_group_topk=int(hf.topk_group) if biased and int(getattr(hf, "n_group", 1) or 1) > 1 else None,
        moe_shared_expert_intermediate_size=shared_expert_size(hf),
        moe_router_dtype="fp32",
        moe_router_load_balancing_type=LOAD_BALANCING[balancing] if aux_coeff > 0 else "none",
        moe_aux_loss_coeff=aux_coeff if balancing != "none" else 0.0,
        moe_z_loss_coeff=z_coeff or None,
        moe_enable_routing_replay=replay,
        moe_token_dispatcher_type=get("moe_token_dispatcher_type", "allgather"),
        moe_flex_dispatcher_backend=get("moe_flex_dispatcher_backend", "deepep"),
        moe_grouped_gemm=get("moe_grouped_gemm", False),
        moe_expert_capacity_factor=get("moe_expert_capacity_factor", None),
        moe_permute_fusion=False,
        expert_model_parallel_size=get("expert_model_parallel_size", 1),
        expert_tensor_parallel_size=get("expert_tensor_parallel_size", 1),
        qk_layernorm=hf.model_type.startswith("qwen3") or bool(getattr(hf, "use_qk_norm", False)),
    )


#: Hugging Face families whose router adds a per-expert bias to sigmoid scores to pick the experts
#: (``gate.e_score_correction_bias``) and has a megatron conversion table
BIASED_ROUTERS = ("glm4_moe",)


def router_has_bias(hf: Any) -> bool:
    """Whether ``hf``'s router picks experts by sigmoid scores plus a per-expert bias."""
    return getattr(hf, "model_type", None) in BIASED_ROUTERS


def shared_expert_size(hf: Any) -> int | None:
    """The hidden size of a MoE layer's shared expert (DeepSeek/GLM-4.5's ``n_shared_experts`` of
    ``moe_intermediate_size`` each, as one MLP); None without one."""
    shared = int(getattr(hf, "n_shared_experts", None) or 0)
    return shared * int(hf.moe_intermediate_size) if shared else None


def is_moe(hf: Any) -> bool:
    """Whether the Hugging Face config ``hf`` is a mixture of experts."""
    from corerl_megatron.conversion.convert import expert_count

    return expert_count(hf) > 0
