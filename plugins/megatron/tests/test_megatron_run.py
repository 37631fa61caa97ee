"""The demo-sized GRPO recipe with both megatron and dtensor enabled runs on megatron, and says
why; megatron generation samples with the training model itself."""

from __future__ import annotations

import json

from tests.conftest import clean_env, run_corerl


def test_with_megatron_and_dtensor_enabled_the_run_uses_megatron_and_says_why(tmp_path):
    env = clean_env({"CORERL_MEGATRON_CHECKPOINT_DIR": str(tmp_path / "converted")})
    result = run_corerl("run", f"run.output_dir={tmp_path}", "run.name=both", "policy.megatron_cfg.enabled=true",
                        "policy.dtensor_cfg.enabled=true", "policy.megatron_cfg.optimizer.lr=3e-3", "sft.max_steps=2",
                        "algorithm.max_steps=2",
                        "policy.generation.backend=megatron", "checkpointing.enabled=false", env=env)
    assert result.code == 0, result
    assert "'megatron' has the highest priority (300) over 'dtensor' (100, also enabled)" in result.out
    assert "training backend 'dtensor' passed over" in result.out + result.err
    assert "generation samples with the megatron training model itself" in result.out
    summary = json.loads((tmp_path / "both" / "summary.json").read_text())
    assert summary["training_backend"] == "megatron" and summary["generation_backend"] == "megatron"
    assert summary["steps"] == 4
    rows = [json.loads(line) for line in (tmp_path / "both" / "metrics.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in rows] == ["sft", "sft", "grpo", "grpo"]
    assert rows[1]["loss"] < rows[0]["loss"] - 0.1  # SFT learns, on megatron's optimizer and its lr
    assert (tmp_path / "both" / "final" / "config.json").exists()
    assert any((tmp_path / "converted").iterdir())  # the conversion went where the variable says
