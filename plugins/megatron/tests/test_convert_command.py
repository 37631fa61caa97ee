"""``corerl convert``: both directions from the command line, as a user runs them."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file

from corerl.models.tiny import build_tiny_model
from tests.conftest import clean_env, run_corerl
from tests.refusals import refused_in_one_line


@pytest.mark.slow
def test_hf_to_megatron_and_back_gives_the_same_weights_and_a_loadable_model(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = build_tiny_model(tmp_path / "hf", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2)
    env = clean_env({"CORERL_MEGATRON_CHECKPOINT_DIR": str(tmp_path / "cache")})
    there = run_corerl("convert", "hf-to-megatron", str(source), str(tmp_path / "mcore"), env=env)
    assert there.code == 0, there
    assert f"wrote {tmp_path / 'mcore'}" in there.out
    back = run_corerl("convert", "megatron-to-hf", str(tmp_path / "mcore"), str(tmp_path / "back"), env=env)
    assert back.code == 0, back
    original, restored = load_file(str(next(source.glob("*.safetensors")))), load_file(
        str(next((tmp_path / "back").glob("*.safetensors"))))
    assert set(original) == set(restored)
    assert all(torch.equal(original[name], restored[name]) for name in original)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "back")  # a complete checkpoint, tokenizer included
    assert model.config.num_hidden_layers == 2
    assert AutoTokenizer.from_pretrained(tmp_path / "back").vocab_size == AutoTokenizer.from_pretrained(source).vocab_size

    cached = run_corerl("convert", "hf-to-megatron", str(source), env=env)  # no TARGET: the cache runs use
    assert cached.code == 0, cached
    assert f"wrote {tmp_path / 'cache'}" in cached.out


def test_convert_reports_user_mistakes_in_one_line_with_exit_2(tmp_path):
    source = build_tiny_model(tmp_path / "hf", hidden_size=32, num_layers=1)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("taken")
    cases = [
        (["hf-to-megatron", str(tmp_path / "nowhere")], "no checkpoint folder at"),
        (["hf-to-megatron", str(source), str(tmp_path / "full")], "exists and is not empty; pass --force"),
        (["megatron-to-hf", str(source)], "megatron-to-hf needs a TARGET folder"),
        (["megatron-to-hf", str(source), str(tmp_path / "out")], "is not a complete corerl Megatron conversion"),
        (["sideways", str(source)], "invalid choice: 'sideways'"),
    ]
    for args, expected in cases:
        refused_in_one_line(run_corerl("convert", *args), expected)
