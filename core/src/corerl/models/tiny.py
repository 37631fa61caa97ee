"""Tiny Qwen2/Llama-style models, tiny Qwen3-MoE/Mixtral/GLM-4.5 mixtures of experts, tiny Qwen2.5-VL/Qwen3-VL
vision-language models and a word-level tokenizer, built in code and saved in Hugging Face format, for
tests, benchmarks and the offline demo.

torch, transformers and tokenizers are imported inside the functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ["<pad>", "<unk>", "<bos>", "<eos>"]

#: ``policy.model_name: builtin:...`` -> the shape :func:`build_tiny_model` builds into the run directory
BUILTIN_MODELS: dict[str, dict[str, Any]] = {
    "builtin:tiny-qwen2": dict(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, vocab_size=128),
    # a quarter of tiny-qwen2's parameters, with its tokenizer: the distillation demo's student
    "builtin:tiny-qwen2-small": dict(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, vocab_size=128),
    # 8 experts, top-2; head_dim 64 because vLLM's CPU attention takes no smaller head
    "builtin:tiny-moe": dict(family="qwen3_moe", hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                             head_dim=64, vocab_size=128, num_experts=8, experts_per_token=2,
                             expert_intermediate_size=128),
    # a Qwen2.5-VL: a 2-block vision tower (14-pixel patches) before a 2-layer language model
    "builtin:tiny-vl": dict(family="qwen2_5_vl", hidden_size=64, num_layers=2, vocab_size=128),
}

#: the vision-language families :func:`build_tiny_model` builds (:mod:`corerl.models.vision`)
VL_FAMILIES = ("qwen2_5_vl", "qwen3_vl")

#: the families :func:`build_tiny_model` builds; the mixtures of experts take ``num_experts``
MOE_FAMILIES = ("qwen3_moe", "mixtral", "glm4_moe")


#: words that spell a Hermes tool call of the ``lookup`` tool, and its result, when joined by spaces
#: (``<tool_call> {"name": "lookup", "arguments": {}} </tool_call>``): the tool_lookup task's
TOOL_WORDS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", '{"name":', '"lookup",',
              '"arguments":', "{}}"]


def tiny_vocabulary(size: int) -> list[str]:
    """Special tokens, digits, a few operators and filler words, up to ``size`` entries; from 64
    entries on, the last ones are :data:`TOOL_WORDS`."""
    words = [*SPECIAL_TOKENS, *[str(d) for d in range(10)], "+", "-", "=", "?", ":", ".", ","]
    tools = TOOL_WORDS if size >= 64 else []
    words += [f"w{i}" for i in range(size - len(words) - len(tools))]
    return (words + tools)[:size]


def builtin_vocabulary(name: str) -> dict[str, int]:
    """The token -> id map of the tokenizer :func:`build_tiny_model` saves for the built-in model
    ``name`` (a key of :data:`BUILTIN_MODELS`), without building it."""
    shape = BUILTIN_MODELS[name]
    size = int(shape.get("vocab_size", 128))
    if shape.get("family") in VL_FAMILIES:
        return {word: i for i, word in enumerate(tiny_vl_vocabulary(size))}
    return {word: i for i, word in enumerate(tiny_vocabulary(size))}


def build_tokenizer(vocab_size: int = 128) -> Any:
    """A whitespace word-level ``PreTrainedTokenizerFast`` over :func:`tiny_vocabulary`. A word
    outside the vocabulary encodes as ``<unk>`` (id 1), never as nothing: every unknown word is
    that one token, so a run whose prompts or observations hold such words is told so once
    (:mod:`corerl.reporting.lost_text`, the ``encoding/lost_text`` metric)."""
    return word_level_tokenizer(tiny_vocabulary(vocab_size))


def word_level_tokenizer(words: list[str]) -> Any:
    """A whitespace word-level ``PreTrainedTokenizerFast`` over ``words`` (the first four:
    :data:`SPECIAL_TOKENS`), an unknown word encoded as ``<unk>``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {word: i for i, word in enumerate(words)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", unk_token="<unk>", bos_token="<bos>", eos_token="<eos>"
    )


def tiny_hf_config(
    *,
    family: str = "qwen2",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int | None = None,
    head_dim: int | None = None,
    intermediate_size: int | None = None,
    vocab_size: int = 128,
    max_positions: int = 2048,
    tie_word_embeddings: bool = True,
    initializer_range: float = 0.02,
    num_experts: int = 8,
    experts_per_token: int = 2,
    expert_intermediate_size: int | None = None,
) -> dict[str, Any]:
    """The ``config.json`` dict of a tiny model (what :func:`build_tiny_model` builds), without
    torch or transformers: validation and ``corerl plan`` read a built-in model's facts from it.
    ``num_experts``, ``experts_per_token`` and ``expert_intermediate_size`` apply to the
    mixture-of-experts families (:data:`MOE_FAMILIES`) only; the vision-language families
    (:data:`VL_FAMILIES`) take ``hidden_size``, ``num_layers``, ``vocab_size``, ``head_dim`` and
    ``num_kv_heads``. Key-value heads: 2 unless given (1 for a vision-language model)."""
    if family in VL_FAMILIES:
        return tiny_vl_config(family=family, hidden_size=hidden_size, num_layers=num_layers, vocab_size=vocab_size,
                              head_dim=head_dim or 32, num_kv_heads=num_kv_heads or 1)
    num_kv_heads = 2 if num_kv_heads is None else num_kv_heads
    families = {"qwen2": "qwen2", "llama": "llama", "qwen3_moe": "qwen3_moe", "mixtral": "mixtral",
                "glm4_moe": "glm4_moe"}
    if family not in families:
        raise ValueError(f"unknown tiny model family {family!r}; known: {', '.join(families)}")
    ids = {word: i for i, word in enumerate(tiny_vocabulary(vocab_size))}
    config: dict[str, Any] = dict(
        model_type=families[family],
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim or hidden_size // num_heads,
        vocab_size=vocab_size,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=ids["<pad>"],
        bos_token_id=ids["<bos>"],
        eos_token_id=ids["<eos>"],
        initializer_range=initializer_range,
    )
    experts = expert_intermediate_size or hidden_size
    if family == "qwen3_moe":
        config.update(num_experts=num_experts, num_experts_per_tok=experts_per_token, moe_intermediate_size=experts,
                      decoder_sparse_step=1, norm_topk_prob=True)
    elif family == "mixtral":  # every layer routes; intermediate_size is the experts' size
        config.update(num_local_experts=num_experts, num_experts_per_tok=experts_per_token, intermediate_size=experts)
    elif family == "glm4_moe":  # GLM-4.5: a dense first layer, a shared expert, a sigmoid router with a per-expert
        # bias (e_score_correction_bias), half-width rotary, q/k/v biases and q/k norms
        config.update(n_routed_experts=num_experts, num_experts_per_tok=experts_per_token, moe_intermediate_size=experts,
                      n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1, norm_topk_prob=True,
                      routed_scaling_factor=2.5, partial_rotary_factor=0.5, attention_bias=True, use_qk_norm=True,
                      num_nextn_predict_layers=0)
    return config


def builtin_hf_config(name: str) -> dict[str, Any]:
    """The ``config.json`` dict of the built-in model ``name`` (a key of :data:`BUILTIN_MODELS`)."""
    return tiny_hf_config(**BUILTIN_MODELS[name])


def build_tiny_model(out_dir: str | Path, *, seed: int = 0, **shape: Any) -> Path:
    """Build a randomly initialised causal LM (the keywords of :func:`tiny_hf_config`: a dense
    Qwen2/Llama, a Qwen3-MoE/Mixtral/GLM-4.5 mixture of experts, or a Qwen2.5-VL/Qwen3-VL with its image
    processor) plus tokenizer, and save them to ``out_dir``."""
    import torch
    from transformers import AutoConfig

    from corerl.models.hf_config import auto_model_class
    from corerl.models.hf_save import save_pretrained

    values = tiny_hf_config(**shape)
    vision = shape.get("family") in VL_FAMILIES
    if vision:
        tokenizer = word_level_tokenizer(tiny_vl_vocabulary(values["text_config"]["vocab_size"]))
    else:
        tokenizer = build_tokenizer(values["vocab_size"])
    config = AutoConfig.for_model(**values)
    torch.manual_seed(seed)
    model = auto_model_class("policy", values).from_config(config)
    if values.get("model_type") == "glm4_moe":  # a trained router's bias is not zero: give routing one to follow
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.e_score_correction_bias.normal_(0.0, 0.05)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_pretrained(model, out)
    tokenizer.save_pretrained(out)
    if vision:
        save_tiny_image_processor(out)
    return out


# -- the tiny vision-language models (Qwen2.5-VL, Qwen3-VL; :mod:`corerl.models.vision` re-exports these) --

#: the Qwen-VL vision tokens, in the tiny vocabulary right after the special tokens
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]

#: words of the tiny vision-language vocabulary besides the special and vision tokens: the visual
#: tasks' prompts and answers (colours, shapes, counts)
VISION_WORDS = ["red", "green", "blue", "yellow", "white", "black", "square", "circle", "what", "colour", "is",
                "the", "how", "many", "squares", "are", "there", "?", ".", "answer", ":", "shape", "largest"]


def tiny_vl_vocabulary(size: int = 128) -> list[str]:
    """Special tokens, the vision tokens, digits, :data:`VISION_WORDS`, then filler words up to ``size``."""
    words = [*SPECIAL_TOKENS, *VISION_TOKENS, *[str(d) for d in range(10)], *VISION_WORDS]
    return (words + [f"w{i}" for i in range(size - len(words))])[:size]


def tiny_vl_config(family: str = "qwen2_5_vl", hidden_size: int = 64, num_layers: int = 2, vocab_size: int = 128,
                   vision_hidden_size: int = 32, vision_depth: int = 2, head_dim: int = 32,
                   num_kv_heads: int = 1) -> dict[str, Any]:
    """The ``config.json`` dict of a tiny Qwen2.5-VL (``family="qwen2_5_vl"``) or Qwen3-VL
    (``"qwen3_vl"``), without torch or transformers (``head_dim`` 64 for vLLM's CPU attention,
    which takes no smaller head; ``num_kv_heads`` 2 for two tensor-parallel ranks)."""
    if family not in ("qwen2_5_vl", "qwen3_vl"):
        raise ValueError(f"unknown tiny vision-language family {family!r}; known: qwen2_5_vl, qwen3_vl")
    ids = {word: i for i, word in enumerate(tiny_vl_vocabulary(vocab_size))}
    # the multimodal rotary embedding splits head_dim / 2 frequencies over (time, height, width)
    sections = [head_dim // 8, 3 * head_dim // 16, 3 * head_dim // 16]
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": sections}
    text = dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                num_hidden_layers=num_layers, num_attention_heads=max(1, hidden_size // head_dim), num_key_value_heads=num_kv_heads,
                head_dim=head_dim, max_position_embeddings=2048, rope_parameters=rope, tie_word_embeddings=True,
                pad_token_id=ids["<pad>"], bos_token_id=ids["<bos>"], eos_token_id=ids["<eos>"])
    vision = dict(depth=vision_depth, hidden_size=vision_hidden_size, intermediate_size=2 * vision_hidden_size,
                  num_heads=1, out_hidden_size=hidden_size)
    if family == "qwen2_5_vl":
        vision.update(patch_size=14, fullatt_block_indexes=[vision_depth - 1], window_size=56)
    else:
        rope["mrope_interleaved"] = True
        vision.update(patch_size=14, num_position_embeddings=64, deepstack_visual_indexes=[vision_depth - 1])
    return dict(model_type=family, text_config=text, vision_config=vision, tie_word_embeddings=True,
                image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
                pad_token_id=ids["<pad>"], bos_token_id=ids["<bos>"], eos_token_id=ids["<eos>"])


#: the tiny models' image processor: 14-pixel patches merged 2 x 2; a 56 x 56 image is 16 patches, 4 image tokens
TINY_IMAGE_PROCESSOR = dict(patch_size=14, merge_size=2, temporal_patch_size=2, min_pixels=56 * 56,
                            max_pixels=112 * 112)


def save_tiny_image_processor(out_dir: str | Path) -> None:
    """Save the tiny models' image processor (:data:`TINY_IMAGE_PROCESSOR`) into ``out_dir``, a
    checkpoint folder :func:`corerl.models.tiny.build_tiny_model` writes."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    Qwen2VLImageProcessorPil(**TINY_IMAGE_PROCESSOR).save_pretrained(out_dir)
