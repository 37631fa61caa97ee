"""Mixture-of-experts models on the dtensor backend: FSDP2 and expert parallelism.

Fast tests (one process): the dispatch arithmetic simulated over two ranks, the expert-parallel
layout over a one-rank gloo group against transformers, the refusals and the memory model.
Two slow classes run the conformance suite's MoE checks (corerl.testing.conformance.MoeConformance)
on two Ray ranks, with expert parallelism 2 (and a tiny Mixtral on the same engine) and with
context parallelism 2.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from corerl.config import load_config
from corerl.config.selection import select
from corerl.errors import ConfigError, ConfigErrors
from corerl.models.tiny import build_tiny_model, tiny_hf_config
from corerl.plugin_manager import PluginHost
from corerl.testing import write_recipe
from corerl.testing.conformance import MAX_GRAD_NORM, MOMENTUM, MoeConformance, conformance_batch
from corerl.testing.reference import hf_logprobs
from corerl_dtensor import expert_parallel

TOLERANCE = 1e-5  # the conformance suite's (fp32)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("qwen3-moe"), family="qwen3_moe", hidden_size=64))


def make_config(model_dir, tmp_path, *overrides):
    recipe = write_recipe(tmp_path / "moe.yaml", {"policy": {
        "model_name": model_dir, "precision": "float32", "train_micro_batch_size": 2, "max_grad_norm": MAX_GRAD_NORM,
        "optimizer": {"name": "sgd", "lr": 0.5, "momentum": MOMENTUM}, "generation": {"backend": "hf"}}})
    return load_config(recipe, list(overrides), PluginHost(env={}))


# -- the dispatch, simulated over two ranks ------------------------------------------------


def _experts(family: str) -> torch.nn.Module:
    from transformers import AutoConfig

    config = AutoConfig.for_model(**tiny_hf_config(family=family, hidden_size=32))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    experts = model.model.layers[0].mlp.experts
    with torch.no_grad():
        for param in (experts.gate_up_proj, experts.down_proj):
            param.normal_(0, 0.2)
    return experts


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_two_rank_dispatch_arithmetic_equals_the_transformers_experts(family):
    """Each simulated rank routes its own tokens (uneven: rank 1 sends all its slots to rank 0's
    experts); the rows exchanged as the plans say, computed by the owners' local experts and sent
    back, give transformers' output for every token."""
    experts, ep, k = _experts(family), 2, 2
    local = experts.num_experts // ep
    hidden = [torch.randn(5, 32), torch.randn(3, 32)]
    index = [torch.tensor([[0, 5], [7, 2], [3, 4], [1, 6], [5, 0]]), torch.tensor([[0, 1], [2, 3], [1, 0]])]
    weights = [torch.softmax(torch.randn(len(i), k), -1) for i in index]
    slots = [expert_parallel.slot_order(i, experts.num_experts) for i in index]
    plans = []
    for rank in range(ep):  # what all_to_all_single of the counts gives rank `rank`
        received = torch.cat([counts[rank * local:(rank + 1) * local] for _, counts in slots])
        plans.append(expert_parallel.plan_from_counts(*slots[rank], received, ep))
    assert plans[1].send_splits == [6, 0] and plans[0].recv_splits == [5, 6] and plans[1].recv_splits == [5, 0]

    def exchange(rows: list[torch.Tensor], splits: list[list[int]]) -> list[torch.Tensor]:
        parts = [torch.split(r, s) for r, s in zip(rows, splits, strict=True)]
        return [torch.cat([parts[src][dst] for src in range(ep)]) for dst in range(ep)]

    sent = [h[p.order // k] for h, p in zip(hidden, plans, strict=True)]
    received = exchange(sent, [p.send_splits for p in plans])
    computed = []
    for rank, (rows, plan) in enumerate(zip(received, plans, strict=True)):
        shard = torch.nn.Module()
        shard.gate_up_proj = experts.gate_up_proj[rank * local:(rank + 1) * local]
        shard.down_proj = experts.down_proj[rank * local:(rank + 1) * local]
        shard.act_fn = experts.act_fn
        out = expert_parallel.run_local_experts(shard, rows[plan.local_order], plan.local_counts, ep)
        computed.append(out[expert_parallel.inverse(plan.local_order)])
    returned = exchange(computed, [p.recv_splits for p in plans])
    for rank, plan in enumerate(plans):
        per_slot = returned[rank][expert_parallel.inverse(plan.order)].view(len(index[rank]), k, -1)
        ours = (per_slot * weights[rank].unsqueeze(-1)).sum(1)
        with torch.no_grad():
            reference = type(experts).forward(experts, hidden[rank], index[rank], weights[rank])
        assert torch.allclose(ours, reference, atol=1e-6), (ours - reference).abs().max()


def test_inverse_undoes_a_permutation():
    permutation = torch.randperm(11)
    assert torch.equal(torch.arange(11)[permutation][expert_parallel.inverse(permutation)], torch.arange(11))


# -- the expert-parallel layout in one process --------------------------------------------


@pytest.fixture
def one_rank_group():
    import torch.distributed as dist

    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_expert_parallel_layout_over_one_rank_matches_transformers(moe_dir, one_rank_group):
    """The real path (DTensor experts, the all-to-all dispatch, FSDP2 over dp and edp) on a gloo
    group of one rank: logits, gradients and the full state dict equal transformers'."""
    from types import SimpleNamespace

    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from corerl_dtensor.parallelize import parallelize

    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    reference = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32)
    expected = reference(input_ids=ids, labels=ids)
    expected.loss.backward()
    model = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32)
    settings = SimpleNamespace(tensor_parallel_size=1, sequence_parallel=False, activation_checkpointing=False,
                               fsdp_version=2, cpu_offload=False, expert_parallel_size=1)
    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
    experts_mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("edp", "ep"))
    model, _, _ = parallelize(model, mesh, settings, torch.float32, torch.device("cpu"), experts_mesh)
    experts = model.model.layers[0].mlp.experts
    assert isinstance(experts.gate_up_proj, DTensor) and experts.forward.__func__.__name__ == "forward"
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    assert (out.logits - expected.logits).abs().max() <= TOLERANCE
    grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
    worst = max((grads[name] - p.grad).abs().max().item() for name, p in reference.named_parameters())
    assert worst <= TOLERANCE
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    assert state.keys() == reference.state_dict().keys()
    assert state["model.layers.1.mlp.experts.down_proj"].shape == reference.model.layers[1].mlp.experts.down_proj.shape


# -- refusals ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["cluster.gpus_per_node=2", "policy.dtensor_cfg.expert_parallel_size=2", "policy.dtensor_cfg.fsdp_version=1"],
         "policy.dtensor_cfg.expert_parallel_size"),
        (["cluster.gpus_per_node=2", "policy.dtensor_cfg.expert_parallel_size=2", "policy.lora.enabled=true"],
         "policy.dtensor_cfg.expert_parallel_size"),
        (["cluster.gpus_per_node=2", "policy.dtensor_cfg.tensor_parallel_size=2"], "policy.dtensor_cfg.tensor_parallel_size"),
        (["cluster.gpus_per_node=6", "policy.dtensor_cfg.expert_parallel_size=3"], "policy.dtensor_cfg.expert_parallel_size"),
    ],
)
def test_expert_parallel_layouts_the_backend_lacks_are_refused_in_one_line(moe_dir, tmp_path, overrides, key):
    config = make_config(moe_dir, tmp_path, "policy.training_backend=dtensor", *overrides)
    with pytest.raises(ConfigError) as caught:
        select(config, PluginHost(env={}))
    assert caught.value.key == key and "\n" not in str(caught.value)


def test_expert_parallel_size_must_divide_the_world(moe_dir, tmp_path):
    with pytest.raises(ConfigErrors) as caught:
        make_config(moe_dir, tmp_path, "cluster.gpus_per_node=2", "policy.dtensor_cfg.expert_parallel_size=4")
    assert str(caught.value).startswith("policy.dtensor_cfg.expert_parallel_size: expert_parallel_size (4) must divide")


# -- corerl plan ---------------------------------------------------------------------------


def test_plan_shards_experts_by_expert_parallelism_and_ranks_those_layouts_first():
    from corerl.planning.memory import PlanRequest
    from corerl.planning.planner import make_plan
    from corerl.planning.shape import ModelShape
    from corerl_dtensor.memory_model import DTensorMemory

    shape = ModelShape.from_hf_config(tiny_hf_config(  # Qwen3-30B-A3B's sizes
        family="qwen3_moe", hidden_size=2048, num_layers=48, num_heads=32, num_kv_heads=4, head_dim=128,
        vocab_size=151936, num_experts=128, experts_per_token=8, expert_intermediate_size=768), name="qwen3-30b-a3b")
    request = PlanRequest(shape=shape, gpus_per_node=8, precision="bfloat16", seq_length=2048)
    memory = DTensorMemory()
    layouts = memory.layouts(request)
    assert sorted({layout.ep for layout in layouts}) == [1, 2, 4, 8] and {layout.tp for layout in layouts} == {1}
    estimates = {layout.ep: memory.estimate(request, layout) for layout in layouts if not layout.activation_checkpointing}
    for ep in (2, 4, 8):  # persistent state as FSDP's; the unsharded working layer holds routed experts / ep
        assert estimates[ep].optimizer == estimates[1].optimizer
        saved = estimates[1].parameters - estimates[ep].parameters
        assert saved == pytest.approx(shape.moe_layers * shape.routed_experts * (1 - 1 / ep) / shape.layers * 2, rel=1e-6)
    plan = make_plan(request, {"dtensor": memory})
    assert plan.recommended is not None and "EP=8" in plan.recommended.layout.name
    assert "policy.dtensor_cfg.expert_parallel_size=8" in plan.recommended.overrides()
    dense = PlanRequest(shape=ModelShape.from_hf_config(tiny_hf_config(hidden_size=512, num_layers=4)), gpus_per_node=2)
    assert all("EP" not in layout.name and layout.ep == 1 for layout in memory.layouts(dense))


# -- world size 2 over gloo (slow) ---------------------------------------------------------


class TestMoeExpertParallel2(MoeConformance):
    """The conformance suite's MoE checks at two ranks with expert parallelism 2 (one engine for
    the class: logprobs, a step with the router's loss terms, the weight stream and export, a dcp
    checkpoint each rank writes its experts' shards to); on the same engine, a tiny Mixtral."""

    backend_id = "dtensor"
    overrides = ["cluster.gpus_per_node=2"]

    @pytest.fixture(scope="class")
    @classmethod
    def mixtral_dir(cls, tmp_path_factory):
        return str(build_tiny_model(tmp_path_factory.mktemp("mixtral"), family="mixtral", hidden_size=64))

    def test_the_layout_is_expert_parallel_2(self):
        assert self.expert_parallel_overrides() == ["policy.dtensor_cfg.expert_parallel_size=2"]

    def test_mixtral_under_expert_parallelism_matches_transformers(self, moe_backend, mixtral_dir):
        batch = conformance_batch()
        moe_backend.load_hf(mixtral_dir)
        reference = hf_logprobs(AutoModelForCausalLM.from_pretrained(mixtral_dir, dtype=torch.float32), batch)
        assert (moe_backend.logprobs(batch) - reference).abs().max() <= TOLERANCE


class TestMoeContextParallel2(MoeConformance):
    """The conformance suite's MoE checks at two ranks with context parallelism 2: each sequence
    split over the ranks, the router's terms taken over whole rows (gathered over the ring), FSDP2
    sharding the fused experts over both ranks as any other parameter. It took the place of the
    data-parallel-2 class (world size 2's default layout for a MoE): FSDP2's sharding of the
    experts is checked here, the rows dealt to two data-parallel ranks with their router terms and
    metrics by the expert-parallel class above."""

    backend_id = "dtensor"
    overrides = ["cluster.gpus_per_node=2", "policy.dtensor_cfg.context_parallel_size=2"]
    expert_parallel = False

    def test_both_ranks_run_ring_attention_as_one_data_parallel_rank(self, moe_backend, moe_dir):
        moe_backend.load_hf(moe_dir)
        layouts = moe_backend.group.call("parallel_layout")
        assert [(x["dp"], x["cp"], x["ring_rank"], x["attention"]) for x in layouts] == \
            [(1, 2, 0, "corerl_ring"), (1, 2, 1, "corerl_ring")]
