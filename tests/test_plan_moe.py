"""``corerl plan`` on a mixture of experts: megatron's expert-parallel layouts, and a recommendation
that splits the experts where it fits (Qwen3-30B-A3B on 4 nodes x 8 GPUs, as NeMo RL's recipes
run it: megatron with EP 8); the planner's preferences are the backends' own."""

from __future__ import annotations

import json

from corerl.planning.memory import GIB, PlanRequest
from corerl.planning.planner import (
    decision_rule,
    installed_generation_models,
    installed_models,
    make_plan,
)
from corerl.planning.shape import ModelShape
from corerl.plugin_manager import PluginHost
from tests.conftest import run_corerl

#: Qwen/Qwen3-30B-A3B's config.json (the sizes only)
QWEN3_30B_A3B = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
                 "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
                 "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
                 "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936,
                 "tie_word_embeddings": False, "max_position_embeddings": 40960, "attention_bias": False}


def _shape() -> ModelShape:
    return ModelShape.from_hf_config(QWEN3_30B_A3B, name="Qwen3-30B-A3B")


def test_qwen3_moe_on_four_nodes_is_planned_with_megatron_expert_parallelism():
    shape = _shape()
    assert (shape.experts, shape.experts_per_token, shape.moe_layers) == (128, 8, 48)
    assert abs(shape.parameters / 1e9 - 30.5) < 0.1
    host = PluginHost()
    request = PlanRequest(shape, gpus_per_node=8, nodes=4, gpu_memory=80 * GIB, seq_length=4096, micro_batch=1)
    plan = make_plan(request, installed_models(host), installed_generation_models(host))
    megatron = [c for c in plan.candidates if c.layout.backend == "megatron"]
    with_ep = [c for c in megatron if c.layout.ep > 1]
    assert with_ep and {c.layout.ep for c in with_ep} == {2, 4, 8}  # within a node, dividing the 128 experts
    assert all(c.generation_label.startswith("vLLM") for c in with_ep)  # megatron generation does not split experts
    best = plan.recommended
    assert best is not None and best.fits and best.follows_rule, plan.why
    assert best.layout.backend == "megatron" and best.layout.ep in (4, 8), best.layout.name
    assert f"policy.megatron_cfg.expert_model_parallel_size={best.layout.ep}" in best.overrides()
    assert "expert parallelism" in plan.rule.why and plan.rule.why in plan.why


def test_expert_parallelism_divides_the_routed_experts_a_megatron_rank_holds():
    from corerl_megatron.training.memory_model import MegatronMemory

    shape, memory = _shape(), MegatronMemory()
    request = PlanRequest(shape, gpus_per_node=8, nodes=4, gpu_memory=80 * GIB)
    routed = shape.moe_layers * shape.routed_experts
    for ep in (1, 2, 4, 8):
        dense, experts = memory.stage_split(request, tp=1, pp=1, ep=ep)
        assert experts == int(routed / ep) and dense + routed == shape.parameters  # nothing else is split at TP 1
    # at expert-tensor-parallel 1, tensor parallelism leaves every expert whole on each rank
    assert memory.stage_split(request, tp=4, pp=1, ep=1)[1] == routed
    # the distributed optimizer shards the experts over the expert-data-parallel ranks (tp x dp / ep)
    layout = next(x for x in memory.layouts(request) if x.ep == 8 and x.tp == 1 and x.pp == 1)
    estimate = memory.estimate(request, layout)
    dense, experts = memory.stage_split(request, 1, 1, 8)
    assert estimate.optimizer == int(12 * dense / 32 + 12 * experts / 4)


def test_a_dense_model_gets_no_expert_layouts_and_its_megatron_layouts_are_unchanged():
    from tests.test_plan import _qwen

    models = installed_models(PluginHost())
    request = PlanRequest(_qwen("32B"), gpus_per_node=8, nodes=2)
    layouts = models["megatron"].layouts(request)
    assert layouts and all(getattr(x, "ep", 1) == 1 and "expert" not in " ".join(x.overrides) for x in layouts)
    assert (decision_rule(request).backend, decision_rule(request).generation) == ("megatron", "vllm")


def test_a_memory_model_without_a_preference_is_planned_all_the_same():
    """An older contract's memory model (no ``preference``) is ranked with the others; the plan
    follows the preferences of those that state one."""
    from tests.test_plan import _qwen

    class Plain:  # layouts, layout_of and estimate only
        def __init__(self, inner):
            self.inner = inner

        def layouts(self, request):
            return self.inner.layouts(request)

        def layout_of(self, config, request):
            return self.inner.layout_of(config, request)

        def estimate(self, request, layout):
            return self.inner.estimate(request, layout)

    models = installed_models(PluginHost())
    request = PlanRequest(_qwen("1.5B"), gpus_per_node=4, gpu_memory=80 * GIB)
    plain = make_plan(request, {**models, "dtensor": Plain(models["dtensor"])})
    assert plain.rule.backend is None and plain.recommended is not None and plain.recommended.fits
    assert any(c.layout.backend == "dtensor" for c in plain.candidates)
    assert make_plan(request, models).rule.backend == "dtensor"


def test_corerl_plan_on_the_qwen3_moe_folder(tmp_path):
    folder = tmp_path / "Qwen3-30B-A3B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN3_30B_A3B))
    result = run_corerl("plan", str(folder), "policy.max_seq_length=4096", "policy.train_micro_batch_size=1",
                        "--gpus", "8", "--nodes", "4", "--json")
    assert result.code == 0, result
    plan = json.loads(result.out)
    assert plan["recommended"]["backend"] == "megatron" and "EP=" in plan["recommended"]["layout"]
    assert any(f"policy.megatron_cfg.expert_model_parallel_size={n}" in plan["recommended"]["overrides"]
               for n in (4, 8))
