"""Tiny Qwen2/Llama-style models and a word-level tokenizer, built in code and saved in
Hugging Face format, for tests, benchmarks and the offline demo.

torch, transformers and tokenizers are imported inside the functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ["<pad>", "<unk>", "<bos>", "<eos>"]

#: ``policy.model_name: builtin:...`` -> the shape :func:`build_tiny_model` builds into the run directory
BUILTIN_MODELS: dict[str, dict[str, Any]] = {
    "builtin:tiny-qwen2": dict(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, vocab_size=128),
}


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


def build_tokenizer(vocab_size: int = 128) -> Any:
    """A whitespace word-level ``PreTrainedTokenizerFast`` over :func:`tiny_vocabulary`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {word: i for i, word in enumerate(tiny_vocabulary(vocab_size))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", unk_token="<unk>", bos_token="<bos>", eos_token="<eos>"
    )


def build_tiny_model(
    out_dir: str | Path,
    *,
    family: str = "qwen2",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    vocab_size: int = 128,
    max_positions: int = 2048,
    tie_word_embeddings: bool = True,
    initializer_range: float = 0.02,
    seed: int = 0,
) -> Path:
    """Build a randomly initialised causal LM plus tokenizer and save both to ``out_dir``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    families = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}
    if family not in families:
        raise ValueError(f"unknown tiny model family {family!r}; known: {', '.join(families)}")
    config_cls, model_cls = families[family]
    tokenizer = build_tokenizer(vocab_size)
    config = config_cls(
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        vocab_size=vocab_size,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        initializer_range=initializer_range,
    )
    torch.manual_seed(seed)
    model = model_cls(config)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
