"""GRPO's advantages and loss against hand-computed values."""

from __future__ import annotations

import math

import torch

from corerl.algorithms.grpo_math import GRPOLoss, group_advantages


def test_group_advantages_centre_and_scale_each_group():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
    adv = group_advantages(rewards)
    assert torch.allclose(adv[0], torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-5)
    assert torch.equal(adv[1], torch.zeros(4))
    assert torch.allclose(group_advantages(rewards, scale_by_std=False)[0], torch.tensor([0.5, -0.5, -0.5, 0.5]))


def _batch(logprobs, old, adv, mask, ref=None):
    batch = {"old_logprobs": torch.tensor([old]), "advantages": torch.tensor([[adv] * len(old)]),
             "loss_mask": torch.tensor([mask])}
    if ref is not None:
        batch["ref_logprobs"] = torch.tensor([ref])
    return torch.tensor([logprobs], requires_grad=True), batch


def test_loss_is_the_plain_policy_gradient_when_the_ratio_is_one():
    logprobs, batch = _batch([0.0, -1.0, -2.0], [0.0, -1.0, -2.0], 2.0, [0, 1, 1])
    loss, metrics = GRPOLoss()(logprobs, batch, normaliser=2.0)
    assert math.isclose(loss.item(), -2.0, rel_tol=1e-6)  # -(1*2 + 1*2) / 2
    loss.backward()
    assert torch.allclose(logprobs.grad, torch.tensor([[0.0, -1.0, -1.0]]))  # d(-r*A)/dlogp = -A*r / n
    assert metrics["clip_fraction"] == 0.0


def test_ratio_is_clipped_on_the_side_that_would_increase_the_objective():
    # r = e^0.5 = 1.65 > 1.2 with a positive advantage: the clipped term (1.2 * A) is the minimum.
    logprobs, batch = _batch([0.0, 0.5], [0.0, 0.0], 1.0, [0, 1])
    loss, metrics = GRPOLoss(ratio_clip_min=0.2, ratio_clip_max=0.2)(logprobs, batch, normaliser=1.0)
    assert math.isclose(loss.item(), -1.2, rel_tol=1e-6)
    loss.backward()
    assert logprobs.grad.abs().sum().item() == 0.0  # clipped: no gradient
    assert metrics["clip_fraction"] == 1.0


def test_dual_clipping_bounds_the_loss_of_a_negative_advantage_token():
    # r = e^2 = 7.39 with A = -1: PPO's loss is -min(-7.39, -1.2) = 7.39; dual clipping with c = 3 caps it at 3
    logprobs, batch = _batch([0.0, 2.0], [0.0, 0.0], -1.0, [0, 1])
    plain, _ = GRPOLoss()(logprobs, batch, normaliser=1.0)
    assert math.isclose(plain.item(), math.exp(2.0), rel_tol=1e-6)
    loss, _ = GRPOLoss(ratio_clip_c=3.0)(logprobs, batch, normaliser=1.0)
    assert math.isclose(loss.item(), 3.0, rel_tol=1e-6)
    loss.backward()
    assert logprobs.grad.abs().sum().item() == 0.0  # capped: no gradient
    # a positive advantage is untouched by dual clipping
    logprobs, batch = _batch([0.0, 0.1], [0.0, 0.0], 1.0, [0, 1])
    assert math.isclose(GRPOLoss(ratio_clip_c=3.0)(logprobs, batch, 1.0)[0].item(),
                        GRPOLoss()(logprobs, batch, 1.0)[0].item())


def test_importance_sampling_correction_weights_each_token_by_training_over_generation_probability():
    logprobs, batch = _batch([0.0, -1.0, -2.0], [0.0, -1.0, -2.0], 1.0, [0, 1, 1])
    batch["gen_logprobs"] = torch.tensor([[0.0, -1.5, -1.0]])  # the engine's logprobs of the same tokens
    loss, metrics = GRPOLoss(importance_sampling_correction=True)(logprobs, batch, normaliser=2.0)
    w = [math.exp(0.5), math.exp(-1.0)]
    assert math.isclose(loss.item(), -(w[0] + w[1]) / 2, rel_tol=1e-6)
    assert math.isclose(metrics["importance_weight/mean"].item(), (w[0] + w[1]) / 2, rel_tol=1e-6)
    capped, _ = GRPOLoss(importance_sampling_correction=True, importance_weight_cap=1.2)(logprobs, batch, 2.0)
    assert math.isclose(capped.item(), -(1.2 + w[1]) / 2, rel_tol=1e-6)


def test_sequence_level_ratios_share_one_ratio_per_row():
    # log ratios 0.3 and -0.1 on the two loss tokens: the row's ratio is exp(0.1) on both
    logprobs, batch = _batch([0.0, 0.3, -0.1], [0.0, 0.0, 0.0], 1.0, [0, 1, 1])
    loss, _ = GRPOLoss(sequence_level_ratios=True, ratio_clip_max=0.5)(logprobs, batch, normaliser=2.0)
    assert math.isclose(loss.item(), -math.exp(0.1), rel_tol=1e-6)
    token, _ = GRPOLoss(ratio_clip_max=0.5)(logprobs, batch, normaliser=2.0)
    assert math.isclose(token.item(), -(math.exp(0.3) + math.exp(-0.1)) / 2, rel_tol=1e-6)


def test_the_loss_takes_every_setting_of_the_algorithm_section():
    from corerl.config.schema import AlgorithmConfig

    algorithm = AlgorithmConfig(ratio_clip_c=3.0, importance_sampling_correction=True, kl_type="k2")
    loss = GRPOLoss.from_config(algorithm)
    assert (loss.ratio_clip_c, loss.importance_sampling_correction, loss.kl_type) == (3.0, True, "k2")


def test_kl_penalty_uses_the_k3_estimate():
    logprobs, batch = _batch([0.0, -1.0], [0.0, -1.0], 0.0, [0, 1], ref=[0.0, -1.5])
    loss, metrics = GRPOLoss(kl_penalty=0.5)(logprobs, batch, normaliser=1.0)
    delta = -0.5
    k3 = math.exp(delta) - delta - 1.0
    assert math.isclose(loss.item(), 0.5 * k3, rel_tol=1e-6)
    assert math.isclose(metrics["kl"], k3, rel_tol=1e-6)


def test_the_leave_one_out_baseline_is_the_mean_of_the_other_rewards():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
    plain = group_advantages(rewards, scale_by_std=False, leave_one_out=True)
    assert torch.allclose(plain[0], torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]))
    assert torch.equal(plain[1], torch.zeros(4))
    scaled = group_advantages(rewards, scale_by_std=True, leave_one_out=True)
    assert torch.allclose(scaled[0], plain[0] / (0.5 + 1e-6))
    # n/(n-1) times the group-mean advantage: the same direction, a larger step
    assert torch.allclose(plain[0], group_advantages(rewards, scale_by_std=False)[0] * 4 / 3)


def test_completions_end_at_the_maximum_sequence_length():
    from corerl.generation.contract import SamplingSettings

    sampling = SamplingSettings(max_new_tokens=512)
    assert sampling.within(64, [[1] * 10, [1] * 20]).max_new_tokens == 44
    assert sampling.within(1024, [[1] * 10]).max_new_tokens == 512


def test_the_kl_estimators_and_their_clamps():
    from corerl.algorithms.grpo_math import kl_estimate

    delta = torch.tensor([-1.0, 0.0, 2.0])  # ref_logprob - logprob
    assert torch.allclose(kl_estimate(delta, "k1"), torch.tensor([1.0, 0.0, -2.0]))
    assert torch.allclose(kl_estimate(delta, "k2"), torch.tensor([0.5, 0.0, 2.0]))
    assert torch.allclose(kl_estimate(delta, "k3"), torch.exp(delta) - delta - 1)
    assert torch.allclose(kl_estimate(delta, "k3", input_clamp=1.0), torch.exp(delta.clamp(-1, 1)) - delta.clamp(-1, 1) - 1)
    assert kl_estimate(delta, "k3", output_clamp=0.5).max() == 0.5
    batch = {"loss_mask": torch.ones(1, 3), "advantages": torch.zeros(1, 3), "ref_logprobs": torch.zeros(1, 3)}
    logprobs = torch.tensor([[1.0, 0.0, -2.0]])
    _, k1 = GRPOLoss(kl_penalty=1.0, kl_type="k1")(logprobs, batch, normaliser=3.0)
    assert math.isclose(float(k1["kl"]), (1.0 + 0.0 - 2.0) / 3, rel_tol=1e-6)
