"""A tiny MiMo checkpoint for the multi-token-prediction tests of the megatron and vLLM plugins: a
tiny Qwen2 decoder's folder made MiMo (its config names MiMoForCausalLM with one MTP head, whose
tensors, under MiMo's names, are added to the weights file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch


def mimo_head_tensors(config: dict[str, Any], generator: torch.Generator) -> dict[str, torch.Tensor]:
    """One MiMo MTP head's tensors under MiMo's names (``model.mtp_layers.0.*``), random; the norms
    near 1."""
    h, d = config["hidden_size"], config["hidden_size"] // config["num_attention_heads"]
    q, kv, ffn = config["num_attention_heads"] * d, config["num_key_value_heads"] * d, config["intermediate_size"]
    shapes = {"token_layernorm.weight": (h,), "hidden_layernorm.weight": (h,), "input_proj.weight": (h, 2 * h),
              "input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,), "final_layernorm.weight": (h,),
              "self_attn.q_proj.weight": (q, h), "self_attn.q_proj.bias": (q,), "self_attn.k_proj.weight": (kv, h),
              "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.weight": (kv, h), "self_attn.v_proj.bias": (kv,),
              "self_attn.o_proj.weight": (h, q), "mlp.gate_proj.weight": (ffn, h), "mlp.up_proj.weight": (ffn, h),
              "mlp.down_proj.weight": (h, ffn)}
    out = {}
    for name, shape in shapes.items():
        value = torch.randn(shape, generator=generator) * 0.1
        out[f"model.mtp_layers.0.{name}"] = value + 1.0 if name.endswith("norm.weight") else value
    return out


def make_mimo(folder: Path, seed: int = 5) -> None:
    """Turn the tiny Qwen2 checkpoint in ``folder`` into a MiMo one with one MTP head, in place."""
    from safetensors.torch import load_file, save_file

    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="mimo", architectures=["MiMoForCausalLM"], num_nextn_predict_layers=1)
    (folder / "config.json").write_text(json.dumps(config))
    weights = folder / "model.safetensors"
    state = load_file(str(weights))
    state.update(mimo_head_tensors(config, torch.Generator().manual_seed(seed)))
    save_file(state, str(weights), metadata={"format": "pt"})
