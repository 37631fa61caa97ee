"""The Megatron recipes in examples/configs validate and select what they say."""

from __future__ import annotations

import json

from tests.conftest import EXAMPLES, run_corerl


def test_the_72b_style_recipe_validates_with_tp8_pp4_over_64_ranks():
    result = run_corerl("validate", "--recipe-only", str(EXAMPLES / "grpo_megatron_72b.yaml"), "--json")
    assert result.code == 0, result
    report = json.loads(result.out)
    assert report["valid"] and report["training_backend"]["id"] == "megatron"
    assert report["generation_backend"]["id"] == "vllm"
    shown = run_corerl("validate", "--recipe-only", str(EXAMPLES / "grpo_megatron_72b.yaml"),
                       "policy.megatron_cfg.pipeline_model_parallel_size=3", "--json")
    assert shown.code == 2  # 8 x 3 does not divide 64 ranks: the sizes are checked, not just read
    assert "pipeline_model_parallel_size" in shown.out


def test_the_tiny_cpu_recipe_selects_megatron_for_training_and_generation():
    result = run_corerl("validate", str(EXAMPLES / "grpo_megatron_tiny_cpu.yaml"), "--json")
    assert result.code == 0, result
    report = json.loads(result.out)
    assert report["training_backend"]["id"] == "megatron" and report["generation_backend"]["id"] == "megatron"
