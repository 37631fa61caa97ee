"""``policy.dequantize_base_checkpoint``: a quantised checkpoint (gpt-oss's MXFP4 experts), which
transformers loads for inference only, dequantised once into corerl's model cache by transformers'
own loader, and refused in one line where it cannot train."""

from __future__ import annotations

import json

import pytest
import torch

from tests.gpt_oss_checkpoint import build_mxfp4_gpt_oss


@pytest.fixture(scope="module")
def mxfp4_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("gpt-oss-mxfp4")
    build_mxfp4_gpt_oss(folder)
    return str(folder)


def test_the_copy_holds_transformers_dequantisation_of_each_expert_and_is_made_once(mxfp4_dir, tmp_path, monkeypatch):
    from safetensors.torch import load_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from corerl.models.dequantize import ensure_dequantized, quantization_of

    monkeypatch.setenv("CORERL_MODEL_CACHE", str(tmp_path / "cache"))
    packed = load_file(f"{mxfp4_dir}/model.safetensors")
    folder = ensure_dequantized(mxfp4_dir)
    assert quantization_of(mxfp4_dir) == "mxfp4" and quantization_of(folder) is None
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    weights = {}
    for file in folder.glob("*.safetensors"):
        weights.update(load_file(str(file)))
    for name in ("model.layers.0.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj"):
        want = convert_moe_packed_tensors(packed[f"{name}_blocks"], packed[f"{name}_scales"], dtype=torch.float32)
        assert torch.equal(weights[name].float(), want), name
        assert want.abs().max() > 0
    assert weights["model.embed_tokens.weight"].shape == (128, 64)  # the unquantised tensors come along
    stamp = (folder / "config.json").stat().st_mtime_ns
    assert ensure_dequantized(mxfp4_dir) == folder and (folder / "config.json").stat().st_mtime_ns == stamp


def test_a_quantised_checkpoint_is_refused_unless_dequantised_and_the_switch_on_a_plain_one(mxfp4_dir, tmp_path):
    from corerl.errors import ConfigError
    from corerl.models.dequantize import check_quantized_checkpoint
    from corerl.models.tiny import build_tiny_model

    with pytest.raises(ConfigError) as refused:
        check_quantized_checkpoint(mxfp4_dir, dequantize=False)
    assert refused.value.key == "policy.dequantize_base_checkpoint" and "inference only" in str(refused.value)
    check_quantized_checkpoint(mxfp4_dir, dequantize=True)
    plain = str(build_tiny_model(tmp_path / "plain", hidden_size=32, num_heads=2, num_kv_heads=1))
    with pytest.raises(ConfigError, match="is not quantised"):
        check_quantized_checkpoint(plain, dequantize=True)
    check_quantized_checkpoint(plain, dequantize=False)
    other = tmp_path / "awq"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "awq"}}))
    with pytest.raises(ConfigError, match="'awq', which corerl cannot dequantise"):
        check_quantized_checkpoint(str(other), dequantize=True)
