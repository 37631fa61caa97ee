"""GRPO's other policy-gradient surrogates (``algorithm.policy_loss``: rollout_is, sapo, clip_cov,
kl_cov) against the formulas written out by hand on small tensors, and what each does to the
gradient."""

from __future__ import annotations

import math

import attrs
import pytest
import torch

from corerl.algorithms.grpo_math import GRPOLoss


def _leaf(values):
    return torch.tensor([values], dtype=torch.float64, requires_grad=True)


def _batch(old, adv, mask, gen=None):
    batch = {"old_logprobs": torch.tensor([old], dtype=torch.float64),
             "advantages": torch.tensor([adv], dtype=torch.float64), "loss_mask": torch.tensor([mask])}
    if gen is not None:
        batch["gen_logprobs"] = torch.tensor([gen], dtype=torch.float64)
    return batch


def test_rollout_is_weighs_the_log_likelihood_by_the_in_range_ratio_to_the_generation_engine():
    # logprob - gen_logprob: 0.1 (w = 1.105, inside (0.8, 1.28)), 0.5 (w = 1.649, above), -0.1 (w = 0.905, inside),
    # -0.5 (w = 0.607, below); the old logprobs play no part
    logp, gen = [-1.0, -2.0, -0.5, -1.5], [-1.1, -2.5, -0.4, -1.0]
    adv = [2.0, 2.0, -1.0, -1.0]
    logprobs = _leaf(logp)
    batch = _batch([-9.0] * 4, adv, [1, 1, 1, 1], gen)
    loss, metrics = GRPOLoss(policy_loss="rollout_is", ratio_clip_min=0.2, ratio_clip_max=0.28)(logprobs, batch, 4.0)
    weights = [math.exp(lp - g) if 0.8 < math.exp(lp - g) < 1.28 else 0.0 for lp, g in zip(logp, gen, strict=True)]
    assert weights[1] == 0.0 and weights[3] == 0.0 and weights[0] > 0 and weights[2] > 0
    expected = sum(-a * w * lp for a, w, lp in zip(adv, weights, logp, strict=True)) / 4
    assert math.isclose(loss.item(), expected, rel_tol=1e-9)
    loss.backward()
    # d/dlogprob of -A * sg(w) * logprob = -A * w: the out-of-range tokens get no gradient
    assert torch.allclose(logprobs.grad, torch.tensor([[-a * w / 4 for a, w in zip(adv, weights, strict=True)]],
                                                      dtype=torch.float64))
    assert math.isclose(float(metrics["clip_fraction"]), 0.5)


def test_rollout_is_needs_the_generation_logprobs():
    with pytest.raises(ValueError, match="gen_logprobs"):
        GRPOLoss(policy_loss="rollout_is")(_leaf([-1.0]), _batch([-1.0], [1.0], [1]), 1.0)


def test_sapo_is_the_soft_gate_written_out():
    # r = exp(logprob - old): 1.2 with A = 1 (tau_pos), 0.7 with A = -2 (tau_neg), 1 with A = 0 (tau_neg)
    logp, old, adv = [math.log(1.2), math.log(0.7), -1.0], [0.0, 0.0, -1.0], [1.0, -2.0, 0.0]
    tau_pos, tau_neg = 1.0, 1.05
    logprobs = _leaf(logp)
    loss, metrics = GRPOLoss(policy_loss="sapo", sapo_tau_pos=tau_pos, sapo_tau_neg=tau_neg)(
        logprobs, _batch(old, adv, [1, 1, 1]), 3.0)

    def gate(r, tau):
        return 4.0 / tau / (1.0 + math.exp(-tau * (r - 1.0)))

    expected = (-1.0 * gate(1.2, tau_pos) + 2.0 * gate(0.7, tau_neg) - 0.0) / 3
    assert math.isclose(loss.item(), expected, rel_tol=1e-9)
    loss.backward()
    # d/dlogprob = -A * gate'(r) * r, gate'(r) = 4 * s * (1 - s), s = sigmoid(tau * (r - 1))
    s1, s2 = 1 / (1 + math.exp(-tau_pos * 0.2)), 1 / (1 + math.exp(tau_neg * 0.3))
    grads = [-1.0 * 4 * s1 * (1 - s1) * 1.2 / 3, 2.0 * 4 * s2 * (1 - s2) * 0.7 / 3, 0.0]
    assert torch.allclose(logprobs.grad, torch.tensor([grads], dtype=torch.float64))
    assert float(metrics["clip_fraction"]) == 0.0


def test_sapo_matches_the_clipped_loss_gradient_at_ratio_one_and_fades_where_the_clip_cuts():
    adv, mask = [1.5, -0.5, 2.0], [1, 1, 1]
    on_policy = [-1.0, -0.3, -2.0]
    grads = {}
    for name in ("clipped", "sapo"):
        logprobs = _leaf(on_policy)
        GRPOLoss(policy_loss=name)(logprobs, _batch(on_policy, adv, mask), 3.0)[0].backward()
        grads[name] = logprobs.grad
    assert torch.allclose(grads["sapo"], grads["clipped"])  # the gate's slope at r = 1 is 1
    # r = 2 with A > 0: PPO-clip cuts the gradient to 0; SAPO's is smaller than near r = 1 but not 0
    far = _leaf([math.log(2.0)])
    GRPOLoss(policy_loss="sapo")(far, _batch([0.0], [1.0], [1]), 1.0)[0].backward()
    assert 0.0 > far.grad.item() > -2.0 * 1.0  # the unclipped surrogate's would be -A * r = -2
    clipped = _leaf([math.log(2.0)])
    GRPOLoss()(clipped, _batch([0.0], [1.0], [1]), 1.0)[0].backward()
    assert clipped.grad.item() == 0.0


def _covariances(logp, adv, mask):
    kept = [i for i, m in enumerate(mask) if m]
    mean_a = sum(adv[i] for i in kept) / len(kept)
    mean_l = sum(logp[i] for i in kept) / len(kept)
    return [(adv[i] - mean_a) * (logp[i] - mean_l) if mask[i] else None for i in range(len(mask))]


def test_clip_cov_leaves_out_the_chosen_share_of_high_covariance_unclipped_tokens():
    # on-policy (r = 1: nothing clipped); covariances (A - mean A)(logp - mean logp) written out below
    logp = [-0.5, -3.0, -0.2, -4.0, -1.0, -2.5, -0.1, -3.5]
    adv = [3.0, -3.0, 2.5, -2.0, 0.1, 0.0, 3.0, -3.0]
    mask = [1, 1, 1, 1, 1, 1, 1, 1]
    cov = _covariances(logp, adv, mask)
    eligible = [i for i, c in enumerate(cov) if 1.0 < c < 5.0]
    assert len(eligible) >= 4
    loss_fn = GRPOLoss(policy_loss="clip_cov", clip_cov_ratio=0.25, clip_cov_lb=1.0, clip_cov_ub=5.0)
    torch.manual_seed(0)
    logprobs = _leaf(logp)
    loss, metrics = loss_fn(logprobs, _batch(logp, adv, mask), 8.0)
    loss.backward()
    left_out = [i for i in range(8) if logprobs.grad[0, i] == 0.0 and adv[i] != 0.0]
    # int(0.25 * 8) = 2 tokens, drawn among the eligible ones; the others keep the plain gradient -A / n
    assert len(left_out) == 2 and set(left_out) <= set(eligible)
    for i in range(8):
        if i not in left_out:
            assert math.isclose(logprobs.grad[0, i].item(), -adv[i] / 8, rel_tol=1e-9)
    assert math.isclose(loss.item(), sum(-adv[i] for i in range(8) if i not in left_out) / 8, rel_tol=1e-9)
    assert math.isclose(float(metrics["clip_cov_fraction"]), 2 / 8)
    # the draw is random: other seeds choose other pairs, always among the eligible tokens
    draws = set()
    for seed in range(12):
        torch.manual_seed(seed)
        again = _leaf(logp)
        loss_fn(again, _batch(logp, adv, mask), 8.0)[0].backward()
        chosen = tuple(i for i in range(8) if again.grad[0, i] == 0.0 and adv[i] != 0.0)
        assert len(chosen) == 2 and set(chosen) <= set(eligible)
        draws.add(chosen)
    assert len(draws) > 1


def test_clip_cov_never_leaves_out_a_token_the_clip_cut_or_one_outside_the_mask():
    # token 0 clipped (r = 2, A > 0); token 3 outside the mask; with a share of 1, every eligible token goes
    logp, old = [math.log(2.0), -3.0, -0.2, -0.1], [0.0, -3.0, -0.2, -0.1]
    adv, mask = [3.0, -3.0, 2.5, 3.0], [1, 1, 1, 0]
    cov = _covariances(logp, adv, mask)
    logprobs = _leaf(logp)
    loss, metrics = GRPOLoss(policy_loss="clip_cov", clip_cov_ratio=1.0, clip_cov_lb=-100.0, clip_cov_ub=100.0)(
        logprobs, _batch(old, adv, mask), 3.0)
    assert all(c is None or -100 < c < 100 for c in cov)
    # tokens 1 and 2 left out (loss 0); token 0 keeps PPO-clip's value -A * 1.2, its gradient 0 (clipped)
    assert math.isclose(loss.item(), -3.0 * 1.2 / 3, rel_tol=1e-9)
    assert math.isclose(float(metrics["clip_cov_fraction"]), 2 / 3)


def test_kl_cov_adds_the_abs_log_ratio_on_the_top_covariance_share():
    logp = [-0.5, -3.0, -0.3, -4.0, -1.0]
    old = [-0.7, -2.9, -0.3, -3.5, -1.3]
    adv = [3.0, -3.0, 2.5, -2.0, 0.1]
    mask = [1, 1, 1, 1, 0]
    cov = _covariances(logp, adv, mask)
    top = sorted((i for i in range(5) if mask[i]), key=lambda i: cov[i], reverse=True)[:2]  # int(0.5 * 4)
    assert top == [3, 0]  # covariances 4.36, 4.17, 3.92, 3.28: no tie
    coef = 0.7
    logprobs = _leaf(logp)
    loss, metrics = GRPOLoss(policy_loss="kl_cov", kl_cov_ratio=0.5, kl_cov_coef=coef)(
        logprobs, _batch(old, adv, mask), 4.0)
    per_token = [-adv[i] * math.exp(logp[i] - old[i]) + (coef * abs(logp[i] - old[i]) if i in top else 0.0)
                 for i in range(4)]
    assert math.isclose(loss.item(), sum(per_token) / 4, rel_tol=1e-9)
    loss.backward()
    grads = [(-adv[i] * math.exp(logp[i] - old[i]) + (coef * math.copysign(1.0, logp[i] - old[i])
                                                       if i in top and logp[i] != old[i] else 0.0)) / 4
             for i in range(4)] + [0.0]
    assert torch.allclose(logprobs.grad, torch.tensor([grads], dtype=torch.float64))
    assert math.isclose(float(metrics["kl_cov_fraction"]), 2 / 4)


def test_kl_cov_penalises_at_least_one_token():
    logprobs = _leaf([-1.0, -2.0])
    loss, metrics = GRPOLoss(policy_loss="kl_cov", kl_cov_ratio=0.0)(logprobs, _batch([-1.5, -2.0], [1.0, -1.0], [1, 1]),
                                                                      2.0)
    assert math.isclose(float(metrics["kl_cov_fraction"]), 1 / 2)


def test_the_policy_loss_keys_reach_the_loss_and_their_companions_are_checked():
    from corerl.algorithms.checks import check_policy_loss
    from corerl.config.schema import AlgorithmConfig
    from corerl.errors import ConfigError

    algorithm = AlgorithmConfig(policy_loss="sapo", sapo_tau_pos=2.0, sapo_tau_neg=3.0)
    loss = GRPOLoss.from_config(algorithm)
    assert (loss.policy_loss, loss.sapo_tau_pos, loss.sapo_tau_neg) == ("sapo", 2.0, 3.0)
    check_policy_loss(algorithm)
    for bad, key in ((AlgorithmConfig(policy_loss="kl_cov", use_cispo=True), "algorithm.use_cispo"),
                     (AlgorithmConfig(policy_loss="sapo", ratio_clip_c=3.0), "algorithm.ratio_clip_c"),
                     (AlgorithmConfig(policy_loss="rollout_is", sequence_level_ratios=True),
                      "algorithm.sequence_level_ratios"),
                     (AlgorithmConfig(policy_loss="clip_cov", clip_cov_lb=5.0, clip_cov_ub=1.0),
                      "algorithm.clip_cov_lb")):
        with pytest.raises(ConfigError) as caught:
            check_policy_loss(bad)
        assert caught.value.key == key


def test_seq_mask_leaves_out_the_sequences_outside_the_bounds_and_weighs_the_others_one():
    from corerl.algorithms.grpo_math import importance_weights

    # row 0: log ratios old - gen of 0.004 and 0.010 (geometric mean e^0.007 = 1.007, inside [0.99, 1.01]);
    # row 1: 0.03 and 0.01 (e^0.02 = 1.020, above): left out
    old = torch.tensor([[-1.0, -2.0], [-1.0, -2.0]])
    gen = old - torch.tensor([[0.004, 0.010], [0.03, 0.01]])
    mask = torch.ones(2, 2)
    loss = GRPOLoss(importance_sampling_correction=True, importance_sampling_type="seq-mask",
                    importance_weight_min=0.99, importance_weight_cap=1.01)
    weights, changed = importance_weights(old, gen, mask, loss)
    assert torch.equal(weights, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    assert torch.equal(changed, torch.tensor([[False, False], [True, True]]))
    # seq-mask-tis leaves out the same row but weighs the kept tokens by exp(old - gen)
    tis, _ = importance_weights(old, gen, mask, attrs.evolve(loss, importance_sampling_type="seq-mask-tis"))
    assert torch.allclose(tis, torch.tensor([[math.exp(0.004), math.exp(0.010)], [0.0, 0.0]]))


def test_seq_tis_weighs_every_token_by_its_sequences_ratio_product_capped():
    from corerl.algorithms.grpo_math import importance_weights

    old = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -2.0, -3.0]])
    # row 0: log ratios 0.1, 0.2 (product e^0.3, under the cap) and a padding token; row 1: 1.0 + 1.0 = e^2 > 5
    gen = old - torch.tensor([[0.1, 0.2, 7.0], [1.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss = GRPOLoss(importance_sampling_correction=True, importance_sampling_type="seq-tis", importance_weight_cap=5.0)
    weights, changed = importance_weights(old, gen, mask, loss)
    assert torch.allclose(weights, torch.tensor([[math.exp(0.3), math.exp(0.3), 0.0], [5.0, 5.0, 5.0]]))
    assert torch.equal(changed, torch.tensor([[False, False, False], [True, True, True]]))
    # a long sequence's product does not overflow: the cap applies in log space
    huge, _ = importance_weights(old, old - 400.0, torch.ones(2, 3), loss)
    assert torch.allclose(huge, torch.full((2, 3), 5.0))
