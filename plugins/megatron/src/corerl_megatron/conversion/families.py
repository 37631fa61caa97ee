"""Hugging Face <-> Megatron name mapping, one table per architecture family.

A table lists, for each Megatron GPTModel tensor (local layer spec), the Hugging Face
tensors it is made of and how: ``copy`` (one tensor, same layout), ``qkv`` (q, k and v
projections fused per query group: for each group its query heads, then its key head, then
its value head) or ``gate_up`` (the gated MLP's gate and up projections stacked). ``{i}`` is
the layer index. Adding a family is adding a table to :data:`FAMILIES`.
"""

from __future__ import annotations

from typing import Literal

import attrs

Kind = Literal["copy", "qkv", "gate_up"]


@attrs.frozen
class Rule:
    """One Megatron tensor and the Hugging Face tensors it is made of."""

    megatron: str
    hf: tuple[str, ...]
    kind: Kind = "copy"
    when: Literal["always", "untied", "qkv_bias"] = "always"


@attrs.frozen
class Family:
    """The rules of one architecture family and the Hugging Face architectures it covers."""

    name: str
    architectures: tuple[str, ...]
    rules: tuple[Rule, ...]
    qkv_bias_default: bool


_ATTN = "model.layers.{i}.self_attn"
_MLP = "model.layers.{i}.mlp"
_LAYER = "decoder.layers.{i}"


def _decoder_rules() -> tuple[Rule, ...]:
    return (
        Rule("embedding.word_embeddings.weight", ("model.embed_tokens.weight",)),
        Rule(f"{_LAYER}.input_layernorm.weight", ("model.layers.{i}.input_layernorm.weight",)),
        Rule(f"{_LAYER}.self_attention.linear_qkv.weight",
             (f"{_ATTN}.q_proj.weight", f"{_ATTN}.k_proj.weight", f"{_ATTN}.v_proj.weight"), "qkv"),
        Rule(f"{_LAYER}.self_attention.linear_qkv.bias",
             (f"{_ATTN}.q_proj.bias", f"{_ATTN}.k_proj.bias", f"{_ATTN}.v_proj.bias"), "qkv", when="qkv_bias"),
        Rule(f"{_LAYER}.self_attention.linear_proj.weight", (f"{_ATTN}.o_proj.weight",)),
        Rule(f"{_LAYER}.pre_mlp_layernorm.weight", ("model.layers.{i}.post_attention_layernorm.weight",)),
        Rule(f"{_LAYER}.mlp.linear_fc1.weight", (f"{_MLP}.gate_proj.weight", f"{_MLP}.up_proj.weight"), "gate_up"),
        Rule(f"{_LAYER}.mlp.linear_fc2.weight", (f"{_MLP}.down_proj.weight",)),
        Rule("decoder.final_layernorm.weight", ("model.norm.weight",)),
        Rule("output_layer.weight", ("lm_head.weight",), when="untied"),
    )


QWEN2 = Family("qwen2", ("Qwen2ForCausalLM",), _decoder_rules(), qkv_bias_default=True)
LLAMA = Family("llama", ("LlamaForCausalLM", "MistralForCausalLM"), _decoder_rules(), qkv_bias_default=False)
FAMILIES = (QWEN2, LLAMA)


def family_of(architecture: str) -> Family | None:
    """The family whose table covers ``architecture`` (e.g. ``Qwen2ForCausalLM``), or None."""
    return next((f for f in FAMILIES if architecture in f.architectures), None)


def supported_architectures() -> list[str]:
    return sorted(a for f in FAMILIES for a in f.architectures)
