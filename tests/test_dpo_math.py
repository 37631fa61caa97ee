"""DPO's loss against hand-computed values, and pairs kept whole by the micro-batcher."""

from __future__ import annotations

import math

import pytest
import torch

from corerl.algorithms.dpo_math import DPOLoss, preference_batch

# two pairs, rows in mixed order: pair 0 = rows 2 (chosen) and 0 (rejected), pair 1 = rows 1 and 3
LOGPROBS = [[0.0, -1.0, -2.0], [0.0, -0.5, -0.5], [0.0, -0.2, -0.3], [0.0, -2.0, -1.0]]
REFS = [[0.0, -1.0, -1.0], [0.0, -1.0, -1.0], [0.0, -0.5, -0.5], [0.0, -1.5, -1.5]]
MASK = [[0, 1, 1]] * 4


def _batch():
    logprobs = torch.tensor(LOGPROBS, dtype=torch.float64, requires_grad=True)
    per_token = lambda rows: torch.tensor(rows).unsqueeze(1).expand(-1, 3)  # noqa: E731
    batch = {"loss_mask": torch.tensor(MASK), "ref_logprobs": torch.tensor(REFS, dtype=torch.float64),
             "group_ids": per_token([0, 1, 0, 1]), "chosen": per_token([0, 1, 1, 0])}
    return logprobs, batch


def _sigmoid_loss(margin, beta, smoothing=0.0):
    log_sig = lambda x: -math.log1p(math.exp(-x))  # noqa: E731
    return -(1 - smoothing) * log_sig(beta * margin) - smoothing * log_sig(-beta * margin)


# sequence logprobs minus reference: rows -3+2=-1, -1+2=1, -0.5+1=0.5, -3+3=0
MARGINS = [0.5 - (-1.0), 1.0 - 0.0]  # pair 0: row 2 - row 0; pair 1: row 1 - row 3


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_the_sigmoid_loss_equals_the_hand_computed_one(smoothing):
    logprobs, batch = _batch()
    loss, metrics = DPOLoss(beta=0.5, label_smoothing=smoothing, pairs=2)(logprobs, batch, normaliser=2.0)
    expected = sum(_sigmoid_loss(m, 0.5, smoothing) for m in MARGINS) / 2
    assert abs(loss.item() - expected) < 1e-6
    assert metrics["preference_accuracy"].item() == 1.0
    assert abs(metrics["rewards/margin"].item() - 0.5 * sum(MARGINS) / 2) < 1e-6
    assert abs(metrics["rewards/chosen"].item() - 0.5 * (0.5 + 1.0) / 2) < 1e-6


def test_the_ipo_variant_uses_mean_logprobs_and_a_squared_loss():
    logprobs, batch = _batch()
    loss, _ = DPOLoss(beta=0.5, ipo=True, pairs=2)(logprobs, batch, normaliser=2.0)
    # mean over the 2 loss tokens: margins halve
    expected = sum((m / 2 - 1 / (2 * 0.5)) ** 2 for m in MARGINS) / 2
    assert abs(loss.item() - expected) < 1e-6


def test_the_sft_term_adds_the_chosen_rows_nll():
    logprobs, batch = _batch()
    plain, _ = DPOLoss(beta=0.5, pairs=2)(logprobs, batch, normaliser=2.0)
    with_sft, _ = DPOLoss(beta=0.5, sft_weight=2.0, pairs=2)(logprobs, batch, normaliser=2.0)
    nll = (0.2 + 0.3) / 2 + (0.5 + 0.5) / 2  # chosen rows 2 and 1: mean NLL per token, summed over pairs
    assert abs(with_sft.item() - plain.item() - 2.0 * nll / 2) < 1e-6


def test_the_gradient_pushes_the_chosen_row_up_and_the_rejected_row_down():
    logprobs, batch = _batch()
    DPOLoss(beta=0.5, pairs=2)(logprobs, batch, normaliser=2.0)[0].backward()
    assert (logprobs.grad[2, 1:] < 0).all() and (logprobs.grad[0, 1:] > 0).all()  # descent raises chosen
    assert logprobs.grad[:, 0].abs().sum() == 0  # prompt tokens carry no loss


def test_a_pair_split_across_micro_batches_is_refused():
    logprobs, batch = _batch()
    part = {k: v[:2] for k, v in batch.items()}
    with pytest.raises(ValueError, match="same micro-batch"):
        DPOLoss(pairs=2)(logprobs[:2], part, normaliser=1.0)


def test_a_preference_batch_puts_each_pair_on_adjacent_rows_with_the_loss_on_the_responses():
    batch = preference_batch([([5, 6], [7], [8, 9]), ([5], [3, 3, 3], [4])])
    assert batch["input_ids"].tolist() == [[5, 6, 7, 0], [5, 6, 8, 9], [5, 3, 3, 3], [5, 4, 0, 0]]
    assert batch["loss_mask"].tolist() == [[0, 0, 1, 0], [0, 0, 1, 1], [0, 1, 1, 1], [0, 1, 0, 0]]
    assert batch["group_ids"][:, 0].tolist() == [0, 0, 1, 1] and batch["chosen"][:, -1].tolist() == [1, 0, 1, 0]
    # a micro-batch of two rows holds one whole pair: the loss takes it
    half = {k: v[:2] for k, v in batch.items()}
    half["ref_logprobs"] = torch.zeros(2, 4)
    loss, metrics = DPOLoss(pairs=1)(torch.zeros(2, 4), half, normaliser=1.0)
    assert abs(loss.item() - math.log(2.0)) < 1e-6 and metrics["preference_accuracy"].item() == 0.0


def test_the_loss_reads_pairs_inside_a_packed_row():
    logprobs, batch = _batch()
    expected, _ = DPOLoss(beta=0.5, pairs=2)(logprobs, batch, normaliser=0.0)
    packed = {k: v.reshape(1, -1) for k, v in batch.items()}  # four sequences in one row
    loss, metrics = DPOLoss(beta=0.5, pairs=2)(logprobs.reshape(1, -1), packed, normaliser=0.0)
    assert abs(loss.item() - expected.item()) < 1e-12 and metrics["preference_accuracy"].item() == 1.0


def test_a_micro_batch_without_pairs_gives_zero_loss_and_gradient():
    logprobs = torch.zeros(1, 1, requires_grad=True)
    empty = {"loss_mask": torch.zeros(1, 1, dtype=torch.long), "ref_logprobs": torch.zeros(1, 1),
             "group_ids": torch.zeros(1, 1, dtype=torch.long), "chosen": torch.zeros(1, 1, dtype=torch.long)}
    loss, _ = DPOLoss(pairs=3)(logprobs, empty, normaliser=1.0)
    loss.backward()
    assert loss.item() == 0.0 and logprobs.grad.abs().sum() == 0


def test_the_pair_count_must_be_given():
    logprobs, batch = _batch()
    with pytest.raises(ValueError, match="pair count"):
        DPOLoss()(logprobs, batch, normaliser=2.0)


@pytest.mark.parametrize("layout, overrides", [
    ("rows", {"train_rows": 3}), ("dynamic", {"train_tokens": 14}), ("packed", {"train_tokens": 14}),
])
@pytest.mark.parametrize("ranks", [1, 2])
def test_the_micro_batcher_keeps_each_pair_on_one_rank_and_in_one_micro_batch(layout, overrides, ranks):
    from corerl.packing.algorithms import FirstFitDecreasing
    from corerl.training.microbatching import MicroBatcher

    triples = [([5] * (1 + i % 3), [6] * (1 + i % 4), [7] * (2 + i % 2)) for i in range(8)]
    batch = preference_batch(triples)
    batcher = MicroBatcher(layout=layout, packer=FirstFitDecreasing() if layout == "packed" else None,
                           packer_id="ffd", **overrides)
    plan = batcher.plan(batch, ranks, "train")
    seen = []
    for rank_mbs in plan.per_rank:
        for mb in rank_mbs:
            mask = mb["loss_mask"].bool()
            keys = (2 * mb["group_ids"] + 1 - mb["chosen"])[mask].unique().tolist()
            pairs = {k // 2 for k in keys}
            assert {2 * p for p in pairs} | {2 * p + 1 for p in pairs} == set(keys)  # both sides of each pair
            seen.extend(pairs)
    assert sorted(seen) == list(range(8))  # every pair exactly once
