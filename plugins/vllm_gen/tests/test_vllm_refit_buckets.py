"""A multi-process vLLM engine (its engine core and worker in another process) takes a refit in
buckets through shared memory (corerl.generation.weight_buckets), buckets here smaller than any
of the model's matrices: every group of tensors alone in one, the tied head with the embeddings.
Its greedy completions after the refit are plain transformers' on the same weights."""

from __future__ import annotations

import os

import torch

from corerl.config import config_from_mapping
from corerl.generation.contract import SamplingSettings
from corerl.generation.weight_buckets import group_of, plan_buckets
from corerl.plugin_manager import PluginHost
from corerl.testing.generation_conformance import PROMPTS, reference_greedy

MAX_NEW = 8


def _weights(model_dir: str) -> list[tuple[str, torch.Tensor]]:
    from transformers import AutoModelForCausalLM

    return list(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict().items())


def test_a_multi_process_engine_takes_a_refit_in_buckets_smaller_than_one_tensor(tmp_path):
    from corerl.models.tiny import build_tiny_model

    first, second = (str(build_tiny_model(tmp_path / f"model-{seed}", seed=seed, initializer_range=0.3, hidden_size=128,
                                          num_heads=4, num_kv_heads=2, num_layers=2)) for seed in (0, 1))
    config = config_from_mapping({"policy": {"model_name": first, "max_seq_length": 64, "generation": {
        "backend": "vllm", "vllm_cfg": {"host": "driver", "engine_layout": "multi_process", "cpu_kvcache_space_gib": 0.05,
                                        "refit_bucket_mib": 4 / 1024}}}}, PluginHost(env={}))  # 4 KiB buckets
    backend = PluginHost(env={}).generation_backends.get("vllm").create(config=config)
    engine = backend.group.worker
    sampling = SamplingSettings(temperature=0.0, max_new_tokens=MAX_NEW, stop_token_ids=(3,))

    def greedy() -> list[list[int]]:
        return [list(g[0].completion_ids) for g in backend.generate(PROMPTS, sampling)]

    files: list[str] = []
    try:
        backend.load_hf(first)
        assert engine.layout == "multi_process" and engine.llm.llm_engine.engine_core.__class__.__name__ != "InprocClient"
        before = greedy()
        weights = _weights(second)
        assert max(t.numel() * 4 for _, t in weights) > 4096 and min(t.numel() * 4 for _, t in weights) < 4096
        backend.update_weights(weights)
        after = greedy()
        assert after != before and after == reference_greedy(second, PROMPTS, MAX_NEW, stop_id=3)
        refit = engine.last_refit  # every group in a bucket of its own, the tied head written once
        planned = plan_buckets(weights, 4096)
        assert refit.buckets == len(planned) == 7  # embeddings+head; per block attention, MLP, the two norms
        # the embeddings with the tied head, and each block's two norms (the last one's with the final norm)
        assert sum(len({group_of(n) for n, _ in bucket}) > 1 for bucket in planned) == 3
        assert refit.bytes == sum(t.numel() * 4 for n, t in weights if n != "lm_head.weight")
        # back, without the tied copy (contract 2.14): the head follows the embeddings' bucket
        backend.update_weights([(n, t) for n, t in _weights(first) if n != "lm_head.weight"])
        assert greedy() == reference_greedy(first, PROMPTS, MAX_NEW, stop_id=3) == before
        files += [w.path for w in (engine.buckets, engine.buckets.partner)]
        assert all(os.path.exists(path) for path in files)
    finally:
        backend.shutdown()
    assert not any(os.path.exists(path) for path in files)  # the two buffers go with the engine
