"""A tiny gpt-oss checkpoint whose experts are stored as gpt-oss's release stores them: MXFP4
(``*_blocks``: two 4-bit E2M1 codes a byte, 32 values a block; ``*_scales``: one E8M0 exponent a
block), with ``quantization_config.quant_method: mxfp4``. Built in code: the codes and exponents
are drawn at random (a small exponent range keeps the values tame), the rest of the model is a
randomly initialised transformers GptOss."""

from __future__ import annotations

import json
from pathlib import Path

import torch

#: the tiny model: head_dim 64 for vLLM's CPU attention, 4 experts of width 64
SHAPE = dict(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=64, num_local_experts=4, num_experts_per_tok=2,
             max_position_embeddings=131072, sliding_window=64, pad_token_id=0, bos_token_id=2, eos_token_id=3,
             layer_types=["sliding_attention", "full_attention"])


def build_mxfp4_gpt_oss(out: str | Path, seed: int = 0) -> dict[str, torch.Tensor]:
    """Write the checkpoint to ``out``; its MXFP4 tensors (``*_blocks``, ``*_scales``) by name."""
    from safetensors.torch import save_file
    from transformers import GptOssConfig, GptOssForCausalLM

    from corerl.models.tiny import build_tokenizer

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = GptOssForCausalLM(GptOssConfig(**SHAPE))
    model.save_pretrained(out)
    build_tokenizer(SHAPE["vocab_size"]).save_pretrained(out)
    generator = torch.Generator().manual_seed(seed)
    state, packed = {}, {}
    for name, value in model.state_dict().items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            experts, inputs, outputs = value.shape  # transformers' [E, in, out]; MXFP4 rows are the outputs
            packed[f"{name}_blocks"] = torch.randint(0, 256, (experts, outputs, inputs // 32, 16), dtype=torch.uint8,
                                                     generator=generator)
            packed[f"{name}_scales"] = torch.randint(122, 128, (experts, outputs, inputs // 32), dtype=torch.uint8,
                                                     generator=generator)
        else:
            state[name] = value.contiguous()
    for stale in out.glob("model*.safetensors*"):
        stale.unlink()
    save_file({**state, **packed}, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return packed
