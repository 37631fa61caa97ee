"""Hugging Face <-> Megatron conversion: the converted GPTModel's logits equal transformers',
and the round trip is exact (tied Qwen2 and untied Llama, grouped-query attention).

megatron-core keeps process-wide parallel state, so the check runs in a fresh process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

CHECK = textwrap.dedent(
    """
    import json, sys, torch
    from transformers import AutoModelForCausalLM
    from corerl_megatron.training.parallel import init_parallel
    from corerl_megatron.conversion.convert import Shape, hf_to_megatron, megatron_to_hf
    from corerl_megatron.conversion.families import family_of
    from corerl_megatron.training.model import build_gpt, transformer_config

    if __name__ == "__main__":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # megatron builds on the GPU if any
        init_parallel(rank=0, world_size=1, tensor=1, pipeline=1)
        hf_model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).to(device)
        hf = hf_model.config
        family = family_of(hf.architectures[0])
        shape = Shape.from_hf_config(hf, family)
        model = build_gpt(hf, transformer_config(hf, qkv_bias=shape.qkv_bias))
        model.load_state_dict(hf_to_megatron(dict(hf_model.state_dict()), family, shape), strict=False)
        ids = torch.randint(4, hf.vocab_size, (3, 17), generator=torch.Generator().manual_seed(0)).to(device)
        with torch.no_grad():
            ours = model(ids, torch.arange(17, device=device).expand(3, -1), attention_mask=None)
            theirs = hf_model(ids).logits
        back = megatron_to_hf({k: v for k, v in model.state_dict().items() if "_extra_state" not in k}, family, shape)
        ref = hf_model.state_dict()
        print(json.dumps({
            "family": family.name, "logit_diff": float((ours - theirs).abs().max()),
            "device": str(next(model.parameters()).device.type),
            "same_names": sorted(back) == sorted(ref),
            "exact": all(torch.equal(back[k], ref[k]) for k in ref),
        }))
    """
)


def _check(family: str, tied: bool, tmp_path) -> dict:
    from corerl.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "model", family=family, hidden_size=64, num_layers=2, num_heads=4,
                             num_kv_heads=2, tie_word_embeddings=tied)
    script = tmp_path / "check.py"
    script.write_text(CHECK, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script), str(model)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["family"] == family
    assert result["logit_diff"] <= 1e-4
    assert result["same_names"] and result["exact"]
    return result


@pytest.mark.parametrize("family, tied", [("qwen2", True), ("llama", False)])
def test_converted_model_matches_transformers_and_round_trips_exactly(family, tied, tmp_path):
    _check(family, tied, tmp_path)


@pytest.mark.gpu
def test_on_a_gpu_the_model_is_built_on_cuda_and_its_fp32_logits_match_transformers(tmp_path):
    assert _check("qwen2", True, tmp_path)["device"] == "cuda"  # no CPU initialisation left behind


def test_transformer_engine_names_map_to_the_tables_local_names():
    from corerl_megatron.training.model import spec_neutral_name

    assert spec_neutral_name("decoder.layers.3.self_attention.linear_qkv.layer_norm_weight") == \
        "decoder.layers.3.input_layernorm.weight"
    assert spec_neutral_name("decoder.layers.0.mlp.linear_fc1.layer_norm_weight") == \
        "decoder.layers.0.pre_mlp_layernorm.weight"
    assert spec_neutral_name("decoder.layers.0.mlp.linear_fc1.weight") == "decoder.layers.0.mlp.linear_fc1.weight"
