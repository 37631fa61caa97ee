"""DPO's loss against hand-computed values (the DPO loop itself is issue 18's next part)."""

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
    batch = {"loss_mask": torch.tensor(MASK), "ref_logprobs": torch.tensor(REFS, dtype=torch.float64),
             "pair_ids": torch.tensor([0, 1, 0, 1]), "chosen": torch.tensor([0, 1, 1, 0])}
    return logprobs, batch


def _sigmoid_loss(margin, beta, smoothing=0.0):
    log_sig = lambda x: -math.log1p(math.exp(-x))  # noqa: E731
    return -(1 - smoothing) * log_sig(beta * margin) - smoothing * log_sig(-beta * margin)


# sequence logprobs minus reference: rows -3+2=-1, -1+2=1, -0.5+1=0.5, -3+3=0
MARGINS = [0.5 - (-1.0), 1.0 - 0.0]  # pair 0: row 2 - row 0; pair 1: row 1 - row 3


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_the_sigmoid_loss_equals_the_hand_computed_one(smoothing):
    logprobs, batch = _batch()
    loss, metrics = DPOLoss(beta=0.5, label_smoothing=smoothing)(logprobs, batch, normaliser=2.0)
    expected = sum(_sigmoid_loss(m, 0.5, smoothing) for m in MARGINS) / 2
    assert abs(loss.item() - expected) < 1e-6
    assert metrics["preference_accuracy"].item() == 1.0
    assert abs(metrics["rewards/margin"].item() - 0.5 * sum(MARGINS) / 2) < 1e-6
    assert abs(metrics["rewards/chosen"].item() - 0.5 * (0.5 + 1.0) / 2) < 1e-6


def test_the_ipo_variant_uses_mean_logprobs_and_a_squared_loss():
    logprobs, batch = _batch()
    loss, _ = DPOLoss(beta=0.5, ipo=True)(logprobs, batch, normaliser=2.0)
    # mean over the 2 loss tokens: margins halve
    expected = sum((m / 2 - 1 / (2 * 0.5)) ** 2 for m in MARGINS) / 2
    assert abs(loss.item() - expected) < 1e-6


def test_the_sft_term_adds_the_chosen_rows_nll():
    logprobs, batch = _batch()
    plain, _ = DPOLoss(beta=0.5)(logprobs, batch, normaliser=2.0)
    with_sft, _ = DPOLoss(beta=0.5, sft_weight=2.0)(logprobs, batch, normaliser=2.0)
    nll = (0.2 + 0.3) / 2 + (0.5 + 0.5) / 2  # chosen rows 2 and 1: mean NLL per token, summed over pairs
    assert abs(with_sft.item() - plain.item() - 2.0 * nll / 2) < 1e-6


def test_the_gradient_pushes_the_chosen_row_up_and_the_rejected_row_down():
    logprobs, batch = _batch()
    DPOLoss(beta=0.5)(logprobs, batch, normaliser=2.0)[0].backward()
    assert (logprobs.grad[2, 1:] < 0).all() and (logprobs.grad[0, 1:] > 0).all()  # descent raises chosen
    assert logprobs.grad[:, 0].abs().sum() == 0  # prompt tokens carry no loss


def test_a_pair_split_across_micro_batches_is_refused():
    logprobs, batch = _batch()
    part = {k: v[:2] for k, v in batch.items()}
    with pytest.raises(ValueError, match="same micro-batch"):
        DPOLoss()(logprobs[:2], part, normaliser=1.0)


def test_a_preference_batch_puts_each_pair_on_adjacent_rows_with_the_loss_on_the_responses():
    batch = preference_batch([([5, 6], [7], [8, 9]), ([5], [3, 3, 3], [4])])
    assert batch["input_ids"].tolist() == [[5, 6, 7, 0], [5, 6, 8, 9], [5, 3, 3, 3], [5, 4, 0, 0]]
    assert batch["loss_mask"].tolist() == [[0, 0, 1, 0], [0, 0, 1, 1], [0, 1, 1, 1], [0, 1, 0, 0]]
    assert batch["pair_ids"].tolist() == [0, 0, 1, 1] and batch["chosen"].tolist() == [1, 0, 1, 0]
    # a micro-batch of two rows holds one whole pair: the loss takes it
    half = {k: v[:2] for k, v in batch.items()}
    half["ref_logprobs"] = torch.zeros(2, 4)
    loss, metrics = DPOLoss()(torch.zeros(2, 4), half, normaliser=1.0)
    assert abs(loss.item() - math.log(2.0)) < 1e-6 and metrics["preference_accuracy"].item() == 0.0
