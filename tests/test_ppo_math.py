"""PPO's arithmetic against hand-computed values (the PPO loop and critic group are issue 19's next part)."""

from __future__ import annotations

import torch

from corerl.algorithms.ppo_math import ValueLoss, explained_variance, gae, token_rewards


def test_gae_equals_a_hand_computed_example():
    # one row: a prompt token (outside the mask), then three response tokens, then padding
    rewards = torch.tensor([[0.0, 0.0, 0.5, 1.0, 0.0]])
    values = torch.tensor([[9.0, 0.2, 0.4, 0.6, 7.0]])
    mask = torch.tensor([[0, 1, 1, 1, 0]])
    gamma, lam = 0.9, 0.8
    # right to left, V after the last response token is 0:
    d3 = 1.0 + gamma * 0.0 - 0.6            # 0.4
    d2 = 0.5 + gamma * 0.6 - 0.4            # 0.64
    d1 = 0.0 + gamma * 0.4 - 0.2            # 0.16
    a3 = d3
    a2 = d2 + gamma * lam * a3              # 0.64 + 0.72 * 0.4
    a1 = d1 + gamma * lam * a2
    advantages, returns = gae(rewards, values, mask, gamma=gamma, lam=lam)
    assert torch.allclose(advantages, torch.tensor([[0.0, a1, a2, a3, 0.0]]), atol=1e-6)
    assert torch.allclose(returns, torch.tensor([[0.0, a1 + 0.2, a2 + 0.4, a3 + 0.6, 0.0]]), atol=1e-6)


def test_gamma_1_lam_1_returns_are_the_reward_to_go():
    rewards = torch.tensor([[0.1, 0.2, 0.3], [1.0, 0.0, 0.0]])
    values = torch.rand(2, 3)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    _, returns = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert torch.allclose(returns, torch.tensor([[0.6, 0.5, 0.3], [1.0, 0.0, 0.0]]), atol=1e-6)


def test_the_score_lands_on_the_last_response_token_and_the_kl_penalty_on_every_one():
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 0, 0]])
    kl = torch.full((2, 4), 0.5)
    rewards = token_rewards(torch.tensor([2.0, 3.0]), mask, kl, kl_coef=0.1)
    assert torch.allclose(rewards, torch.tensor([[0.0, -0.05, 1.95, 0.0], [0.0, 0.0, 0.0, 0.0]]))


def test_the_clipped_value_loss_takes_the_larger_error():
    values = torch.tensor([[0.0, 1.0, 0.5]], requires_grad=True)
    batch = {"loss_mask": torch.tensor([[0, 1, 1]]), "returns": torch.tensor([[0.0, 2.0, 0.0]]),
             "old_values": torch.tensor([[0.0, 0.0, 0.5]])}
    loss, _ = ValueLoss(clip=0.2)(values, batch, normaliser=2.0)
    # token 1: V=1 (R=2) error 1, clipped V=0.2 error 3.24 -> 3.24; token 2: V=0.5=old, error 0.25
    assert abs(loss.item() - 0.5 * (3.24 + 0.25) / 2.0) < 1e-6
    unclipped, _ = ValueLoss(clip=None)(values, batch, normaliser=2.0)
    assert abs(unclipped.item() - 0.5 * (1.0 + 0.25) / 2.0) < 1e-6


def test_explained_variance_is_one_for_perfect_values_and_zero_for_the_mean():
    returns = torch.tensor([[1.0, 2.0, 3.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert abs(explained_variance(returns, returns, mask) - 1.0) < 1e-6
    assert abs(explained_variance(torch.full_like(returns, 2.0), returns, mask)) < 1e-6
