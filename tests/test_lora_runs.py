"""The LoRA demo end to end with vLLM, as a user runs it: every refit reaches the engine as an
adapter (the engine's logprobs equal training's), the run resumes from its adapter-only
checkpoint, and final/ loads with PEFT."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import REPO, run_corerl

DEMO = str(REPO / "examples" / "configs" / "grpo_lora_demo.yaml")


@pytest.mark.slow
def test_the_lora_demo_refits_vllm_with_its_adapter_resumes_and_exports_a_peft_folder(tmp_path):
    common = [f"run.output_dir={tmp_path}", "run.name=lora", "sft.max_steps=3", "checkpointing.save_period=2",
              "run.tensorboard=false"]
    first = run_corerl("run", DEMO, "algorithm.max_steps=2", *common)
    assert first.code == 0, first
    run = tmp_path / "lora"
    resumed = run_corerl("run", DEMO, "algorithm.max_steps=4", *common)
    assert resumed.code == 0, resumed
    assert "resuming from step" in resumed.out and "(PEFT LoRA adapter)" in resumed.out
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    grpo = [r for r in rows if r.get("phase") == "grpo"]
    assert len(grpo) == 4, [(r.get("phase"), r.get("step")) for r in rows]  # two steps, then two after resuming
    # vLLM samples with the adapter training has: its logprobs are training's (float32, CPU)
    assert all(r["logprob_mismatch/max"] < 1e-3 for r in grpo), [r["logprob_mismatch/max"] for r in grpo]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["generation_backend"] == "vllm", summary
    checkpoint = sorted((run / "checkpoints").iterdir())[-1]
    held = sum(p.stat().st_size for p in (checkpoint / "training" / "weights").rglob("*") if p.is_file())
    base = (run / "sft_model" / "model.safetensors").stat().st_size
    # the adapter and its Adam moments: a whole model's checkpoint would hold three times the base
    assert held < base, (held, base)

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    config = json.loads((run / "final" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(run / "sft_model") and config["r"] == 8
    base_model = AutoModelForCausalLM.from_pretrained(str(run / "sft_model"), dtype=torch.float32)
    adapted = PeftModel.from_pretrained(base_model, str(run / "final"))
    ids = torch.tensor([[2, 5, 9, 13]])
    with torch.no_grad():
        trained = adapted(ids).logits
        with adapted.disable_adapter():
            untouched = adapted(ids).logits
    assert float((trained - untouched).abs().max()) > 1e-4  # the adapter GRPO trained is in final/
