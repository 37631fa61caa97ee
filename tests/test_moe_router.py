"""The router of a mixture-of-experts policy in training (policy.moe, corerl.training.moe_router):
the load-balancing and z-losses against hand computations and transformers' own, a step with
them against a plain PyTorch step, the per-layer load metrics as means over micro-batches, the
frozen router, and router replay (r2, and r3 with the hf generation backend's reported experts) on
the in-process dtensor backend at world size 1."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from corerl.config import config_from_mapping
from corerl.config.selection import select
from corerl.errors import ConfigError
from corerl.plugin_manager import PluginHost
from corerl.testing.conformance import conformance_batch, conformance_loss
from corerl.training.moe_router import (
    attach_router,
    aux_loss,
    check_router_replay,
    sequence_aux_loss,
    sequence_spans,
    z_loss,
)

EXPERTS, TOP_K, LR, MOMENTUM = 4, 2, 0.5, 0.9


def _recipe(model: str, moe: dict[str, Any], micro_batch: int = 2) -> dict[str, Any]:
    return {
        "cluster": {"gpus_per_node": 1},
        "policy": {"model_name": model, "precision": "float32", "train_micro_batch_size": micro_batch,
                   "max_grad_norm": 1.0, "training_backend": "dtensor", "generation": {"backend": "hf"},
                   "optimizer": {"name": "sgd", "lr": LR, "momentum": MOMENTUM}, "moe": moe},
        "algorithm": {"max_steps": 4, "seed": 1234},
    }


def _backend(model: str, moe: dict[str, Any]) -> Any:
    host = PluginHost(env={})
    config = config_from_mapping(_recipe(model, moe), host)
    backend = select(config, host).training_backend.registration.create(config=config)
    backend.load_hf(model)
    return backend


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from corerl.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("moe"), family="qwen3_moe", hidden_size=64, head_dim=32,
                                num_layers=2, num_experts=EXPERTS, experts_per_token=TOP_K,
                                expert_intermediate_size=32, vocab_size=128))


@pytest.fixture(scope="module")
def balancing(moe_dir: str) -> Any:
    """The router trains, with both loss terms; no replay."""
    backend = _backend(moe_dir, {"freeze_router": False, "load_balancing_type": "aux_loss", "aux_loss_coeff": 0.5,
                                 "z_loss_coeff": 0.05})
    yield backend
    backend.shutdown()


@pytest.fixture(scope="module")
def replaying(moe_dir: str) -> Any:
    """The defaults (router frozen), router replay r2, a load-balancing loss."""
    backend = _backend(moe_dir, {"router_replay": "r2", "load_balancing_type": "aux_loss", "aux_loss_coeff": 0.5})
    yield backend
    backend.shutdown()


@pytest.fixture(scope="module")
def free(moe_dir: str) -> Any:
    """The defaults: router frozen, no replay, no loss terms."""
    backend = _backend(moe_dir, {})
    yield backend
    backend.shutdown()


def _routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]


# -- the loss terms, by hand ---------------------------------------------------------------------


def _hand_aux(logits: list[list[float]], chosen: list[list[int]], experts: int) -> float:
    """E * sum_e f_e * P_e, written out with Python floats."""
    tokens, k = len(logits), len(chosen[0])
    probs = []
    for row in logits:
        exps = [math.exp(v) for v in row]
        probs.append([v / sum(exps) for v in exps])
    f = [sum(row.count(e) for row in chosen) / (tokens * k) for e in range(experts)]
    p = [sum(row[e] for row in probs) / tokens for e in range(experts)]
    return experts * sum(fe * pe for fe, pe in zip(f, p, strict=True))


def test_aux_loss_z_loss_and_sequence_aux_loss_match_hand_computations() -> None:
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(7, EXPERTS, generator=gen, dtype=torch.float64)
    chosen = logits.topk(TOP_K, dim=-1).indices
    hand = _hand_aux(logits.tolist(), chosen.tolist(), EXPERTS)
    assert float(aux_loss(logits, chosen, EXPERTS)) == pytest.approx(hand, rel=1e-6)
    # transformers' Switch loss counts top-k slots per token, not per slot: k times ours
    theirs = float(load_balancing_loss_func((logits.float(),), EXPERTS, TOP_K))
    assert float(aux_loss(logits, chosen, EXPERTS)) == pytest.approx(theirs / TOP_K, rel=1e-5)
    balanced = torch.zeros(4, EXPERTS)
    assert float(aux_loss(balanced, torch.tensor([[0, 1], [2, 3], [0, 1], [2, 3]]), EXPERTS)) == pytest.approx(1.0)

    lse = [math.log(sum(math.exp(v) for v in row)) for row in logits.tolist()]
    assert float(z_loss(logits)) == pytest.approx(sum(v * v for v in lse) / len(lse), rel=1e-6)

    sequences = torch.tensor([0, 0, 0, 5, 5, 5, 5])  # two sequences: 3 and 4 tokens
    per_sequence = [_hand_aux(logits[:3].tolist(), chosen[:3].tolist(), EXPERTS),
                    _hand_aux(logits[3:].tolist(), chosen[3:].tolist(), EXPERTS)]
    assert float(sequence_aux_loss(logits, chosen, sequences, EXPERTS)) == pytest.approx(sum(per_sequence) / 2, rel=1e-6)
    assert float(sequence_aux_loss(logits, chosen, sequences, EXPERTS)) != pytest.approx(hand, rel=1e-3)


def test_sequence_spans_of_padded_and_packed_micro_batches() -> None:
    padded = {"input_ids": torch.ones(2, 5, dtype=torch.long),
              "attention_mask": torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])}
    assert sequence_spans(padded) == [(0, 0, 3), (1, 0, 5)]
    packed = {"input_ids": torch.ones(1, 6, dtype=torch.long), "attention_mask": torch.ones(1, 6, dtype=torch.long),
              "position_ids": torch.tensor([[0, 1, 2, 0, 1, 0]])}
    assert sequence_spans(packed) == [(0, 0, 3), (0, 3, 2), (0, 5, 1)]


def test_a_dense_model_gets_no_hooks_and_check_router_replay_is_deprecated(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from corerl.models.tiny import build_tiny_model

    host = PluginHost(env={})
    config = config_from_mapping(_recipe("builtin:tiny-moe", {"router_replay": "r3"}), host)
    with pytest.warns(DeprecationWarning, match="check_router_replay is deprecated and refuses nothing"):
        check_router_replay(config)  # r3 is served since contract 2.18: nothing to refuse
    dense = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "dense", hidden_size=64, num_layers=2,
                                                                  vocab_size=128))
    hooks_before = sum(len(m._forward_hooks) for m in dense.modules())
    assert attach_router(dense, config_from_mapping(_recipe("builtin:tiny-qwen2", {}), host)) is None
    assert sum(len(m._forward_hooks) for m in dense.modules()) == hooks_before


def test_seq_aux_loss_is_the_mean_over_each_micro_batchs_sequences(moe_dir: str) -> None:
    """On a plain transformers model with the hooks attached: ``seq_aux_loss`` is the mean of
    each row's Switch loss over its real tokens (from the model's own router logits), summed over
    the layers in the loss term, padding left out."""
    from transformers import AutoModelForCausalLM

    host = PluginHost(env={})
    config = config_from_mapping(_recipe(moe_dir, {"load_balancing_type": "seq_aux_loss", "aux_loss_coeff": 2.0}), host)
    model = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32)
    hooks = attach_router(model, config)
    assert hooks is not None and hooks.layer_ids == [0, 1]
    ours = [handle.id for handle in hooks.handles]
    mb = {k: v[:2] for k, v in conformance_batch(rows=4, length=16, vocab=128).items()}
    with hooks.micro_batch(mb, training=True) as current:
        out = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], output_router_logits=True)
    normaliser = float(mb["loss_mask"][:, 1:].sum())  # this micro-batch is the whole step
    term, metrics = hooks.step_terms(mb, current, normaliser)
    lengths = mb["attention_mask"].sum(dim=1).tolist()
    assert lengths[0] != lengths[1]
    per_layer = []
    for layer_logits in out.router_logits:
        rows = layer_logits.detach().reshape(2, 16, EXPERTS)
        per_row = [aux_loss(rows[r, :n], rows[r, :n].topk(TOP_K, dim=-1).indices, EXPERTS) for r, n in enumerate(lengths)]
        per_layer.append(float(sum(per_row)) / 2)
    assert term is not None and float(term.detach()) == pytest.approx(2.0 * sum(per_layer), rel=1e-5)
    assert metrics["moe/aux_loss"] == pytest.approx(sum(per_layer) / 2, rel=1e-5)
    hooks.remove()
    assert not any(hook in m._forward_hooks for m in _routers(model) for hook in ours)


# -- a step with the loss terms against plain PyTorch --------------------------------------------


def _reference(model_dir: str, batch: dict[str, torch.Tensor], aux_coeff: float,
               z_coeff: float) -> tuple[float, dict[str, torch.Tensor], dict[str, float]]:
    """The conformance suite's plain PyTorch step (:mod:`corerl.testing.moe_reference`) with this
    module's optimizer, two rows a micro-batch and ``policy.max_grad_norm``'s default, the router
    trained."""
    from corerl.testing.moe_reference import reference_router_step

    return reference_router_step(model_dir, batch, conformance_loss, micro_batch_rows=2, aux_coeff=aux_coeff,
                                 z_coeff=z_coeff, freeze_router=False, lr=LR, momentum=MOMENTUM, max_grad_norm=1.0)


def test_the_router_losses_join_the_step_as_in_plain_pytorch_and_metrics_are_means(balancing: Any,
                                                                                    moe_dir: str) -> None:
    """Two micro-batches of two rows: the updated weights equal a plain step whose loss adds
    0.5 x the load-balancing loss and 0.05 x the z-loss of each micro-batch (summed over layers,
    weighted by loss tokens); the router itself moves (not frozen here); the step's ``moe/*``
    metrics are the loss-token-weighted means of the micro-batches' values."""
    batch = conformance_batch(rows=4, length=16, vocab=128)
    balancing.load_hf(moe_dir)
    result = balancing.train_step(batch, conformance_loss)
    policy_loss, expected, metrics = _reference(moe_dir, batch, 0.5, 0.05)
    _, plain, _ = _reference(moe_dir, batch, 0.0, 0.0)
    trained = dict(balancing.local_model().named_parameters())
    compared = [n for n in expected if n in trained]
    assert "model.layers.0.mlp.gate.weight" in compared and "model.layers.1.self_attn.q_proj.weight" in compared
    for name in compared:
        got = trained[name].detach()
        got = got.full_tensor() if hasattr(got, "full_tensor") else got
        assert torch.allclose(got, expected[name], atol=2e-5), name
    gate = "model.layers.0.mlp.gate.weight"
    assert (expected[gate] - plain[gate]).abs().max() > 1e-3  # the terms change the step
    for key, value in metrics.items():
        assert result.metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    # the reported loss is the algorithm's, the router terms are not in it
    assert result.loss == pytest.approx(policy_loss, abs=1e-6)
    assert 0.0 < result.metrics["moe/layer0/load_min"] <= 1 / EXPERTS <= result.metrics["moe/layer0/load_max"] <= 1.0


def test_a_frozen_router_has_no_gradient_and_keeps_its_weights(free: Any, moe_dir: str) -> None:
    free.load_hf(moe_dir)
    model = free.local_model()
    routers = _routers(model)
    assert len(routers) == 2 and all(not p.requires_grad for r in routers for p in r.parameters())
    before = [r.weight.detach().clone() for r in routers]
    attention = model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    free.train_step(conformance_batch(rows=4, length=16, vocab=128), conformance_loss)
    assert all(r.weight.grad is None for r in routers)
    assert all(torch.equal(r.weight.detach(), b) for r, b in zip(routers, before, strict=True))
    assert not torch.equal(model.model.layers[0].self_attn.q_proj.weight.detach(), attention)


# -- router replay (r2) ---------------------------------------------------------------------------


def _mismatch_loss(logprobs: torch.Tensor, batch: dict[str, torch.Tensor],
                   normaliser: float) -> tuple[torch.Tensor, dict[str, Any]]:
    """No gradient; the training forward's distance from the old-policy logprobs on loss tokens."""
    mask = batch["loss_mask"].bool()
    gap = (logprobs.detach() - batch["old_logprobs"]).abs()[mask]
    return logprobs.sum() * 0.0, {"gap/max": gap.max(), "gap/sum": gap.sum(), "gap/count": float(mask.sum())}


class _RoutingSpy:
    """Records the experts each router hands to its experts (after any replay)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.seen: list[torch.Tensor] = []
        self.handles = [r.register_forward_hook(lambda m, a, out: self.seen.append(out[2].detach().clone()))
                        for r in _routers(model)]

    def take(self) -> list[torch.Tensor]:
        seen, self.seen = self.seen, []
        return seen

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _nudge_routers(model: torch.nn.Module, scale: float, seed: int = 11) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for router in _routers(model):
            router.weight.add_(torch.randn(router.weight.shape, generator=gen) * scale * router.weight.std())


def _measure(backend: Any, moe_dir: str, batch: dict[str, torch.Tensor], scale: float) -> tuple[dict[str, float], float]:
    """Old-policy logprobs, the routers nudged by ``scale`` of their weights' spread (as a
    stale router would be), then the training forward: its logprob gap and the share of routed
    (token, layer) pairs whose experts differ from the old pass's."""
    backend.load_hf(moe_dir)
    spy = _RoutingSpy(backend.local_model())
    try:
        batch = {**batch, "old_logprobs": backend.logprobs(batch)}
        recorded = spy.take()
        _nudge_routers(backend.local_model(), scale)
        metrics = backend.train_step(batch, _mismatch_loss).metrics
        trained = spy.take()
    finally:
        spy.remove()
    # the spy saw micro-batch by micro-batch (two rows each, both passes alike), layer by layer
    layers = len(recorded) // 2
    real = torch.cat([batch["attention_mask"][first:first + 2].reshape(-1).bool()
                      for first in (0, 2) for _ in range(layers)])
    old, new = torch.cat(recorded)[real].sort(-1).values, torch.cat(trained)[real].sort(-1).values
    return metrics, float((old != new).any(-1).float().mean())


def test_r2_trains_on_the_recorded_routing(replaying: Any, free: Any, moe_dir: str, capsys: Any) -> None:
    """With the same weights the training forward's logprobs equal the old-policy ones exactly;
    with the routers nudged after recording, r2 keeps every token's experts (only their weights
    move with the logits) while free routing changes some, and the logprob gap shrinks."""
    batch = conformance_batch(rows=4, length=16, vocab=128)
    same, changed = _measure(replaying, moe_dir, batch, 0.0)
    assert same["gap/max"] == 0.0 and changed == 0.0
    figures = {}
    for scale in (0.1,):
        with_r2, changed_r2 = _measure(replaying, moe_dir, batch, scale)
        without, changed_free = _measure(free, moe_dir, batch, scale)
        assert changed_r2 == 0.0 and changed_free > 0.0, scale
        assert with_r2["gap/sum"] < without["gap/sum"] and with_r2["gap/max"] < without["gap/max"], scale
        figures[scale] = (with_r2["gap/sum"] / with_r2["gap/count"], with_r2["gap/max"],
                          without["gap/sum"] / without["gap/count"], without["gap/max"], changed_free)
    with capsys.disabled():
        for scale, (mean_r2, max_r2, mean_free, max_free, flips) in figures.items():
            print(f"\nrouter nudge {scale}: r2 gap mean {mean_r2:.2e} max {max_r2:.2e}; none gap mean {mean_free:.2e} "
                  f"max {max_free:.2e} ({flips:.1%} of token-layer routings changed)")


def test_r2_refuses_a_training_sequence_it_did_not_record(replaying: Any, moe_dir: str) -> None:
    replaying.load_hf(moe_dir)
    scored = conformance_batch(rows=4, length=16, vocab=128, seed=0)
    replaying.logprobs(scored)
    other = conformance_batch(rows=4, length=16, vocab=128, seed=1)
    with pytest.raises(Exception, match="has no recorded routing"):
        replaying.train_step(other, conformance_loss)
    # the scored batch itself, cut in other mini-batches, trains
    half = {k: v[:2] for k, v in scored.items()}
    assert math.isfinite(replaying.train_step(half, conformance_loss).loss)


# -- router replay (r3) ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def given(moe_dir: str) -> Any:
    """Router replay r3: the batch's routed_experts (the generation engine's) in both passes."""
    backend = _backend(moe_dir, {"router_replay": "r3"})
    yield backend
    backend.shutdown()


def _random_routes(batch: dict[str, torch.Tensor], layers: int, seed: int = 5) -> torch.Tensor:
    """``[rows, width, layers, k]`` distinct random experts per token (not what the router picks)."""
    gen = torch.Generator().manual_seed(seed)
    rows, width = batch["input_ids"].shape
    scores = torch.rand((rows, width, layers, EXPERTS), generator=gen)
    return scores.topk(TOP_K, dim=-1).indices.to(torch.int16)


def test_r3_routes_both_passes_to_the_engines_experts(given: Any, free: Any, moe_dir: str) -> None:
    """The old-policy logprobs and the training forward route every real token to the batch's
    ``routed_experts`` (random experts here, so not the router's choice); a token marked -1 (the last
    sampled one) routes as the router chooses; and the logprobs differ from free routing's."""
    batch = conformance_batch(rows=4, length=16, vocab=128)
    routes = _random_routes(batch, layers=2)
    for row, length in enumerate(batch["attention_mask"].sum(dim=1).tolist()):
        routes[row, length - 1] = -1  # the engine never ran the last token
    batch = {**batch, "routed_experts": routes}
    given.load_hf(moe_dir)
    free.load_hf(moe_dir)
    spy = _RoutingSpy(given.local_model())
    try:
        replayed = given.logprobs(batch)
        scored = spy.take()
        metrics = given.train_step({**batch, "old_logprobs": replayed}, _mismatch_loss).metrics
        trained = spy.take()
    finally:
        spy.remove()
    free_spy = _RoutingSpy(free.local_model())
    try:
        routed_freely = free.logprobs(batch)
        own = free_spy.take()
    finally:
        free_spy.remove()
    for seen in (scored, trained):  # micro-batches of two rows, layer by layer
        for index, chosen in enumerate(seen):
            first, layer = 2 * (index // 2), index % 2
            rows = slice(first, first + 2)
            expected = routes[rows, :, layer].reshape(-1, TOP_K).long()
            real = batch["attention_mask"][rows].reshape(-1).bool()
            ran = real & (expected[:, 0] >= 0)
            assert torch.equal(chosen[ran].sort(-1).values, expected[ran].sort(-1).values)
            last = real & (expected[:, 0] < 0)  # the router's own choice, as free routing makes it
            assert last.any()
            assert torch.equal(chosen[last].sort(-1).values, own[index][last].sort(-1).values)
    assert metrics["gap/max"] == 0.0  # the training forward saw what the old-policy pass saw
    mask = batch["loss_mask"].bool()
    assert (replayed - routed_freely).abs()[mask].max() > 1e-3


def test_r3_hf_generation_reports_the_experts_a_full_forward_of_its_samples_chooses(moe_dir: str) -> None:
    """The hf backend's ``routed_experts`` (from the cached decoding) equal the experts a forward
    of the whole sample picks, for every token it ran (all but the last, which is cut off)."""
    from transformers import AutoModelForCausalLM

    from corerl.generation.contract import SamplingSettings

    host = PluginHost(env={})
    config = config_from_mapping(_recipe(moe_dir, {"router_replay": "r3"}), host)
    engine = select(config, host).generation_backend.registration.create(config=config)
    engine.load_hf(moe_dir)
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13]]
    groups = engine.generate(prompts, SamplingSettings(temperature=1.0, max_new_tokens=6, seed=3), n=2)
    engine.shutdown()
    model = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32).eval()
    spy = _RoutingSpy(model)
    try:
        for group in groups:
            for sample in group:
                tokens = [*sample.prompt_ids, *sample.completion_ids]
                routes = torch.as_tensor(sample.routed_experts).long()
                assert routes.shape == (len(tokens) - 1, 2, TOP_K)
                with torch.no_grad():
                    model(torch.tensor([tokens]))
                for layer, chosen in enumerate(spy.take()):
                    assert torch.equal(chosen[:-1].sort(-1).values, routes[:, layer].sort(-1).values)
    finally:
        spy.remove()


def test_r3_is_refused_at_validation_where_the_generation_backend_does_not_report_experts() -> None:
    """A backend without ``reports_routed_experts`` (the core's remote one) is refused at validation
    in one line; with hf, the same recipe validates."""
    from corerl.errors import ConfigErrors

    host = PluginHost(env={})
    remote = _recipe("Qwen/Qwen3-30B-A3B", {"router_replay": "r3"})
    remote["policy"]["generation"] = {"backend": "remote", "remote": {"urls": ["http://127.0.0.1:1"]}}
    with pytest.raises((ConfigError, ConfigErrors), match="generation backend 'remote' .* does not report them"):
        select(config_from_mapping(remote, host), host)
    select(config_from_mapping(_recipe("Qwen/Qwen3-30B-A3B", {"router_replay": "r3"}), host), host)


def test_samples_to_batch_lays_the_reported_experts_out_as_the_rows_tokens() -> None:
    """``routed_experts`` rows line up with ``input_ids``: a sample's routes from its first prompt
    token, -1 past what the engine ran and in the padding; a batch where only some samples carry
    routes is refused (r3 would replay some rows and route others afresh)."""
    import numpy as np

    from corerl.algorithms.batches import samples_to_batch
    from corerl.generation.contract import Sample

    def sample(prompt: int, completion: int, ran: int, seed: int) -> Sample:
        routes = np.random.default_rng(seed).integers(0, EXPERTS, size=(ran, 3, TOP_K)).astype("int16")
        return Sample(prompt_ids=tuple(range(1, prompt + 1)), completion_ids=tuple(range(5, 5 + completion)),
                      logprobs=(-1.0,) * completion, finish_reason="stop", routed_experts=routes)

    long, short = sample(3, 4, ran=6, seed=0), sample(2, 2, ran=3, seed=1)
    batch = samples_to_batch([[long, short]], torch.tensor([1.0, -1.0]))
    field = batch["routed_experts"]
    assert field.shape == (2, 7, 3, TOP_K) and field.dtype == torch.int16
    assert torch.equal(field[0, :6], torch.as_tensor(long.routed_experts)) and (field[0, 6] == -1).all()
    assert torch.equal(field[1, :3], torch.as_tensor(short.routed_experts)) and (field[1, 3:] == -1).all()
    plain = Sample(prompt_ids=(1, 2), completion_ids=(5,), logprobs=(-1.0,), finish_reason="stop")
    assert "routed_experts" not in samples_to_batch([[plain]], torch.tensor([0.0]))
    with pytest.raises(Exception, match="1 of 2 samples have no routed_experts"):
        samples_to_batch([[long, plain]], torch.tensor([1.0, -1.0]))
