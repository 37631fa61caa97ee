"""The demo-sized GRPO recipe on deepspeed, end to end, started by scripts/launch_zero3.sh."""

from __future__ import annotations

import json
import subprocess

from tests.conftest import REPO, clean_env


def test_the_demo_recipe_runs_on_deepspeed_zero3_through_the_launcher(tmp_path):
    proc = subprocess.run(
        [str(REPO / "scripts" / "launch_zero3.sh"), str(REPO / "examples" / "configs" / "demo.yaml"),
         f"run.output_dir={tmp_path}", "run.name=zero3", "cluster.gpus_per_node=2", "sft.max_steps=3",
         "algorithm.max_steps=2", "policy.generation.backend=hf", "checkpointing.save_period=2"],
        capture_output=True, text=True, env=clean_env(), cwd=tmp_path, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "policy.training_backend names 'deepspeed'" in proc.stdout
    assert "Setting accelerator to CPU" not in proc.stdout  # DeepSpeed's notice stays off stdout
    run = tmp_path / "zero3"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["training_backend"] == "deepspeed" and summary["steps"] == 5
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in rows] == ["sft"] * 3 + ["grpo"] * 2
    assert rows[2]["loss"] < rows[0]["loss"]  # SFT learns on ZeRO-3 shards over two ranks
    assert (run / "final" / "model.safetensors").exists()  # ZeRO-3 shards gathered into full weights
    assert any((run / "checkpoints").iterdir())
