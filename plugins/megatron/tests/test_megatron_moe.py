"""A mixture of experts on the megatron backend: megatron-core's MoE layers built from a
Hugging Face Qwen3-MoE, expert parallelism over gloo (the all-to-all and all-gather token
dispatchers) computing and training what one rank does, the router's settings (policy.moe) and
metrics, router replay, and what the backend refuses in one line."""

from __future__ import annotations

import pytest
import torch

from corerl.testing import write_recipe
from corerl.testing.conformance import (
    LR,
    MAX_GRAD_NORM,
    MOMENTUM,
    MoeConformance,
    conformance_batch,
    conformance_loss,
)
from corerl.testing.generation_conformance import GenerationBackendConformance

MEGATRON = ["policy.megatron_cfg.enabled=true", "policy.megatron_cfg.optimizer.optimizer=sgd",
            "policy.megatron_cfg.optimizer.lr=0.1", "policy.megatron_cfg.optimizer.weight_decay=0.0"]
TINY_MOE = dict(family="qwen3_moe", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                num_experts=4, experts_per_token=2, expert_intermediate_size=32, initializer_range=0.2)


def _config(model_dir: str, tmp_path, overrides: list[str]):
    from corerl.config import load_config
    from corerl.plugin_manager import PluginHost

    recipe = write_recipe(tmp_path / "r.yaml", {"policy": {"model_name": model_dir, "precision": "float32",
                                                           "megatron_cfg": {"enabled": True}}})
    return load_config(recipe, overrides, PluginHost())


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from corerl.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("moe"), **TINY_MOE))


# -- fast: config and refusals --------------------------------------------------------------


def test_routing_settings_follow_the_hugging_face_config_and_policy_moe(moe_dir, tmp_path):
    from transformers import AutoConfig

    from corerl_megatron.training.moe_config import moe_fields

    hf = AutoConfig.from_pretrained(moe_dir)
    config = _config(moe_dir, tmp_path, ["policy.moe.load_balancing_type=seq_aux_loss", "policy.moe.aux_loss_coeff=0.01",
                                         "policy.moe.z_loss_coeff=0.001", "policy.megatron_cfg.moe_expert_capacity_factor=1.5",
                                         "policy.megatron_cfg.moe_token_dispatcher_type=alltoall"])
    fields = moe_fields(hf, config.section("policy.megatron_cfg"), config.core.policy.moe)
    assert (fields["num_moe_experts"], fields["moe_router_topk"], fields["moe_ffn_hidden_size"]) == (4, 2, 32)
    assert fields["moe_router_pre_softmax"] is False  # norm_topk_prob: top-k, then renormalise = softmax over the k
    assert fields["qk_layernorm"] is True and fields["moe_layer_freq"] == [1, 1]
    assert fields["moe_router_load_balancing_type"] == "seq_aux_loss" and fields["moe_aux_loss_coeff"] == 0.01
    assert fields["moe_z_loss_coeff"] == 0.001 and fields["moe_expert_capacity_factor"] == 1.5
    assert fields["moe_token_dispatcher_type"] == "alltoall"
    hf.norm_topk_prob = False  # the top-k probabilities as the softmax over every expert gave them
    assert moe_fields(hf)["moe_router_pre_softmax"] is True
    hf.mlp_only_layers = [0]
    assert moe_fields(hf)["moe_layer_freq"] == [0, 1]
    assert moe_fields(AutoConfig.for_model("qwen2", hidden_size=64, num_attention_heads=4)) == {}


@pytest.mark.parametrize(("overrides", "key", "says"), [
    (["cluster.gpus_per_node=2", "policy.megatron_cfg.expert_model_parallel_size=3"], "expert_model_parallel_size",
     "does not divide the 2 training ranks"),
    (["cluster.gpus_per_node=2", "policy.megatron_cfg.expert_tensor_parallel_size=2"], "expert_tensor_parallel_size",
     "tensor parallelism inside experts is not wired"),
    (["policy.megatron_cfg.moe_grouped_gemm=true"], "moe_grouped_gemm", "needs a GPU"),
    (["cluster.gpus_per_node=2", "policy.megatron_cfg.tensor_model_parallel_size=2"], "tensor_model_parallel_size",
     "only together with sequence parallelism"),
    (["policy.moe.router_replay=r2", "policy.megatron_cfg.activation_checkpointing=true"], "activation_checkpointing",
     "router replay r2 on megatron"),
    (["cluster.gpus_per_node=2", "policy.megatron_cfg.pipeline_model_parallel_size=2", "policy.moe.aux_loss_coeff=0.01",
      "policy.moe.load_balancing_type=aux_loss"],
     "pipeline_model_parallel_size", "interleaved backward passes"),
])
def test_what_the_backend_cannot_run_is_refused_in_one_line(moe_dir, tmp_path, overrides, key, says):
    from corerl.errors import CorerlError
    from corerl_megatron.support import check_supported

    with pytest.raises(CorerlError) as refused:
        check_supported(_config(moe_dir, tmp_path, overrides))
    assert refused.value.key.endswith(key) and says in str(refused.value), str(refused.value)
    assert "\n" not in str(refused.value)


def test_expert_names_move_between_local_and_global_numbering():
    from corerl_megatron.training.experts import global_expert_name, is_expert

    name = "decoder.layers.1.mlp.experts.local_experts.1.linear_fc2.weight"
    assert is_expert(name) and not is_expert("decoder.layers.1.mlp.router.weight")
    assert global_expert_name(name, ep_rank=1, per_rank=2) == "decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.weight"
    assert global_expert_name("decoder.layers.1.mlp.router.weight", 1, 2) == "decoder.layers.1.mlp.router.weight"


def test_router_replay_routes_each_row_as_recorded_whatever_its_padding_and_batch():
    """r2's bookkeeping over megatron-core's RouterReplay: rows recorded in one micro-batch layout
    ([seq, batch] token order) are replayed in another (other rows beside them, other width)."""
    from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction

    from corerl_megatron.training.routing import RouteReplay

    RouterReplay.clear_global_router_replay_instances()
    layers = [RouterReplay(), RouterReplay()]
    try:
        ids = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0]])
        mask = (ids > 0).long()
        replay = RouteReplay()
        replay.replay({"input_ids": ids, "attention_mask": mask})  # nothing recorded yet: the rows route afresh
        assert all(r.router_replay_action is None for r in layers)
        replay.start_recording()
        assert all(r.router_replay_action == RouterReplayAction.RECORD for r in layers)
        chosen = [torch.arange(16).view(8, 2) % 4, torch.arange(16).view(8, 2) % 3]  # [seq*batch, k]
        for router, indices in zip(layers, chosen, strict=True):
            router.record_indices(indices)
        replay.keep({"input_ids": ids, "attention_mask": mask})
        replay.stop()
        # row 1 alone, padded to width 3, beside a row of... itself twice: both route as recorded
        again = {"input_ids": torch.tensor([[8, 9, 0], [8, 9, 0]]), "attention_mask": torch.tensor([[1, 1, 0], [1, 1, 0]])}
        replay.replay(again)
        assert all(r.router_replay_action == RouterReplayAction.REPLAY_FORWARD for r in layers)
        for router, indices in zip(layers, chosen, strict=True):
            recorded_row1 = indices.view(4, 2, 2)[:2, 1]  # positions 0, 1 of row 1
            target = router.target_topk_idx.view(3, 2, 2)
            assert torch.equal(target[:2, 0], recorded_row1) and torch.equal(target[:2, 1], recorded_row1)
        with pytest.raises(RuntimeError, match="has no recorded routing"):
            replay.replay({"input_ids": torch.tensor([[5, 6]]), "attention_mask": torch.tensor([[1, 1]])})
        replay.stop()
        assert all(r.router_replay_action is None for r in layers)
    finally:
        RouterReplay.clear_global_router_replay_instances()


def test_r3_routes_each_token_to_the_engines_experts_cut_as_its_tokens_are():
    """r3's targets over megatron-core's RouterReplay: the batch's routed_experts at each router's
    decoder layer, in [seq, batch] token order; experts 0..k-1 where the engine reported none
    (padding, the last token); this rank's positions under context parallelism and its sequence
    chunk under sequence parallelism; free routing for a batch without routes."""
    from types import SimpleNamespace

    from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction

    from corerl_megatron.training.context_parallel import SequenceSplit
    from corerl_megatron.training.routing import GivenRoutes

    RouterReplay.clear_global_router_replay_instances()
    try:
        routers = [SimpleNamespace(layer_number=2, router_replay=RouterReplay()),  # decoder layers 1 and 3
                   SimpleNamespace(layer_number=4, router_replay=RouterReplay())]
        gen = torch.Generator().manual_seed(0)
        routes = torch.rand((2, 4, 4, 4), generator=gen).topk(2, dim=-1).indices.to(torch.int16)  # [rows, width, layers, k]
        routes[0, 2] = -1  # row 0's last token: never run by the engine
        mb = {"input_ids": torch.tensor([[5, 6, 7, 0], [8, 9, 4, 3]]),
              "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]),
              "loss_mask": torch.tensor([[0, 1, 1, 0], [0, 1, 1, 1]]), "routed_experts": routes}
        given = GivenRoutes.__new__(GivenRoutes)
        given.routers, given.tp_rank, given.tp, given.sequence_parallel = routers, 0, 1, False
        given.replay(mb, split=None)
        filler = torch.tensor([0, 1])
        for router, layer in zip(routers, (1, 3), strict=True):
            assert router.router_replay.router_replay_action == RouterReplayAction.REPLAY_FORWARD
            target = router.router_replay.target_topk_idx.view(4, 2, 2)  # [seq, batch, k]
            assert torch.equal(target[:2, 0], routes[0, :2, layer].long())
            assert torch.equal(target[:, 1], routes[1, :, layer].long())
            assert torch.equal(target[2, 0], filler) and torch.equal(target[3, 0], filler)  # none reported, padding
        # context parallelism (2 ranks, rank 1 holds chunks 1 and 2 of 4): its positions, in order
        given.replay(mb, split=SequenceSplit(None, rank=1, size=2))
        held = SequenceSplit(None, rank=1, size=2).positions(4)
        target = routers[1].router_replay.target_topk_idx.view(len(held), 2, 2)
        assert torch.equal(target[:, 1], routes[1, held, 3].long())
        # sequence parallelism over 2 tensor-parallel ranks: rank 1 holds the second half of the sequence
        given.tp_rank, given.tp, given.sequence_parallel = 1, 2, True
        given.replay(mb, split=None)
        assert torch.equal(routers[0].router_replay.target_topk_idx.view(2, 2, 2)[:, 1], routes[1, 2:, 1].long())
        given.replay({k: v for k, v in mb.items() if k != "routed_experts"}, split=None)  # SFT's rows: afresh
        assert all(r.router_replay.router_replay_action is None for r in routers)
        gap = routes.clone()
        gap[1, 1] = -1  # a token inside row 1's loss span the engine did not report: refused, not filled
        given.tp, given.sequence_parallel = 1, False
        with pytest.raises(RuntimeError, match="row 1's token 1 has no reported experts"):
            given.replay({**mb, "routed_experts": gap}, split=None)
    finally:
        RouterReplay.clear_global_router_replay_instances()


# -- slow: expert parallelism over gloo ---------------------------------------------------------

# megatron's own optimizer and scheduler, as the suite's reference step (test_megatron_conformance.py)
MEGATRON_SGD = ["policy.megatron_cfg.enabled=true", "policy.megatron_cfg.optimizer.optimizer=sgd",
                f"policy.megatron_cfg.optimizer.lr={LR}", f"policy.megatron_cfg.optimizer.sgd_momentum={MOMENTUM}",
                f"policy.megatron_cfg.optimizer.clip_grad={MAX_GRAD_NORM}", "policy.megatron_cfg.optimizer.weight_decay=0.0",
                "policy.megatron_cfg.scheduler.lr_decay_style=linear", "policy.megatron_cfg.scheduler.lr_warmup_iters=2"]


class TestMoeExpertParallel2(MoeConformance):
    """The conformance suite's MoE checks at two ranks with expert parallelism 2 and the
    all-to-all dispatcher (one engine for the class)."""

    backend_id = "megatron"
    overrides = ["cluster.gpus_per_node=2", "policy.megatron_cfg.moe_token_dispatcher_type=alltoall", *MEGATRON_SGD]
    # megatron's load metrics pool the step's token-slots: checked for presence and range
    metrics_match_reference = False

    def test_the_layout_is_expert_parallel_2(self):
        assert self.expert_parallel_overrides() == ["policy.megatron_cfg.expert_model_parallel_size=2"]

    def test_the_allgather_dispatcher_computes_and_trains_as_alltoall(self, moe_backend, moe_dir, tmp_path):
        """The other token dispatcher, in the same layout: logprobs, a step (router trained),
        its MoE metrics and the weights after it equal the all-to-all engine's."""
        _, allgather = self._build(moe_dir, tmp_path, [*self.router_overrides(), *self.expert_parallel_overrides(),
                                                       "policy.megatron_cfg.moe_token_dispatcher_type=allgather"])
        batch = conformance_batch()
        try:
            for engine in (moe_backend, allgather):
                engine.load_hf(moe_dir)
            assert float((allgather.logprobs(batch) - moe_backend.logprobs(batch)).abs().max()) <= 1e-5
            ours, theirs = allgather.train_step(batch, conformance_loss), moe_backend.train_step(batch, conformance_loss)
            weights, want = dict(allgather.weight_stream()), dict(moe_backend.weight_stream())
        finally:
            allgather.shutdown()
        assert abs(ours.loss - theirs.loss) <= 1e-5 and ours.grad_norm == pytest.approx(theirs.grad_norm, rel=1e-6)
        assert "moe/layer0/load_entropy" in theirs.metrics
        for key, value in theirs.metrics.items():
            if key.startswith("moe/"):
                assert ours.metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
        assert weights.keys() == want.keys()
        assert max(float((weights[n] - want[n]).abs().max()) for n in weights) <= 1e-5


# -- slow: generation -----------------------------------------------------------------------------


class TestMegatronGenerationOfAMixtureOfExperts(GenerationBackendConformance):
    """megatron generation of a tiny Qwen3-MoE through the generation conformance suite (greedy as
    transformers', logprobs, refit with the experts in the weight stream)."""

    backend_id = "megatron"

    @pytest.fixture(scope="class")
    @classmethod
    def model_dirs(cls, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
        from corerl.models.tiny import build_tiny_model

        shape = {**TINY_MOE, "initializer_range": 0.3}
        return tuple(str(build_tiny_model(tmp_path_factory.mktemp(f"moe-gen-{seed}"), seed=seed, **shape))
                     for seed in (0, 1))

    # what does not depend on the model's experts is the dense suite's (test_megatron_generation.py)
    test_ignore_eos_runs_every_completion_to_max_new_tokens = None
    test_the_same_prompt_twice_draws_independent_samples = None
    test_n_samples_come_back_grouped_in_prompt_order = None
    test_samples_follow_each_lora_adapter_loaded = None


class TestMegatronGenerationOfAMixtureOfExpertsExpertParallel2(TestMegatronGenerationOfAMixtureOfExperts):
    """The same suite with the experts split over 2 ranks: each rank's rows come to both ranks of
    the expert group, which decode them together (every forward pass needs the whole group) and
    continue with the group's first rank's tokens; each rank returns its own rows."""

    overrides = ["cluster.gpus_per_node=2", "policy.megatron_cfg.expert_model_parallel_size=2"]


# -- GLM-4.5's biased sigmoid router: aux-loss-free balancing ------------------------------------

TINY_GLM = dict(family="glm4_moe", hidden_size=64, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=16,
                num_experts=4, experts_per_token=2, expert_intermediate_size=32, initializer_range=0.2)
RATE = 0.01


@pytest.fixture(scope="module")
def glm_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from corerl.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("glm"), **TINY_GLM))


def test_a_biased_router_routes_by_sigmoid_plus_bias_and_its_rate_is_policy_moes(glm_dir, tmp_path):
    from transformers import AutoConfig

    from corerl_megatron.training.moe_config import moe_fields

    hf = AutoConfig.from_pretrained(glm_dir)
    config = _config(glm_dir, tmp_path, [f"policy.moe.expert_bias_update_rate={RATE}"])
    fields = moe_fields(hf, config.section("policy.megatron_cfg"), config.core.policy.moe)
    assert fields["moe_router_score_function"] == "sigmoid" and fields["moe_router_enable_expert_bias"] is True
    assert fields["moe_router_bias_update_rate"] == RATE and fields["moe_router_topk_scaling_factor"] == 2.5
    assert fields["moe_shared_expert_intermediate_size"] == 32 and fields["moe_layer_freq"] == [0, 1, 1]
    assert fields["qk_layernorm"] is True
    plain = moe_fields(AutoConfig.from_pretrained(glm_dir), None, _config(glm_dir, tmp_path, []).core.policy.moe)
    assert plain["moe_router_bias_update_rate"] == 0.0  # the checkpoint's bias is kept as it is


def test_glm_trains_on_megatron_and_its_router_bias_moves_towards_even_load(glm_dir, tmp_path):
    """A GLM-4.5 MoE on the megatron backend: logprobs equal transformers' (the biased router, the
    shared expert, half-width rotary), and after one step each router's bias moved by exactly
    the rate, down for the experts that took more than their share of the step's tokens and up for
    the others; the bias reaches the Hugging Face weights (the generation engines' refit)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from corerl.plugin_manager import PluginHost
    from corerl.testing import select_for
    from corerl.testing.reference import hf_logprobs

    recipe = write_recipe(tmp_path / "r.yaml", {"policy": {"model_name": glm_dir, "precision": "float32"}})
    overrides = [*MEGATRON, f"policy.moe.expert_bias_update_rate={RATE}", "policy.generation.backend=hf"]
    config, selection = select_for(PluginHost(), recipe, overrides)
    engine = selection.training_backend.registration.create(config=config)
    batch = conformance_batch()
    reference = AutoModelForCausalLM.from_pretrained(glm_dir, dtype=torch.float32)
    counts, real = {}, batch["attention_mask"].reshape(-1).bool()
    for index, layer in enumerate(reference.model.layers):  # each MoE layer's experts, over the real tokens
        if hasattr(layer.mlp, "gate"):
            layer.mlp.gate.register_forward_hook(
                lambda _m, _i, out, index=index: counts.__setitem__(index, torch.bincount(out[2][real].reshape(-1),
                                                                                           minlength=4)))
    with torch.no_grad():
        want = hf_logprobs(reference, batch)
    try:
        engine.load_hf(glm_dir)
        got = engine.logprobs(batch)
        engine.train_step(batch, conformance_loss)
        after = dict(engine.weight_stream())
    finally:
        engine.shutdown()
    assert float((got - want)[batch["attention_mask"].bool()].abs().max()) <= 1e-5
    before = load_file(f"{glm_dir}/model.safetensors")
    for index, count in counts.items():
        name = f"model.layers.{index}.mlp.gate.e_score_correction_bias"
        moved = after[name] - before[name]
        expected = RATE * torch.sign(count.float().mean() - count.float())
        assert torch.allclose(moved, expected, atol=1e-6), (index, count.tolist(), moved.tolist())


@pytest.mark.parametrize("name", ["decoder.layers.1.mlp.linear_fc1.weight",
                                  "decoder.layers.1.mlp.shared_experts.linear_fc1.weight"])
def test_a_gated_fc1_is_cut_per_rank_as_gate_and_up_halves(name):
    """megatron-core splits a gated MLP's fc1 (a dense layer's, or a MoE layer's shared expert's)
    over the tensor-parallel ranks as [gate_r; up_r]: each rank keeps its rows of both halves."""
    from corerl_megatron.training.sharding import shard

    gate, up = torch.arange(8.0).reshape(4, 2), 100 + torch.arange(8.0).reshape(4, 2)
    full = torch.cat([gate, up])
    assert torch.equal(shard(name, full, 0, 1, 2), torch.cat([gate[2:], up[2:]]))
