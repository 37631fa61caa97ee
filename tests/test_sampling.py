"""corerl.generation.sampling: token choice from logits (greedy, temperature, top-k, top-p) and stop cuts."""

from __future__ import annotations

import torch

from corerl.generation.contract import SamplingSettings
from corerl.generation.sampling import (
    choose_tokens,
    choose_tokens_per_row,
    cut_at_stop_ids,
    row_generators,
    row_seeds,
)

LOGITS = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0]] * 4000)


def _draw(**settings):
    tokens, logprobs = choose_tokens(LOGITS, SamplingSettings(**settings), torch.Generator().manual_seed(0))
    return tokens, logprobs


def test_greedy_takes_the_best_token_with_its_untempered_logprob():
    tokens, logprobs = _draw(temperature=0.0)
    assert tokens.eq(0).all()
    assert torch.allclose(logprobs, torch.log_softmax(LOGITS, -1)[:, 0])


def test_sampling_follows_the_tempered_distribution_and_reports_untempered_logprobs():
    tokens, logprobs = _draw(temperature=2.0)
    want = torch.softmax(LOGITS[0] / 2.0, -1)
    seen = torch.bincount(tokens, minlength=5).float() / len(tokens)
    assert (seen - want).abs().max() < 0.03
    assert torch.allclose(logprobs, torch.log_softmax(LOGITS, -1).gather(-1, tokens[:, None]).squeeze(-1))


def test_top_k_and_top_p_keep_only_the_best_tokens():
    tokens, _ = _draw(temperature=1.0, top_k=2)
    assert set(tokens.tolist()) == {0, 1}
    # probabilities 0.56, 0.21, 0.13, 0.03, 0.08: top_p 0.6 keeps 0 (mass 0.56 before 1) and 1, not 2 (0.77)
    tokens, _ = _draw(temperature=1.0, top_p=0.6)
    assert set(tokens.tolist()) == {0, 1}
    tokens, _ = _draw(temperature=1.0, top_p=0.01)  # the best token always stays
    assert set(tokens.tolist()) == {0}


def test_the_same_generator_seed_draws_the_same_tokens():
    assert torch.equal(_draw(temperature=1.0)[0], _draw(temperature=1.0)[0])


def test_one_generator_a_row_samples_the_tempered_and_cut_distribution_and_each_row_its_own_stream():
    sampling = SamplingSettings(temperature=2.0, top_k=4, request_seeds=tuple(range(0, 8000, 2)))
    seeds = row_seeds(sampling, 1)
    tokens, logprobs = choose_tokens_per_row(LOGITS, sampling, row_generators(seeds))
    want = torch.softmax(torch.tensor([2.0, 1.0, 0.5, -1.0, 0.0]) / 2.0 + torch.tensor([0, 0, 0, -1e9, 0]), -1)
    seen = torch.bincount(tokens, minlength=5).float() / len(tokens)
    assert (seen - want).abs().max() < 0.03 and seen[3] == 0  # the fifth-best token is cut by top_k
    assert torch.allclose(logprobs, torch.log_softmax(LOGITS, -1).gather(-1, tokens[:, None]).squeeze(-1))
    # a row's token depends on its own generator only: rows 10..19 alone draw what they drew beside the rest
    alone, _ = choose_tokens_per_row(LOGITS[10:20], sampling, row_generators(seeds[10:20]))
    assert torch.equal(alone, tokens[10:20])
    assert row_seeds(SamplingSettings(request_seeds=(5, 9)), 2) == [5, 6, 9, 10]


def test_stop_ids_end_a_completion_after_the_stop_token():
    assert cut_at_stop_ids([5, 6, 3, 7], [3]) == ([5, 6, 3], "stop")
    assert cut_at_stop_ids([5, 6], [3]) == ([5, 6], "length")
