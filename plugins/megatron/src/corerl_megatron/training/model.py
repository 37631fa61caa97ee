"""A megatron-core GPTModel shaped like a Hugging Face Llama/Qwen2 checkpoint, or a Qwen3-MoE/Mixtral/GLM-4.5
mixture of experts (megatron-core's MoE layers: :mod:`corerl_megatron.training.moe_config`)."""

from __future__ import annotations

import logging
import re
from typing import Any

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)


def rope_theta(hf: Any) -> float:
    params = getattr(hf, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(hf, "rope_theta", 10000.0)))


def rotary_fraction(hf: Any) -> float:
    """The share of each head's channels that rotate (GLM-4.5's ``partial_rotary_factor``; 1.0: all)."""
    params = getattr(hf, "rope_parameters", None) or {}
    return float(params.get("partial_rotary_factor", getattr(hf, "partial_rotary_factor", None)) or 1.0)


def transformer_config(hf: Any, settings: Any = None, params_dtype: torch.dtype = torch.float32, *,
                       tensor_parallel: int = 1, pipeline_parallel: int = 1, qkv_bias: bool = False,
                       moe: Any = None) -> Any:
    """megatron-core's TransformerConfig for the Hugging Face config ``hf`` (RMSNorm, SwiGLU,
    RoPE, grouped-query attention; a mixture of experts' MoE layers with the router settings of
    ``moe``, ``policy.moe``), with the parallel sizes and switches of ``settings``."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    from corerl_megatron.training.moe_config import moe_fields
    from corerl_megatron.training.vision import is_vision_language, mrope_section

    vision = is_vision_language(hf)
    rotary = {"mrope_section": mrope_section(hf)} if vision else {}
    if vision and getattr(settings, "apply_rope_fusion", False):
        log.info("megatron: apply_rope_fusion is off for a vision-language model (the fused kernel takes one "
                 "rotation per position, not multimodal rotary's)")
    hf = hf.get_text_config() if vision else hf  # a vision-language model's decoder
    on_gpu = torch.cuda.is_available()
    get = (lambda name, default: getattr(settings, name, default)) if settings is not None else (lambda n, d: d)
    return TransformerConfig(
        num_layers=hf.num_hidden_layers, hidden_size=hf.hidden_size, ffn_hidden_size=hf.intermediate_size,
        num_attention_heads=hf.num_attention_heads,
        num_query_groups=getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads,
        kv_channels=getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads,
        normalization="RMSNorm", layernorm_epsilon=hf.rms_norm_eps, gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, add_qkv_bias=qkv_bias, hidden_dropout=0.0, attention_dropout=0.0,
        tensor_model_parallel_size=tensor_parallel, pipeline_model_parallel_size=pipeline_parallel,
        # uneven stages: megatron-core numbers each stage's layers from these (layer_number is global)
        num_layers_in_first_pipeline_stage=get("num_layers_in_first_pipeline_stage", None) if pipeline_parallel > 1
        else None,
        num_layers_in_last_pipeline_stage=get("num_layers_in_last_pipeline_stage", None) if pipeline_parallel > 1
        else None,
        sequence_parallel=get("sequence_parallel", False),
        context_parallel_size=get("context_parallel_size", 1),
        pipeline_dtype=params_dtype if pipeline_parallel > 1 else None,
        params_dtype=params_dtype, bf16=params_dtype == torch.bfloat16,
        # on a GPU the parameters are allocated on the rank's device (the weights are copied in after)
        use_cpu_initialization=not on_gpu, perform_initialization=False,
        recompute_granularity="full" if get("activation_checkpointing", False) else None,
        recompute_method="uniform" if get("activation_checkpointing", False) else None,
        recompute_num_layers=1 if get("activation_checkpointing", False) else None,
        # the fused kernel takes one rotation per position, not multimodal rotary's per row and axis
        apply_rope_fusion=get("apply_rope_fusion", False) and on_gpu and not vision,
        bias_activation_fusion=get("bias_activation_fusion", False) and on_gpu,
        masked_softmax_fusion=False, bias_dropout_fusion=False, gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        **moe_fields(hf, settings, moe),
        **fp8_fields(get("fp8_cfg", None)),
        **rotary,
    )


def fp8_fields(fp8: Any) -> dict[str, Any]:
    """megatron-core's FP8 training fields for ``policy.megatron_cfg.fp8_cfg`` (none where it is
    off): Transformer Engine's layers then run their matrix multiplications in FP8 under the
    recipe's scaling (megatron-core enters the FP8 context around each layer itself)."""
    if fp8 is None or not fp8.enabled:
        return {}
    return {"fp8": fp8.fp8, "fp8_recipe": fp8.fp8_recipe, "fp8_param": fp8.fp8_param}


class ValueHead(torch.nn.Module):
    """A critic's scalar head in place of GPTModel's output layer: one output per token, the same
    on every tensor-parallel rank (the final norm's output it reads is replicated there), so its
    gradients agree across them without a reduction. Called as GPTModel calls its output layer."""

    sequence_parallel = False  # GPTModel asks its output layer

    def __init__(self, hidden_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
        self.weight = torch.nn.Parameter(torch.zeros(1, hidden_size, dtype=dtype, device=device))
        self.bias = torch.nn.Parameter(torch.zeros(1, dtype=dtype, device=device))

    def forward(self, hidden: torch.Tensor, weight: Any = None, runtime_gather_output: Any = None) -> tuple[torch.Tensor, None]:
        return F.linear(hidden, self.weight, self.bias), None


def build_gpt(hf: Any, config: Any, *, pre_process: bool = True, post_process: bool = True,
              value_head: bool = False, local_spec: bool = False, mtp_layers: int = 0,
              mtp_repeated: bool = False) -> Any:
    """A GPTModel (local layer spec; Transformer Engine's when importable and on a GPU, unless
    ``local_spec``: LoRA adapters read each linear layer's input, which Transformer Engine's spec
    takes before the norm it folds in); with ``value_head``, a critic: :class:`ValueHead` in place
    of the vocabulary projection; with ``mtp_layers``, megatron-core's multi-token-prediction
    block of that many heads as ``model.mtp`` (``mtp_repeated``: one head at every depth; run by :mod:`corerl_megatron.training.mtp`, not by
    GPTModel's forward: its draft loss is decoupled from the trunk)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from corerl_megatron.training.vision import build_tower, is_vision_language

    model_config, vision = hf, is_vision_language(hf)
    hf = hf.get_text_config() if vision else hf  # a vision-language model: its decoder's, plus the tower
    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    engine_spec = False
    if config.moe_router_enable_expert_bias:
        from corerl_megatron.training.router_bias import count_real_tokens_only

        count_real_tokens_only()
    if config.num_moe_experts:  # dense and MoE layers as config.moe_layer_freq says, this stage's only
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

        spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization="RMSNorm")
    if torch.cuda.is_available() and not local_spec:
        try:
            import transformer_engine  # noqa: F401
            from megatron.core.models.gpt.gpt_layer_specs import (
                get_gpt_layer_with_transformer_engine_spec,
            )

            spec = get_gpt_layer_with_transformer_engine_spec()
            engine_spec = True
            if config.num_moe_experts:
                from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

                spec = get_gpt_decoder_block_spec(config, use_transformer_engine=True)
        except ImportError:
            pass
    model = GPTModel(
        config, spec, vocab_size=hf.vocab_size, max_sequence_length=hf.max_position_embeddings,
        pre_process=pre_process, post_process=post_process, parallel_output=False,
        share_embeddings_and_output_weights=bool(getattr(model_config, "tie_word_embeddings", False)) and not value_head,
        position_embedding_type="mrope" if vision else "rope", rotary_base=int(rope_theta(hf)),
        rotary_percent=rotary_fraction(hf),
    )
    if vision and pre_process:  # the first stage runs the vision tower (corerl_megatron.training.vision)
        model.vision_model = build_tower(model_config, config.params_dtype)
    if value_head and post_process:
        model.output_layer = ValueHead(config.hidden_size, config.params_dtype)
    if mtp_layers and post_process:
        from corerl_megatron.training.mtp import build_mtp_block

        model.mtp = build_mtp_block(config, spec, mtp_layers, engine_spec, repeated=mtp_repeated)
    # the local spec's norms are plain torch.nn.RMSNorm modules, made on the default device in
    # float32 whatever the config says: bring them to the rank's GPU and the parameters' dtype
    for param in model.parameters():
        if param.is_floating_point() and param.dtype != config.params_dtype:
            param.data = param.data.to(config.params_dtype)
    if torch.cuda.is_available():
        model.cuda(torch.cuda.current_device())
    return model


def engine_spec_here(local_spec: bool) -> bool:
    """Whether :func:`build_gpt` builds on Transformer Engine's layer spec here: a GPU, transformer_engine
    importable, and no ``local_spec`` asked for."""
    import importlib.util

    return torch.cuda.is_available() and not local_spec and importlib.util.find_spec("transformer_engine") is not None


# Transformer Engine's layer spec folds each pre-norm into the linear layer after it; the
# conversion tables use the local spec's names
_FOLDED_NORMS = {"self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
                 "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight"}


_GROUPED_EXPERT = re.compile(r"\.mlp\.experts\.(linear_fc[12])\.weight(\d+)$")


def spec_neutral_name(name: str) -> str:
    """The local-spec name of a GPTModel parameter name (the same name under the local spec)."""
    grouped = _GROUPED_EXPERT.search(name)  # Transformer Engine's grouped experts: one weight per local expert
    if grouped:
        return f"{name[:grouped.start()]}.mlp.experts.local_experts.{grouped.group(2)}.{grouped.group(1)}.weight"
    for folded, local in _FOLDED_NORMS.items():
        if name.endswith(folded):
            return name[: -len(folded)] + local
    return name

