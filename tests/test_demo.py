"""The README's main job: `corerl run` on the built-in demo (SFT warm start, then GRPO), end to end on CPU."""

from __future__ import annotations

import json
import re

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.conftest import run_corerl

#: every line corerl writes on the demo's terminal: the selection table, its own lines, the bars
CORERLS_LINES = re.compile(r"[┏┃┡│└].*|\S+demo\.yaml: running|run directory: .*|held-out reward.*|(SFT|GRPO) +━.*|wrote .*")


def test_demo_runs_to_the_end_and_grpo_raises_the_held_out_reward_over_the_sft_start(tmp_path):
    result = run_corerl("run", f"run.output_dir={tmp_path}", "run.name=demo")
    assert result.code == 0, result
    run_dir = tmp_path / "demo"
    assert f"run directory: {run_dir}" in result.out
    foreign = [line for line in (result.out + result.err).splitlines() if not CORERLS_LINES.fullmatch(line)]
    assert foreign == [], f"lines corerl did not write reached the terminal (they belong in run.log): {foreign}"
    chatter = (run_dir / "run.log").read_text()  # torch's and vLLM's lines from the engine's actor, corerl's log
    assert "FutureWarning" in chatter and "safetensors" in chatter and "INFO corerl." in chatter
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["training_backend"] == "dtensor" and summary["generation_backend"] == "vllm"
    assert summary["held_out_reward_after_sft"] > summary["held_out_reward_before"], summary  # SFT taught the form
    assert summary["held_out_reward_after"] >= summary["held_out_reward_after_sft"] + 0.25, summary

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    sft, grpo = [r for r in rows if r["phase"] == "sft"], [r for r in rows if r["phase"] == "grpo"]
    assert len(sft) == summary["sft_steps"] == 15 and len(grpo) == summary["grpo_steps"] == 100
    assert sft[-1]["loss"] < sft[0]["loss"] / 2
    assert max(r["logprob_mismatch/rms"] for r in grpo) < 1e-3  # vLLM and dtensor agree on the samples

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert len(events.Scalars("grpo/reward/mean")) == 100 and len(events.Scalars("sft/loss")) == 15
    assert (run_dir / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (run_dir / "final" / "config.json").exists() and list((run_dir / "final").glob("*.safetensors"))
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_000115"]  # keep_last: 1

