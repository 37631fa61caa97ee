"""Hugging Face <-> Megatron conversion: the converted GPTModel's logits equal transformers',
and the round trip is exact (tied Qwen2 and untied Llama, grouped-query attention; the Qwen3-MoE,
Mixtral and GLM-4.5 mixtures of experts, whose export loads back into transformers with equal logits).

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
    import json, sys, tempfile, torch
    from transformers import AutoModelForCausalLM
    from corerl.sdk import write_hf_checkpoint
    from corerl_megatron.training.parallel import init_parallel
    from corerl_megatron.conversion.convert import Shape, hf_to_megatron, megatron_to_hf
    from corerl_megatron.conversion.families import family_of
    from corerl_megatron.training.model import build_gpt, transformer_config

    def check(path, device):
        hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
        hf = hf_model.config
        family = family_of(hf.architectures[0])
        shape = Shape.from_hf_config(hf, family)
        model = build_gpt(hf, transformer_config(hf, qkv_bias=shape.qkv_bias))
        model.load_state_dict(hf_to_megatron(dict(hf_model.state_dict()), family, shape), strict=False)
        ids = torch.randint(4, hf.vocab_size, (3, 17), generator=torch.Generator().manual_seed(0)).to(device)
        with torch.no_grad():
            ours = model(ids, torch.arange(17, device=device).expand(3, -1), attention_mask=None)
            theirs = hf_model(ids).logits
        biases = [b for name, b in model.named_buffers() if name.endswith("router.expert_bias")]
        unbiased = None
        if biases:  # the router's per-expert bias picks experts: without it the logits change
            kept = [b.clone() for b in biases]
            for b in biases:
                b.zero_()
            with torch.no_grad():
                unbiased = float((model(ids, torch.arange(17, device=device).expand(3, -1), attention_mask=None)
                                  - theirs).abs().max())
            for b, k in zip(biases, kept):
                b.copy_(k)
        back = megatron_to_hf({k: v for k, v in model.state_dict().items() if "_extra_state" not in k}, family, shape)
        ref = hf_model.state_dict()
        with tempfile.TemporaryDirectory() as folder:  # the export, loaded back by transformers
            write_hf_checkpoint({k: v.cpu() for k, v in back.items()}, hf, path, folder)
            with torch.no_grad():
                exported = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device)(ids).logits
        print(json.dumps({
            "family": family.name, "logit_diff": float((ours - theirs).abs().max()),
            "device": str(next(model.parameters()).device.type),
            "same_names": sorted(back) == sorted(ref),
            "exact": all(torch.equal(back[k], ref[k]) for k in ref),
            "export_diff": float((exported - theirs).abs().max()), "unbiased_diff": unbiased,
        }))


    if __name__ == "__main__":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # megatron builds on the GPU if any
        init_parallel(rank=0, world_size=1, tensor=1, pipeline=1)
        for path in sys.argv[1:]:
            check(path, device)
    """
)


def _run(models: list, tmp_path) -> list[dict]:
    script = tmp_path / "check.py"
    script.write_text(CHECK, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script), *map(str, models)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.strip().splitlines() if line.startswith("{")]


def _check(family: str, tied: bool, tmp_path, tolerance: float = 1e-4) -> dict:
    from corerl.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "model", family=family, hidden_size=64, num_layers=2, num_heads=4,
                             num_kv_heads=2, tie_word_embeddings=tied)
    [result] = _run([model], tmp_path)
    assert result["family"] == family
    assert result["logit_diff"] <= tolerance and result["export_diff"] <= tolerance, result
    assert result["same_names"] and result["exact"]
    return result


@pytest.mark.parametrize("family, tied", [("qwen2", True), ("llama", False)])
def test_converted_model_matches_transformers_and_round_trips_exactly(family, tied, tmp_path):
    _check(family, tied, tmp_path)


def test_moe_families_convert_with_fp32_logits_within_1e_5_and_export_back(tmp_path):
    """Qwen3-MoE (q/k norms, renormalised top-k) and Mixtral: router, per-expert fc1 (gate and up)
    and fc2, in one process; the export loads back into transformers with equal logits."""
    from corerl.models.tiny import build_tiny_model

    models = [build_tiny_model(tmp_path / family, family=family, hidden_size=64, num_layers=2, num_heads=4,
                               num_kv_heads=2, head_dim=16, num_experts=4, experts_per_token=2,
                               expert_intermediate_size=32, tie_word_embeddings=False)
              for family in ("qwen3_moe", "mixtral")]
    results = _run(models, tmp_path)
    assert [r["family"] for r in results] == ["qwen3_moe", "mixtral"]
    for result in results:
        assert result["logit_diff"] <= 1e-5 and result["export_diff"] <= 1e-5, result
        assert result["same_names"] and result["exact"], result


def test_glm4_moe_converts_with_its_biased_sigmoid_router_and_shared_expert(tmp_path):
    """GLM-4.5's MoE: q/k/v biases, q/k norms, half-width rotary, a dense first layer, a shared
    expert and a sigmoid router scaled by routed_scaling_factor whose per-expert bias
    (e_score_correction_bias, megatron-core's expert_bias) picks the experts: logits within 1e-5
    of transformers', and the bias is not decoration (zeroed, the logits move); the export
    (bias included) loads back exactly."""
    from corerl.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "glm", family="glm4_moe", hidden_size=64, num_layers=3, num_heads=4,
                             num_kv_heads=2, head_dim=16, num_experts=4, experts_per_token=2,
                             expert_intermediate_size=32, tie_word_embeddings=False)
    [result] = _run([model], tmp_path)
    assert result["family"] == "glm4_moe"
    assert result["logit_diff"] <= 1e-5 and result["export_diff"] <= 1e-5, result
    assert result["same_names"] and result["exact"], result
    assert result["unbiased_diff"] > 1e-3, result


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
