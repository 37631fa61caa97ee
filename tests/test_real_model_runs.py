"""A real pretrained model through the CLI: SmolLM2-135M-Instruct (the packaged GGUF, converted
once into corerl's model cache and reused by later runs) takes a GRPO step on the arithmetic
task with vLLM generation, and the run says what it measured."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_corerl


@pytest.mark.slow
def test_one_grpo_step_of_smollm2_on_arithmetic_through_the_cli(tmp_path):
    result = run_corerl(
        "run", "examples/configs/grpo_smollm2_arithmetic.yaml", f"run.output_dir={tmp_path}", "run.name=real",
        "algorithm.max_steps=1", "algorithm.batch_size=2", "algorithm.num_generations_per_prompt=4",
        "policy.generation.max_new_tokens=16", "data.held_out_size=4", "checkpointing.enabled=false")
    assert result.code == 0, result.err[-2000:]
    run_dir = tmp_path / "real"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["generation_backend"] == "vllm" and summary["training_backend"] == "dtensor"
    assert 0.0 <= summary["held_out_reward_before"] <= 1.0 and "held_out_reward_after" in summary
    step = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    assert step["step"] == 1 and step["generated_tokens"] > 0 and step["grad_norm"] > 0
    config = json.loads((run_dir / "final" / "config.json").read_text())
    assert config["vocab_size"] == 49152 and "quantization_config" not in config  # the real model, dequantized
