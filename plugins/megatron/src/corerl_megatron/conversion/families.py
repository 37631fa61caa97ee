"""Hugging Face <-> Megatron name mapping, one table per architecture family.

A table lists, for each Megatron GPTModel tensor (local layer spec), the Hugging Face
tensors it is made of and how: ``copy`` (one tensor, same layout), ``qkv`` (q, k and v
projections fused per query group: for each group its query heads, then its key head, then
its value head), ``gate_up`` (the gated MLP's gate and up projections stacked) or ``expert``
(one expert's slice of a tensor transformers keeps stacked over the experts: Megatron's
per-expert ``linear_fc1`` is ``gate_up_proj[e]``, its ``linear_fc2`` is ``down_proj[e]``) or
``swap_halves`` (a ``[out, 2h]`` projection whose two input halves are in the other order) or
``prefix`` (every Hugging Face tensor under a name prefix, unchanged, under another: a
vision-language model's vision tower, which runs as transformers builds it beside megatron-core's
decoder).
``{i}`` is the layer index, ``{e}`` the expert's. ``when`` says which layers a rule covers in a
mixture of experts: ``moe`` (routed layers), ``dense`` (the others); ``mtp`` and ``mtp_qkv_bias``
cover the multi-token-prediction heads a checkpoint carries after its decoder layers (``{i}`` is
then the head's index: megatron-core's ``mtp.layers.{i}``). Adding a family is adding a table to
:data:`FAMILIES`.
"""

from __future__ import annotations

from typing import Literal

import attrs

Kind = Literal["copy", "qkv", "gate_up", "expert", "swap_halves", "prefix"]
When = Literal["always", "untied", "qkv_bias", "moe", "dense", "mtp", "mtp_qkv_bias"]


@attrs.frozen
class Rule:
    """One Megatron tensor and the Hugging Face tensors it is made of."""

    megatron: str
    hf: tuple[str, ...]
    kind: Kind = "copy"
    when: When = "always"


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


def _decoder_rules(*, qk_norm: bool = False, experts: bool = False, root: str = "model") -> tuple[Rule, ...]:
    """The decoder's rules; ``root`` is where transformers keeps it (a vision-language model's
    ``model.language_model``)."""
    if root != "model":
        return tuple(attrs.evolve(rule, hf=tuple(h.replace("model.", f"{root}.", 1) if h.startswith("model.") else h
                                                 for h in rule.hf))
                     for rule in _decoder_rules(qk_norm=qk_norm, experts=experts))
    mlp = "dense" if experts else "always"
    return (
        Rule("embedding.word_embeddings.weight", ("model.embed_tokens.weight",)),
        Rule(f"{_LAYER}.input_layernorm.weight", ("model.layers.{i}.input_layernorm.weight",)),
        Rule(f"{_LAYER}.self_attention.linear_qkv.weight",
             (f"{_ATTN}.q_proj.weight", f"{_ATTN}.k_proj.weight", f"{_ATTN}.v_proj.weight"), "qkv"),
        Rule(f"{_LAYER}.self_attention.linear_qkv.bias",
             (f"{_ATTN}.q_proj.bias", f"{_ATTN}.k_proj.bias", f"{_ATTN}.v_proj.bias"), "qkv", when="qkv_bias"),
        Rule(f"{_LAYER}.self_attention.linear_proj.weight", (f"{_ATTN}.o_proj.weight",)),
        Rule(f"{_LAYER}.pre_mlp_layernorm.weight", ("model.layers.{i}.post_attention_layernorm.weight",)),
        Rule(f"{_LAYER}.mlp.linear_fc1.weight", (f"{_MLP}.gate_proj.weight", f"{_MLP}.up_proj.weight"), "gate_up",
             when=mlp),
        Rule(f"{_LAYER}.mlp.linear_fc2.weight", (f"{_MLP}.down_proj.weight",), when=mlp),
        *(_qk_norm_rules() if qk_norm else ()),
        *(_expert_rules() if experts else ()),
        Rule("decoder.final_layernorm.weight", ("model.norm.weight",)),
        Rule("output_layer.weight", ("lm_head.weight",), when="untied"),
    )


def _qk_norm_rules() -> tuple[Rule, ...]:
    return (Rule(f"{_LAYER}.self_attention.q_layernorm.weight", (f"{_ATTN}.q_norm.weight",)),
            Rule(f"{_LAYER}.self_attention.k_layernorm.weight", (f"{_ATTN}.k_norm.weight",)))


def _expert_rules() -> tuple[Rule, ...]:
    experts = f"{_LAYER}.mlp.experts.local_experts.{{e}}"
    return (Rule(f"{_LAYER}.mlp.router.weight", (f"{_MLP}.gate.weight",), when="moe"),
            Rule(f"{experts}.linear_fc1.weight", (f"{_MLP}.experts.gate_up_proj",), "expert", when="moe"),
            Rule(f"{experts}.linear_fc2.weight", (f"{_MLP}.experts.down_proj",), "expert", when="moe"))


def _shared_expert_rules() -> tuple[Rule, ...]:
    """A MoE layer's always-on shared expert (DeepSeek/GLM-4.5 layout: ``mlp.shared_experts``) and its
    router's per-expert bias (``e_score_correction_bias``, megatron-core's ``router.expert_bias``: a buffer)."""
    shared, hf = f"{_LAYER}.mlp.shared_experts", f"{_MLP}.shared_experts"
    return (Rule(f"{shared}.linear_fc1.weight", (f"{hf}.gate_proj.weight", f"{hf}.up_proj.weight"), "gate_up",
                 when="moe"),
            Rule(f"{shared}.linear_fc2.weight", (f"{hf}.down_proj.weight",), when="moe"),
            Rule(f"{_LAYER}.mlp.router.expert_bias", (f"{_MLP}.gate.e_score_correction_bias",), when="moe"))


def _mimo_mtp_rules() -> tuple[Rule, ...]:
    """MiMo's MTP heads (``model.mtp_layers.{i}``, the names vLLM's ``mimo_mtp`` loads): token and hidden
    norms, ``input_proj`` over [hidden; embedding] (megatron-core's ``eh_proj`` reads [embedding; hidden]),
    a Qwen2 decoder layer, and a final norm."""
    head, layer = "model.mtp_layers.{i}", "mtp.layers.{i}.transformer_layer"
    attn, mlp = f"{head}.self_attn", f"{head}.mlp"
    return (
        Rule("mtp.layers.{i}.enorm.weight", (f"{head}.token_layernorm.weight",), when="mtp"),
        Rule("mtp.layers.{i}.hnorm.weight", (f"{head}.hidden_layernorm.weight",), when="mtp"),
        Rule("mtp.layers.{i}.eh_proj.weight", (f"{head}.input_proj.weight",), "swap_halves", when="mtp"),
        Rule(f"{layer}.input_layernorm.weight", (f"{head}.input_layernorm.weight",), when="mtp"),
        Rule(f"{layer}.self_attention.linear_qkv.weight",
             (f"{attn}.q_proj.weight", f"{attn}.k_proj.weight", f"{attn}.v_proj.weight"), "qkv", when="mtp"),
        Rule(f"{layer}.self_attention.linear_qkv.bias",
             (f"{attn}.q_proj.bias", f"{attn}.k_proj.bias", f"{attn}.v_proj.bias"), "qkv", when="mtp_qkv_bias"),
        Rule(f"{layer}.self_attention.linear_proj.weight", (f"{attn}.o_proj.weight",), when="mtp"),
        Rule(f"{layer}.pre_mlp_layernorm.weight", (f"{head}.post_attention_layernorm.weight",), when="mtp"),
        Rule(f"{layer}.mlp.linear_fc1.weight", (f"{mlp}.gate_proj.weight", f"{mlp}.up_proj.weight"), "gate_up",
             when="mtp"),
        Rule(f"{layer}.mlp.linear_fc2.weight", (f"{mlp}.down_proj.weight",), when="mtp"),
        Rule("mtp.layers.{i}.final_layernorm.weight", (f"{head}.final_layernorm.weight",), when="mtp"),
    )


QWEN2 = Family("qwen2", ("Qwen2ForCausalLM",), _decoder_rules(), qkv_bias_default=True)
LLAMA = Family("llama", ("LlamaForCausalLM", "MistralForCausalLM"), _decoder_rules(), qkv_bias_default=False)
QWEN3_MOE = Family("qwen3_moe", ("Qwen3MoeForCausalLM",), _decoder_rules(qk_norm=True, experts=True),
                   qkv_bias_default=False)
MIXTRAL = Family("mixtral", ("MixtralForCausalLM",), _decoder_rules(experts=True), qkv_bias_default=False)
#: GLM-4.5's MoE (``Glm4MoeForCausalLM``): q/k/v biases and q/k norms, dense first layers, one shared
#: expert beside the routed ones, a sigmoid router whose per-expert bias picks the experts
GLM4_MOE = Family("glm4_moe", ("Glm4MoeForCausalLM",),
                  (*_decoder_rules(qk_norm=True, experts=True), *_shared_expert_rules()), qkv_bias_default=False)
#: Xiaomi's MiMo: a Qwen2 decoder with MTP heads (``num_nextn_predict_layers``)
MIMO = Family("mimo", ("MiMoForCausalLM",), (*_decoder_rules(), *_mimo_mtp_rules()), qkv_bias_default=True)
#: Qwen2.5-VL and Qwen2-VL: a Qwen2 decoder with multimodal rotary positions, the vision tower kept
#: as transformers has it (``model.visual``, megatron's ``vision_model``: corerl_megatron.training.vision)
VISION_TOWER = Rule("vision_model.", ("model.visual.",), "prefix")
#: the config model types of those checkpoints
VISION_MODEL_TYPES = ("qwen2_5_vl", "qwen2_vl")
QWEN2_5_VL = Family("qwen2_5_vl", ("Qwen2_5_VLForConditionalGeneration", "Qwen2VLForConditionalGeneration"),
                    (*_decoder_rules(root="model.language_model"), VISION_TOWER), qkv_bias_default=True)
FAMILIES = (QWEN2, LLAMA, QWEN3_MOE, MIXTRAL, GLM4_MOE, MIMO, QWEN2_5_VL)


def family_of(architecture: str) -> Family | None:
    """The family whose table covers ``architecture`` (e.g. ``Qwen2ForCausalLM``), or None."""
    return next((f for f in FAMILIES if architecture in f.architectures), None)


def family_for_checkpoint(architecture: str) -> Family | None:
    """The family whose table converts a checkpoint of ``architecture``: a critic's value model
    (a token classifier) has its causal LM's table, with a one-output head."""
    if architecture.endswith("ForTokenClassification"):
        architecture = architecture.removesuffix("ForTokenClassification") + "ForCausalLM"
    return family_of(architecture)


def no_table_hint() -> str:
    """What to do about an architecture without a table."""
    return f"supported: {', '.join(supported_architectures())}; add a table in corerl_megatron.conversion.families"


def supported_architectures() -> list[str]:
    """Every Hugging Face architecture some family's table covers, sorted."""
    return sorted(a for f in FAMILIES for a in f.architectures)
