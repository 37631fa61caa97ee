"""Reward models: the Bradley-Terry loss by hand, the scoring rows, and the exported
sequence classifier scoring as the trained value head does."""

from __future__ import annotations

import math

import torch

from corerl.algorithms.reward_model import (
    BradleyTerryLoss,
    export_sequence_classifier,
    pairwise_accuracy,
    scoring_batch,
)


def test_the_loss_of_two_pairs_by_hand():
    # pair 0: chosen scores 2.0, rejected 0.5; pair 1: chosen -1.0, rejected 1.0 (ranked wrong)
    pairs = [([1, 2], [5, 3], [6, 3]), ([1, 2], [7, 3], [8, 3])]
    batch = scoring_batch(pairs, end_token=3)
    values = torch.zeros(batch["loss_mask"].shape)
    scores = torch.tensor([2.0, 0.5, -1.0, 1.0])
    values[batch["loss_mask"].bool()] = scores
    values.requires_grad_(True)
    loss, metrics = BradleyTerryLoss(pairs=2)(values, batch, normaliser=4.0)
    expected = (math.log1p(math.exp(-1.5)) + math.log1p(math.exp(2.0))) / 2
    assert math.isclose(float(loss.detach()), expected, rel_tol=1e-6)
    assert float(metrics["pairwise_accuracy"]) == 0.5 and math.isclose(float(metrics["score_margin"]), -0.25)
    loss.backward()  # only the score slots get a gradient: d loss / d chosen_0 = -sigmoid(-1.5) / 2
    assert math.isclose(float(values.grad[batch["loss_mask"].bool()][0]), -1 / (1 + math.exp(1.5)) / 2, rel_tol=1e-6)
    assert float(values.grad[~batch["loss_mask"].bool()].abs().sum()) == 0.0


def test_each_row_scores_at_the_token_after_its_response():
    batch = scoring_batch([([1], [5, 6, 3], [7, 3])], end_token=3)
    assert batch["input_ids"].tolist() == [[1, 5, 6, 3, 3], [1, 7, 3, 3, 0]]
    assert batch["loss_mask"].tolist() == [[0, 0, 0, 0, 1], [0, 0, 0, 1, 0]]
    assert pairwise_accuracy(torch.tensor([[1.0, 0.0], [0.0, 0.0]])) == 0.75


def test_the_exported_sequence_classifier_scores_as_the_value_head(tmp_path):
    """The value at the slot after a response is the head on the response's last token; the
    exported classifier pools that token: equal scores, up to the head's bias."""
    from corerl.models.tiny import build_tiny_model
    from corerl.models.value_model import init_value_model, load_pretrained

    build_tiny_model(tmp_path / "policy", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, vocab_size=128)
    init_value_model(tmp_path / "policy", tmp_path / "value")
    value = load_pretrained(str(tmp_path / "value"), role="critic")
    with torch.no_grad():  # a head that is not zero, with a bias
        value.score.weight.normal_(generator=torch.Generator().manual_seed(0))
        if value.score.bias is not None:
            value.score.bias.fill_(0.7)
    value.save_pretrained(tmp_path / "trained")
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    AutoTokenizer.from_pretrained(tmp_path / "value").save_pretrained(tmp_path / "trained")
    export_sequence_classifier(tmp_path / "trained", tmp_path / "rm")
    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm")
    ids = torch.tensor([[2, 20, 14, 16, 17, 3]])
    with torch.no_grad():
        head = value(input_ids=ids).logits[0, -1, 0]
        pooled = classifier(input_ids=ids).logits[0, 0]
    bias = float(value.score.bias) if value.score.bias is not None else 0.0
    assert torch.isclose(pooled, head - bias, atol=1e-5), (float(pooled), float(head), bias)


def test_digit_echo_preference_prefers_the_answer_digit_echo_scores_higher():
    from corerl.models.tiny import build_tokenizer
    from corerl.tasks import TaskContext
    from corerl.tasks.preferences import DigitEchoPreference

    tokenizer = build_tokenizer(128)
    task = DigitEchoPreference(TaskContext(tokenizer=tokenizer, seed=7, data=None, reward=None, max_prompt_tokens=64))
    train, held = task.train_pairs(), task.held_out_pairs()
    assert (len(train), len(held)) == (2000, 200)
    for prompt, chosen, rejected in train + held:
        target = prompt[2]
        share = [sum(w == target for w in answer) / len(answer) for answer in (chosen, rejected)]
        assert share[0] > share[1] and 1 <= len(chosen) <= 7 and 1 <= len(rejected) <= 7
    repeats_a_wrong_digit = [r for p, _, r in train if len(set(r) - {tokenizer.eos_token_id}) == 1 and r[0] != p[2]]
    assert len(repeats_a_wrong_digit) > 100  # the hard negatives a reward model needs
    again = DigitEchoPreference(TaskContext(tokenizer=tokenizer, seed=7, data=None, reward=None, max_prompt_tokens=64))
    assert again.train_pairs() == train
