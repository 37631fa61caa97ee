"""The README's main job: `corerl run` on the built-in demo, end to end on CPU."""

from __future__ import annotations

import json

from tests.conftest import run_corerl


def test_demo_runs_to_the_end_and_the_held_out_reward_rises(tmp_path):
    result = run_corerl("run", f"run.output_dir={tmp_path}", "run.name=demo")
    assert result.code == 0, result
    run_dir = tmp_path / "demo"
    assert f"run directory: {run_dir}" in " ".join(result.out.split())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["training_backend"] == "dtensor" and summary["generation_backend"] == "vllm"
    assert summary["held_out_reward_after"] >= summary["held_out_reward_before"] + 0.25, summary
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == summary["steps"] == 80
    assert max(r["logprob_mismatch/max"] for r in rows) < 1e-3  # vLLM and dtensor agree on the samples
    assert (run_dir / "final" / "config.json").exists() and list((run_dir / "final").glob("*.safetensors"))
    again = run_corerl("run", f"run.output_dir={tmp_path}", "run.name=demo")
    assert again.code == 2 and "already holds a run" in again.err
