"""Sequence packing on the megatron backend (``policy.sequence_packing``): several sequences per
fixed-width row, each attending to itself only, give the logprobs, loss, gradients and values of
the same sequences unpacked, from fewer rows. One megatron rank in this process (gloo, world size
1); two ranks (a pipeline of two stages) are checked by the conformance suite's packed layout
(plugins/megatron/tests/test_megatron_conformance.py, TestPipelineParallel2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from corerl.config import load_config
from corerl.errors import EngineNotAvailable
from corerl.sdk import MicroBatcher
from corerl.testing import host_with, select_for, write_recipe
from corerl.testing.conformance import (
    conformance_batch,
    conformance_loss,
    value_conformance_batch,
    value_conformance_loss,
    write_conformance_critic,
)
from corerl_megatron.support import check_supported
from corerl_megatron.training.packed_rows import computed_slots, same_width, segment_mask
from tests.megatron_recipe import megatron_rank

PACKED = ["policy.sequence_packing.enabled=true", "policy.sequence_packing.train_mb_tokens=30",
          "policy.sequence_packing.logprob_mb_tokens=40"]


def _select(model: str, tmp_path: Path, overrides: list[str]) -> Any:
    recipe = write_recipe(tmp_path / "r.yaml", {
        "policy": {"model_name": model, "precision": "float32", "train_micro_batch_size": 2,
                   "megatron_cfg": {"enabled": True, "optimizer": {"optimizer": "sgd", "lr": 0.1}},
                   "generation": {"backend": "hf"}},
        "algorithm": {"seed": 7}})
    return select_for(host_with(None, "installed"), recipe, overrides)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from corerl.models.tiny import build_tiny_model

    # grouped-query attention and rotary positions: both must see each packed sequence alone
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny"), family="llama", hidden_size=64, num_layers=2,
                                num_heads=4, num_kv_heads=2))


def _answers(rank: Any, batcher: Any, batch: dict[str, torch.Tensor], purpose: str, method: str) -> torch.Tensor:
    plan = batcher.plan(batch, 1, purpose)
    return plan.unpack([getattr(rank, method)(plan.per_rank[0])])


def _step(rank: Any, batcher: Any, batch: dict[str, torch.Tensor], loss_fn: Any) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """One training step's result and gradients; the weights are put back after it."""
    from corerl.sdk import loss_token_count

    module = rank.model.module
    weights = {n: p.detach().clone() for n, p in module.named_parameters()}
    plan = batcher.plan(batch, 1, "train")
    result = rank.train_step(plan.per_rank[0], loss_fn, float(max(1, loss_token_count(batch))))
    grads = {n: p.main_grad.detach().clone() for n, p in module.named_parameters()}
    with torch.no_grad():
        for name, param in module.named_parameters():
            param.copy_(weights[name])
    return result, grads


def test_packed_rows_give_the_unpacked_logprobs_loss_and_gradients_from_fewer_rows(model_dir: str, tmp_path: Path) -> None:
    config, _ = _select(model_dir, tmp_path, PACKED)
    packed = MicroBatcher.from_config(config)
    rows = MicroBatcher.from_config(_select(model_dir, tmp_path, [])[0])
    assert (packed.layout, rows.layout) == ("packed", "rows")
    batch = conformance_batch(rows=8)  # lengths 9 to 16 in rows of 16
    with megatron_rank(config, model_dir, tmp_path / "conversions") as rank:
        ours, theirs = (_answers(rank, b, batch, "logprobs", "logprobs") for b in (packed, rows))
        assert float((ours - theirs).abs().max()) < 1e-5
        assert float(theirs.abs().sum()) > 1.0 and torch.equal(ours == 0, theirs == 0)  # 0 at position 0 and padding
        # the top-k a distillation teacher gives: the same from packed rows
        plan_p, plan_r = packed.plan(batch, 1, "logprobs"), rows.plan(batch, 1, "logprobs")
        top_p = plan_p.unpack([rank.topk_logprobs(plan_p.per_rank[0], 3)])
        top_r = plan_r.unpack([rank.topk_logprobs(plan_r.per_rank[0], 3)])
        assert float((top_p - top_r).abs().max()) < 1e-5
        (loss_p, grads_p), (loss_r, grads_r) = (_step(rank, b, batch, conformance_loss) for b in (packed, rows))
    assert abs(loss_p["loss"] - loss_r["loss"]) < 1e-6 and abs(loss_p["loss"]) > 1e-3
    assert abs(loss_p["grad_norm"] - loss_r["grad_norm"]) < 1e-5 * max(1.0, loss_r["grad_norm"])
    worst = max(float((grads_p[n] - grads_r[n]).abs().max()) for n in grads_r)
    assert worst < 1e-5 and all(float(g.abs().max()) > 0 for g in grads_r.values())
    # what the forward passes computed: fewer rows and fewer token slots than the padded rows
    for purpose in ("train", "logprobs"):
        packed_rows, packed_slots = computed_slots(packed.plan(batch, 1, purpose).per_rank)
        padded_rows, padded_slots = computed_slots(rows.plan(batch, 1, purpose).per_rank)
        assert (padded_rows, padded_slots) == (8, 8 * 16)
        assert packed_rows < padded_rows and packed_slots < padded_slots, (purpose, packed_rows, packed_slots)


def test_a_packed_critic_gives_the_unpacked_values_and_value_gradients(model_dir: str, tmp_path: Path) -> None:
    critic_dir = write_conformance_critic(model_dir, tmp_path / "critic")
    _, selection = _select(model_dir, tmp_path, [*PACKED, "algorithm.name=ppo", f"critic.model_name={critic_dir}"])
    config = selection.critic_config
    packed = MicroBatcher.from_config(config)
    rows = MicroBatcher(layout="rows", train_rows=2, logprob_rows=2)
    batch = value_conformance_batch(rows=8)
    with megatron_rank(config, critic_dir, tmp_path / "conversions") as rank:
        ours, theirs = (_answers(rank, b, batch, "logprobs", "values") for b in (packed, rows))
        assert float((ours - theirs).abs().max()) < 1e-5 and float(theirs.abs().sum()) > 1.0
        (step_p, grads_p), (step_r, grads_r) = (_step(rank, b, batch, value_conformance_loss()) for b in (packed, rows))
    assert abs(step_p["loss"] - step_r["loss"]) < 1e-6
    assert max(float((grads_p[n] - grads_r[n]).abs().max()) for n in grads_r) < 1e-5


def test_a_packed_row_sees_each_sequence_alone_and_the_calls_rows_share_one_width() -> None:
    positions = torch.tensor([[0, 1, 2, 0, 1, 0]])
    blocked = segment_mask(positions)[0, 0]
    allowed = [[int(not v) for v in row] for row in blocked.tolist()]
    assert allowed == [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0],
                       [0, 0, 0, 1, 0, 0], [0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 0, 1]]
    short = {"input_ids": torch.tensor([[5, 6, 7]]), "attention_mask": torch.ones(1, 3, dtype=torch.long),
             "position_ids": torch.tensor([[0, 1, 0]]), "loss_mask": torch.tensor([[0, 1, 0]]),
             "advantages": torch.ones(1, 3), "group_ids": torch.tensor(4)}
    wide = {**short, "input_ids": torch.arange(5).unsqueeze(0), "attention_mask": torch.ones(1, 5, dtype=torch.long),
            "position_ids": torch.tensor([[0, 1, 2, 3, 4]]), "loss_mask": torch.ones(1, 5, dtype=torch.long),
            "advantages": torch.ones(1, 5)}
    padded, same = same_width([short, wide])
    assert same is wide and {tuple(v.shape) for k, v in padded.items() if v.dim() == 2} == {(1, 5)}
    assert padded["attention_mask"].tolist() == [[1, 1, 1, 0, 0]] and padded["loss_mask"].tolist() == [[0, 1, 0, 0, 0]]
    assert padded["position_ids"].tolist() == [[0, 1, 0, 0, 1]]  # the padding: a segment of its own
    assert padded["group_ids"] is short["group_ids"]  # not a per-token field: untouched


def test_rotary_positions_restart_with_each_packed_sequence() -> None:
    from corerl_megatron.training.packed_rows import RestartedRope

    class Rotary(torch.nn.Module):
        def forward(self, width: int) -> torch.Tensor:
            return torch.arange(width, dtype=torch.float32).view(width, 1, 1, 1).expand(width, 1, 1, 2) * 10

    gpt = torch.nn.Module()
    gpt.rotary_pos_emb = Rotary()
    rope = RestartedRope(gpt)
    assert gpt.rotary_pos_emb(4)[:, 0, 0, 0].tolist() == [0, 10, 20, 30]  # no packed call: unchanged
    rope.positions = torch.tensor([[0, 1, 0, 1]])
    assert gpt.rotary_pos_emb(4)[:, 0, 0, 0].tolist() == [0, 10, 0, 10]
    assert tuple(gpt.rotary_pos_emb(4).shape) == (4, 1, 1, 2)


def test_packing_is_accepted_and_what_it_cannot_run_with_is_refused(tmp_path: Path) -> None:
    config, selection = _select("m", tmp_path, ["policy.sequence_packing.enabled=true"])
    assert check_supported(config) is None and selection.training_backend.id == "megatron"
    refused = [
        (["policy.dynamic_batching.enabled=true"], "policy.dynamic_batching.enabled", "dynamic batching"),
        (["policy.sequence_packing.enabled=true", "policy.moe.router_replay=r2", "policy.model_name=builtin:tiny-moe"],
         "policy.moe.router_replay", "router replay"),
        (["policy.sequence_packing.enabled=true", "policy.moe.load_balancing_type=seq_aux_loss",
          "policy.moe.aux_loss_coeff=0.01"], "policy.moe.load_balancing_type", "seq_aux_loss"),
        (["policy.sequence_packing.enabled=true", "policy.megatron_cfg.mtp_num_layers=1"],
         "policy.megatron_cfg.mtp_num_layers", "multi-token-prediction"),
    ]
    for overrides, key, says in refused:
        recipe = write_recipe(tmp_path / "refused.yaml", {"policy": {"model_name": "m", "megatron_cfg": {"enabled": True}}})
        with pytest.raises(EngineNotAvailable) as raised:
            check_supported(load_config(recipe, overrides, host_with(None, "installed")))
        assert raised.value.key == key and says in str(raised.value) and "\n" not in str(raised.value), overrides
