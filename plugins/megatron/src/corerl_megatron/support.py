"""What the megatron backend refuses for a validated config: called by selection (its registration's
``check_supported``), so ``corerl validate`` refuses what ``corerl run`` would at start-up. Config
logic only; GPU-only options are refused where the recipe runs on this machine and it has no GPU
(asked without importing torch)."""

from __future__ import annotations

from typing import Any

from corerl.sdk import (
    Config,
    ConfigError,
    EngineNotAvailable,
    check_expert_parallel,
    check_tensor_parallel,
    model_shape,
)


def check_supported(config: Config) -> None:
    """Refuse, in one line each, what this machine or this backend cannot run."""
    from corerl.sdk import runs_here_without_gpu

    settings = config.section("policy.megatron_cfg")
    section = "policy.megatron_cfg"
    on_gpu = not runs_here_without_gpu(config)
    shape = model_shape(config)
    if shape is not None and shape.vision:
        check_vision_language(config, settings, section, shape.model_type)
    gpu_only = {
        f"{section}.fp8_cfg.enabled": settings.fp8_cfg.enabled,
        # Transformer Engine's attention exchanges keys and values between the ranks (the local spec has none)
        f"{section}.context_parallel_size": settings.context_parallel_size > 1,
        f"{section}.optimizer.use_distributed_optimizer": settings.optimizer.use_distributed_optimizer,
        f"{section}.apply_rope_fusion": settings.apply_rope_fusion,
        f"{section}.bias_activation_fusion": settings.bias_activation_fusion,
        # megatron-core: "Grouped GEMM is not available" without grouped_gemm / Transformer Engine
        f"{section}.moe_grouped_gemm": settings.moe_grouped_gemm,
        # DeepEP / HybridEP: CUDA kernels megatron-core's flex dispatcher calls (not run by corerl's tests)
        f"{section}.moe_token_dispatcher_type": settings.moe_token_dispatcher_type == "flex",
    }
    if settings.moe_enable_deepep and settings.moe_token_dispatcher_type != "flex":
        raise ConfigError("DeepEP is the flex dispatcher's backend (megatron-core refuses it with another dispatcher)",
                          key=f"{section}.moe_enable_deepep", hint=f"set {section}.moe_token_dispatcher_type=flex, or "
                                                                  "turn moe_enable_deepep off")
    if settings.context_parallel_size > 1:  # what it cannot run with, on any machine, before the GPU it needs
        policy = config.core.policy
        check_context_parallel(config, settings, section, policy.lora.enabled and config.role != "critic",
                               policy.sequence_packing.enabled, on_gpu)
    for key, value in gpu_only.items():
        if value and not on_gpu:
            raise EngineNotAvailable(f"{key} needs a GPU (megatron-core runs it with CUDA kernels); this machine has none",
                                     key=key, hint="turn it off on CPU machines")
    check_tensor_parallel(config, settings.tensor_model_parallel_size, f"{section}.tensor_model_parallel_size")
    check_pipeline_stages(config, settings, section)
    policy = config.core.policy
    lora = policy.lora.enabled and config.role != "critic"
    packed = policy.sequence_packing.enabled
    if settings.fp8_cfg.enabled and on_gpu:
        check_fp8_training(config, settings, section, lora, packed)
    if settings.sequence_parallel and config.role != "critic" and (not on_gpu or lora or packed):
        # on a GPU it needs Transformer Engine too, which a recipe for another cluster cannot be judged by;
        # LoRA's adapters and packed rows' masked attention run on the local spec on a GPU too
        local = " (where the LoRA adapters sit)" if lora else " (where packed rows run)" if packed else ""
        raise EngineNotAvailable("sequence parallelism needs Transformer Engine's layer spec on a GPU; megatron-core's "
                                 f"local spec{local} norms with torch LayerNorm, which refuses it",
                                 key=f"{section}.sequence_parallel",
                                 hint="set it to false" + (" with policy.lora" if lora else " with policy.sequence_packing"
                                                           if packed else " on this machine, or run on a GPU machine "
                                                           "with Transformer Engine installed"))
    if lora:
        check_lora(config, settings, section, shape)
    if policy.dynamic_batching.enabled:
        raise EngineNotAvailable("dynamic batching (micro-batches of as many rows as a token budget holds, each as "
                                 "wide as its longest row) is not wired into the megatron backend: its pipeline "
                                 "schedule needs one shape for every micro-batch", key="policy.dynamic_batching.enabled",
                                 hint="use policy.sequence_packing instead (packed rows of one width), or the dtensor "
                                      "backend")
    if packed:
        check_packing(config, settings, section)
    if config.role == "critic" and settings.sequence_parallel:
        raise EngineNotAvailable("the megatron critic's value head reads the whole sequence on every tensor-parallel "
                                 "rank; sequence parallelism is not wired into it", key="critic.megatron_cfg.sequence_parallel",
                                 hint="set critic.megatron_cfg.sequence_parallel=false (the policy may keep it)")
    check_experts(config, settings, section, on_gpu)
    check_architecture(config, settings, section)


def check_architecture(config: Config, settings: Any, section: str) -> None:
    """Refuse a model whose architecture no conversion table covers (``converter_type``, else the
    local checkpoint's ``config.json``; a model not read here is judged when it loads)."""
    from corerl.sdk import read_hf_config
    from corerl_megatron.conversion.families import family_for_checkpoint, no_table_hint

    name = config.core.policy.model_name  # a critic's config holds its own model here
    named = (read_hf_config(name) or {}).get("architectures") or [None]
    architecture = settings.converter_type or named[0]
    if architecture is not None and family_for_checkpoint(architecture) is None:
        where = f"{section}.converter_type" if settings.converter_type else "policy.model_name"
        raise ConfigError(f"no Hugging Face -> Megatron table for {architecture} ({name})", key=where,
                          hint=no_table_hint())


def check_packing(config: Config, settings: object, section: str) -> None:
    """Refuse what packed rows (:mod:`corerl_megatron.training.packed_rows`) do not run with: router
    replay r2 (it keeps each row's experts by the row's tokens, and a packed row of the logprob pass
    is not one of the training pass), megatron-core's per-sequence load-balancing loss (its
    sequences are rows) and multi-token-prediction heads (they read the tokens after each
    position, across a packed row's sequences)."""
    moe = config.core.policy.moe
    for key, on, why in (
            ("policy.moe.router_replay", moe.router_replay == "r2",
             "router replay r2 keeps each row's experts by the row's tokens, and the logprob and training passes "
             "pack the sequences into different rows"),
            ("policy.moe.load_balancing_type", moe.load_balancing_type == "seq_aux_loss" and moe.aux_loss_coeff > 0,
             "megatron-core's seq_aux_loss balances each row's experts, and a packed row holds several sequences"),
            (f"{section}.mtp_num_layers", (settings.mtp_num_layers or 0) > 0,  # type: ignore[attr-defined]
             "the multi-token-prediction heads read the tokens after each position, across a packed row's "
             "sequences")):
        if on:
            raise EngineNotAvailable(f"{why}: not wired into the megatron backend's packed rows", key=key,
                                     hint="turn it off, or set policy.sequence_packing.enabled=false")


def check_lora(config: Config, settings: object, section: str, shape: object) -> None:
    """Refuse what the megatron backend's own LoRA adapters (corerl_megatron.training.lora) do not
    cover: a mixture of experts' expert layers, dropout with tensor parallelism (each rank would
    draw its own mask over a replicated input), and a ``target_modules`` entry naming no adaptable
    layer (sequence parallelism is refused before: the adapters' local layer spec does not run it)."""
    from corerl_megatron.lora_targets import partial_fused, unmatched_target

    lora = config.core.policy.lora
    if shape is not None and shape.is_moe:  # type: ignore[attr-defined]
        raise EngineNotAvailable("the megatron backend's LoRA adapts dense decoder layers only (attention and MLP "
                                 "projections); adapters on a mixture of experts' expert layers are not wired",
                                 key="policy.lora.enabled",
                                 hint="train this model's LoRA with policy.training_backend=dtensor, or train it "
                                      "whole (policy.lora.enabled=false)")
    if lora.dropout > 0 and settings.tensor_model_parallel_size > 1:  # type: ignore[attr-defined]
        raise EngineNotAvailable("LoRA dropout with tensor parallelism is not wired into the megatron backend (the "
                                 "ranks would drop different inputs of one replicated adapter)",
                                 key="policy.lora.dropout",
                                 hint=f"set policy.lora.dropout=0, or {section}.tensor_model_parallel_size=1")
    if shape is not None and settings.lora_type == "lora":  # type: ignore[attr-defined]
        part = partial_fused(lora, shape.layers)  # type: ignore[attr-defined]
        if part is not None:
            linear, chosen = part
            names = ", ".join(p.rsplit(".", 1)[1] for p in chosen)
            raise ConfigError(f"{section}.lora_type=lora gives {linear.rsplit('.', 1)[1]} one adapter over all its "
                              f"projections, and policy.lora chooses {names} of them only",
                              key="policy.lora.target_modules",
                              hint=f"target the whole layer, or set {section}.lora_type=canonical_lora (an adapter "
                                   "per projection)")
    if shape is not None:
        missing = unmatched_target(lora, shape.layers)  # type: ignore[attr-defined]
        if missing is not None:
            raise ConfigError(f"LoRA target {missing!r} names no linear layer the megatron backend adapts "
                              "(q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, all-linear, or "
                              "megatron's linear_qkv, linear_proj, linear_fc1, linear_fc2)",
                              key="policy.lora.target_modules",
                              hint="name those projections (the embeddings and the output head are not adapted)")


def check_experts(config: Config, settings: object, section: str, on_gpu: bool) -> None:
    """Refuse an expert layout the model or this machine cannot take, and router settings the
    megatron backend does not run: a dense model's expert parallelism (the SDK's check),
    tensor parallelism inside experts (not wired), tensor parallelism over a MoE model's training
    on the CPU (megatron-core's MoE layer wants sequence parallelism with it), router replay
    r2 with activation recomputation / sequence parallelism, and r3 with recomputation under a
    pipeline schedule or with multi-token-prediction heads."""
    check_expert_parallel(config, settings.expert_model_parallel_size,  # type: ignore[attr-defined]
                          f"{section}.expert_model_parallel_size")
    if settings.expert_tensor_parallel_size > 1:  # type: ignore[attr-defined]
        raise EngineNotAvailable("tensor parallelism inside experts is not wired into the megatron backend's weight "
                                 "layout yet", key=f"{section}.expert_tensor_parallel_size",
                                 hint="set it to 1 and split the experts with expert_model_parallel_size")
    shape = model_shape(config)
    if shape is None or not shape.is_moe or config.role == "critic":
        return
    if settings.tensor_model_parallel_size > 1 and not on_gpu:  # type: ignore[attr-defined]
        raise EngineNotAvailable("megatron-core trains a mixture of experts with tensor parallelism only together with "
                                 "sequence parallelism, which needs Transformer Engine on a GPU",
                                 key=f"{section}.tensor_model_parallel_size",
                                 hint="set it to 1 and split the experts with expert_model_parallel_size")
    moe = config.core.policy.moe
    if (moe.aux_loss_coeff > 0 or moe.z_loss_coeff > 0) and settings.pipeline_model_parallel_size > 1:  # type: ignore[attr-defined]
        raise EngineNotAvailable("the router's loss terms are weighted per micro-batch by its share of the loss tokens, "
                                 "which the pipeline schedule's interleaved backward passes do not keep apart",
                                 key=f"{section}.pipeline_model_parallel_size",
                                 hint="set it to 1, or policy.moe.aux_loss_coeff and z_loss_coeff to 0")
    check_biased_router(config, shape, section)
    replay = moe.router_replay
    if replay == "r3" and settings.activation_checkpointing and settings.pipeline_model_parallel_size > 1:  # type: ignore[attr-defined]
        raise EngineNotAvailable("router replay r3 on megatron sets each forward's experts before it runs, and the "
                                 "pipeline schedule recomputes a micro-batch after later ones have set theirs",
                                 key=f"{section}.activation_checkpointing",
                                 hint=f"turn it off, or set {section}.pipeline_model_parallel_size=1")
    if replay == "r3" and (settings.mtp_num_layers or 0) > 0:  # type: ignore[attr-defined]
        raise EngineNotAvailable("router replay r3 replays the experts the generation engine chose in the decoder "
                                 "layers; the multi-token-prediction heads' routers have none reported",
                                 key=f"{section}.mtp_num_layers", hint="set it to 0, or policy.moe.router_replay=r2")
    if replay == "r2" and (settings.activation_checkpointing or settings.sequence_parallel):  # type: ignore[attr-defined]
        key = "activation_checkpointing" if settings.activation_checkpointing else "sequence_parallel"  # type: ignore[attr-defined]
        raise EngineNotAvailable(f"router replay r2 on megatron records each row's experts per token of a whole "
                                 f"sequence; {key} recomputes or splits them", key=f"{section}.{key}",
                                 hint="turn it off, or set policy.moe.router_replay=none")


def check_biased_router(config: Config, shape: Any, section: str) -> None:
    """Refuse what megatron-core's sigmoid router cannot route as a GLM-4.5 checkpoint does: it
    always renormalises the top-k weights, and picks groups by their top ``k / groups_picked``
    scores where transformers takes the top 2. (LoRA on a mixture of experts is refused before,
    so a moving bias never sits under adapters.)"""
    from corerl.sdk import read_hf_config

    if not shape.router_bias:
        return
    hf = {**(read_hf_config(config.core.policy.model_name) or {}), **(config.core.policy.hf_config_overrides or {})}
    source = f"{config.core.policy.model_name}/config.json"
    if hf.get("norm_topk_prob") is False and int(hf.get("num_experts_per_tok") or 1) > 1:
        raise EngineNotAvailable(f"megatron-core's sigmoid router always renormalises the chosen experts' weights, and "
                                 f"{source} says norm_topk_prob: false", key="policy.model_name",
                                 hint="train this model on the dtensor or deepspeed backend")
    groups, picked, top = (int(hf.get(k) or 1) for k in ("n_group", "topk_group", "num_experts_per_tok"))
    if groups > 1 and top // picked != 2:
        raise EngineNotAvailable(f"megatron-core picks expert groups by their top {top // picked} scores where "
                                 f"transformers takes the top 2 ({source}: num_experts_per_tok {top}, topk_group "
                                 f"{picked})", key="policy.model_name",
                                 hint="train this model on the dtensor or deepspeed backend")


def check_pipeline_stages(config: Config, settings: object, section: str) -> None:
    """Refuse a pipeline layout the local model's layers cannot fill (each stage one layer or more,
    the stages without a set size sharing the rest evenly), as megatron-core would at start-up."""
    from corerl_megatron.stages import stage_layers

    shape, stages = model_shape(config), settings.pipeline_model_parallel_size  # type: ignore[attr-defined]
    if shape is None or stages == 1:
        return
    first = settings.num_layers_in_first_pipeline_stage  # type: ignore[attr-defined]
    last = settings.num_layers_in_last_pipeline_stage  # type: ignore[attr-defined]
    counts = stage_layers(shape.layers, stages, first, last)
    if sum(counts) != shape.layers or min(counts) < 1:
        given = (first is not None) + (last is not None)
        key = "pipeline_model_parallel_size"
        if first is not None:
            key = "num_layers_in_first_pipeline_stage"
        elif last is not None:
            key = "num_layers_in_last_pipeline_stage"
        raise ConfigError(f"{stages} pipeline stages cannot hold the model's {shape.layers} layers "
                          f"({'evenly' if not given else f'with {first} first and {last} last'}; "
                          f"{stages - given} stage(s) share the rest)", key=f"{section}.{key}",
                          hint="pick stage sizes that leave each other stage the same number of layers, or set "
                               "num_layers_in_first/last_pipeline_stage")


def check_fp8_training(config: Config, settings: Any, section: str, lora: bool, packed: bool) -> None:
    """FP8 training on a GPU: megatron-core runs it in Transformer Engine's layers (its layer spec),
    which must be installed; the local spec that LoRA's adapters and packed rows run on has no FP8
    layers, so those are refused with it, in one line."""
    key = f"{section}.fp8_cfg.enabled"
    if lora or packed:
        what = "policy.lora's adapters" if lora else "packed rows (policy.sequence_packing)"
        raise EngineNotAvailable(f"FP8 training runs in Transformer Engine's layers, and {what} run on megatron-core's "
                                 "local layer spec, which has none", key=key,
                                 hint="turn FP8 training off, or " + ("policy.lora" if lora else "policy.sequence_packing"))
    check_transformer_engine(config, key, "FP8 training runs in Transformer Engine's layers", "turn FP8 training off")


def check_vision_language(config: Config, settings: Any, section: str, model_type: str | None) -> None:
    """A vision-language policy (:mod:`corerl_megatron.training.vision`): Qwen2.5-VL and Qwen2-VL,
    with data and tensor parallelism; what the tower's replicated module and the multimodal rotary
    positions are not wired with is refused in one line."""
    from corerl_megatron.conversion.families import VISION_MODEL_TYPES

    if model_type not in VISION_MODEL_TYPES:
        raise EngineNotAvailable(f"megatron trains the vision-language families Qwen2.5-VL and Qwen2-VL; "
                                 f"{config.core.policy.model_name} is a {model_type}", key="policy.model_name",
                                 hint="use policy.training_backend=dtensor or deepspeed for it")
    for key, on, why in (
            (f"{section}.pipeline_model_parallel_size", settings.pipeline_model_parallel_size > 1,
             "pipeline stages (the vision tower's features reach only the first)"),
            (f"{section}.sequence_parallel", settings.sequence_parallel,
             "sequence parallelism (the image features are written into whole rows of embeddings)"),
            (f"{section}.context_parallel_size", settings.context_parallel_size > 1,
             "context parallelism (the multimodal rotary positions of whole rows)"),
            ("policy.lora.enabled", config.core.policy.lora.enabled and config.role != "critic",
             "LoRA (adapters on the decoder; the tower is not adapted)"),
            (f"{section}.mtp_num_layers", (settings.mtp_num_layers or 0) > 0, "multi-token-prediction heads")):
        if on:
            fix = "set it to 1" if key.endswith("_size") else "turn it off"
            raise EngineNotAvailable(f"megatron trains a vision-language model without {why}", key=key,
                                     hint=f"{fix}, or use policy.training_backend=dtensor")


def check_context_parallel(config: Config, settings: Any, section: str, lora: bool, packed: bool,
                           on_gpu: bool) -> None:
    """Context parallelism (:mod:`corerl_megatron.training.context_parallel`): Transformer Engine's
    attention takes it, on a GPU, where it must be installed, in bfloat16 or float16; the local spec
    that LoRA's adapters and packed rows run on has no context-parallel attention, router replay r2 keeps each row's experts by
    its whole tokens, and the multi-token-prediction heads read the tokens after each position, so
    those are refused with it, in one line."""
    key = f"{section}.context_parallel_size"
    for other, on, why in (
            ("policy.lora.enabled", lora, "policy.lora's adapters run on megatron-core's local layer spec, which has "
                                          "no context-parallel attention"),
            ("policy.sequence_packing.enabled", packed, "packed rows run on megatron-core's local layer spec, which "
                                                        "has no context-parallel attention"),
            ("policy.precision", config.core.policy.precision not in ("bfloat16", "float16"),
             "Transformer Engine's context-parallel attention runs in its flash or fused kernels, which take "
             "bfloat16 or float16 only"),
            ("policy.moe.router_replay", config.core.policy.moe.router_replay == "r2",
             "router replay r2 keeps each row's experts by the row's whole tokens (r3 is cut as the tokens are)"),
            (f"{section}.mtp_num_layers", (settings.mtp_num_layers or 0) > 0,
             "the multi-token-prediction heads read the tokens after each position, across the ranks' chunks")):
        if on:
            fix = "set it to bfloat16" if other == "policy.precision" else "turn it off"
            raise EngineNotAvailable(f"context parallelism on megatron: {why}", key=other, hint=f"{fix}, or set {key}=1")
    if on_gpu:
        check_transformer_engine(config, key, "context parallelism runs in Transformer Engine's attention", "set it to 1")


def check_transformer_engine(config: Config, key: str, why: str, otherwise: str) -> None:
    """Refuse ``key``, in one line, where the recipe runs on this machine (a recipe for another
    cluster is not judged by what is installed here) and transformer_engine is not installed."""
    from importlib.util import find_spec

    from corerl.sdk import runs_here

    if runs_here(config) and find_spec("transformer_engine") is None:
        raise EngineNotAvailable(f"{why}, and transformer_engine is not installed here", key=key,
                                 hint=f"pip install transformer_engine[pytorch] (a CUDA build), or {otherwise}")


def check_generation_supported(config: Config) -> None:
    """What the megatron generation backend refuses: context parallelism, and, where it starts a
    megatron engine of its own (the training backend is another), whatever that engine refuses.
    A model trained with sequence parallelism decodes with it switched off
    (:func:`corerl_megatron.generation.rank_decode.generate`)."""
    settings = config.section("policy.megatron_cfg")
    shape = model_shape(config)
    if shape is not None and shape.vision:
        raise EngineNotAvailable("megatron generation reads no images, and the policy is a vision-language model",
                                 key="policy.generation.backend",
                                 hint="sample with policy.generation.backend=hf (or vllm where it reads images); "
                                      "megatron still trains it")
    if settings.context_parallel_size > 1:
        raise EngineNotAvailable("megatron generation decodes each row on one rank, and context parallelism splits "
                                 "every row over several", key="policy.megatron_cfg.context_parallel_size",
                                 hint="sample with policy.generation.backend=vllm (or hf); training keeps the split")
    if not config.section_enabled("policy.megatron_cfg") and config.core.policy.training_backend != "megatron":
        check_supported(config)  # it samples with a megatron engine of its own
