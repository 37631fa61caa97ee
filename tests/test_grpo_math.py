"""GRPO's advantages and loss against hand-computed values."""

from __future__ import annotations

import math

import pytest
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


def test_asymmetric_clipping_bounds_the_ratio_at_one_minus_min_and_one_plus_max():
    # ratio_clip_min 0.1, ratio_clip_max 0.3 (clip-higher): the ratio may rise to 1.3 but fall only to 0.9
    logprobs = torch.tensor([[0.0, 0.5, 0.2], [0.0, -0.3, -0.05]], requires_grad=True)
    batch = {"old_logprobs": torch.zeros(2, 3), "loss_mask": torch.tensor([[0, 1, 1], [0, 1, 1]]),
             "advantages": torch.tensor([[1.0] * 3, [-1.0] * 3])}
    loss, metrics = GRPOLoss(ratio_clip_min=0.1, ratio_clip_max=0.3)(logprobs, batch, normaliser=4.0)
    # A = +1: r = e^0.5 = 1.65 is cut at 1.3, r = e^0.2 = 1.22 is not; A = -1: r = e^-0.3 = 0.74 is cut at 0.9,
    # r = e^-0.05 = 0.95 is not
    assert math.isclose(loss.item(), (-1.3 - math.exp(0.2) + 0.9 + math.exp(-0.05)) / 4, rel_tol=1e-6)
    loss.backward()
    want = torch.tensor([[0.0, 0.0, -math.exp(0.2) / 4], [0.0, 0.0, math.exp(-0.05) / 4]])
    assert torch.allclose(logprobs.grad, want)  # the cut tokens have no gradient
    assert metrics["clip_fraction"] == 0.5
    # symmetric 0.2 would have cut e^0.2 = 1.22 as well
    symmetric, _ = GRPOLoss()(logprobs, batch, normaliser=4.0)
    assert math.isclose(symmetric.item(), (-1.3 - 1.2 + 0.9 + math.exp(-0.05)) / 4, rel_tol=1e-6)


def test_cispo_weighs_every_tokens_log_likelihood_by_its_detached_clipped_ratio():
    # log ratios 0.5 and -1.0: r = 1.65 and 0.37, clipped to [1 - 0.2, 1 + 0.28] = [0.8, 1.28]
    logprobs, batch = _batch([0.0, -1.0, -2.0], [0.0, -1.5, -1.0], 2.0, [0, 1, 1])
    loss, metrics = GRPOLoss(use_cispo=True, ratio_clip_min=0.2, ratio_clip_max=0.28)(logprobs, batch, normaliser=2.0)
    # L = -A * sg(clip(r)) * logprob: -2 * 1.28 * -1 = 2.56 and -2 * 0.8 * -2 = 3.2, over 2 tokens
    assert math.isclose(loss.item(), (2.56 + 3.2) / 2, rel_tol=1e-6)
    loss.backward()
    assert torch.allclose(logprobs.grad, torch.tensor([[0.0, -2 * 1.28 / 2, -2 * 0.8 / 2]]))
    assert metrics["clip_fraction"] == 1.0
    # PPO-clip leaves the token above 1 + ratio_clip_max without a gradient; CISPO does not
    ppo_logprobs, ppo_batch = _batch([0.0, -1.0, -2.0], [0.0, -1.5, -1.0], 2.0, [0, 1, 1])
    GRPOLoss(ratio_clip_min=0.2, ratio_clip_max=0.28)(ppo_logprobs, ppo_batch, 2.0)[0].backward()
    assert ppo_logprobs.grad[0, 1] == 0.0
    # on-policy (ratio 1) CISPO's gradient is the plain policy gradient
    on_policy, plain = _batch([0.0, -1.0, -2.0], [0.0, -1.0, -2.0], 2.0, [0, 1, 1])
    del plain["old_logprobs"]
    GRPOLoss(use_cispo=True)(on_policy, plain, 2.0)[0].backward()
    assert torch.allclose(on_policy.grad, torch.tensor([[0.0, -1.0, -1.0]]))


def test_dr_grpo_divides_the_summed_token_loss_by_rows_times_a_constant_length():
    from corerl.algorithms.grpo_math import aggregation_weights

    # row 0: 3 loss tokens with A = 1; row 1: 1 loss token with A = -2; on-policy, each token's loss is -A
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 0, 0]])
    batch = {"loss_mask": mask, "advantages": torch.tensor([[1.0] * 4, [-2.0] * 4])}
    normaliser = float(mask.sum())  # what a backend passes: the batch's loss tokens

    def loss_of(**options):
        loss = GRPOLoss(**options)
        logprobs = torch.zeros(2, 4, requires_grad=True)
        weights = loss.aggregation_weights(mask)
        value, _ = loss(logprobs, {**batch, **({} if weights is None else {"aggregation_weights": weights})},
                        normaliser)
        value.backward()
        return value.item(), logprobs.grad

    dr_grpo, grad = loss_of(loss_aggregation="constant_length", loss_aggregation_length=4)
    assert math.isclose(dr_grpo, (-3.0 + 2.0) / (2 * 4), rel_tol=1e-6)  # summed loss / (rows x 4)
    # every token's gradient is -A / (rows x 4), however long its row
    assert torch.allclose(grad, torch.tensor([[0.0, -1 / 8, -1 / 8, -1 / 8], [0.0, 2 / 8, 0.0, 0.0]]))
    assert math.isclose(loss_of()[0], (-3.0 + 2.0) / 4, rel_tol=1e-6)  # token_mean: over the 4 tokens
    assert math.isclose(loss_of(loss_aggregation="sequence_mean")[0], (-1.0 + 2.0) / 2, rel_tol=1e-6)
    assert aggregation_weights(mask, "token_mean") is None
    with pytest.raises(ValueError, match="needs the length"):
        aggregation_weights(mask, "constant_length")


def test_the_loss_options_come_from_the_algorithm_section():
    from corerl.config.schema import AlgorithmConfig

    dr_grpo = GRPOLoss.from_config(AlgorithmConfig(loss_aggregation="constant_length"), max_new_tokens=6)
    assert (dr_grpo.loss_aggregation, dr_grpo.loss_aggregation_length) == ("constant_length", 6)
    named = GRPOLoss.from_config(AlgorithmConfig(loss_aggregation="constant_length", loss_aggregation_length=10), 6)
    assert named.loss_aggregation_length == 10
    assert GRPOLoss.from_config(AlgorithmConfig(token_level_loss=False)).loss_aggregation == "sequence_mean"
    assert GRPOLoss.from_config(AlgorithmConfig(use_cispo=True)).use_cispo
    in_reward = GRPOLoss.from_config(AlgorithmConfig(kl_penalty=0.1, use_kl_in_reward=True))
    assert in_reward.kl_penalty == 0.0  # the KL is in the rewards, not in the loss


def test_reinforce_plus_plus_with_the_kl_in_the_reward_takes_each_tokens_return_to_go():
    from corerl.algorithms.grpo_math import kl_in_reward_advantages

    scores = torch.tensor([1.0, -1.0])  # the samples' rewards, their group's mean subtracted
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 0]])
    kl = torch.tensor([[0.0, 0.1, 0.2, 0.3], [0.0, 0.4, 0.5, 0.0]])
    # token rewards -0.5 * kl, the score on the last token: row 0 -0.05, -0.1, -0.15 + 1; row 1 -0.2, -0.25 - 1
    got = kl_in_reward_advantages(scores, mask, kl, 0.5, normalise=False)
    want = torch.tensor([[0.0, 0.7, 0.75, 0.85], [0.0, -1.45, -1.25, 0.0]])
    assert torch.allclose(got, want, atol=1e-6)
    normalised = kl_in_reward_advantages(scores, mask, kl, 0.5)
    tokens = want[mask.bool()]
    assert torch.allclose(normalised[mask.bool()], (tokens - tokens.mean()) / tokens.std(unbiased=False), atol=1e-5)
    assert normalised[0, 0] == 0.0 and normalised[1, 3] == 0.0


def test_the_policy_loss_keys_are_refused_in_one_line_where_they_cannot_act(caplog):
    from corerl.algorithms.checks import check_policy_loss
    from corerl.config.schema import AlgorithmConfig
    from corerl.errors import ConfigError

    def refusal(**keys) -> str:
        with pytest.raises(ConfigError) as caught:
            check_policy_loss(AlgorithmConfig(**keys))
        return caught.value.one_line()

    assert refusal(use_cispo=True, ratio_clip_c=3.0).startswith("algorithm.ratio_clip_c: dual clipping bounds")
    check_policy_loss(AlgorithmConfig(use_kl_in_reward=True, kl_penalty=0.1))  # grpo: the summed KL in each reward
    assert refusal(use_kl_in_reward=True, advantage_estimator="reinforce_plus_plus").endswith(
        "kl_penalty is 0; set algorithm.kl_penalty > 0, or remove it")
    assert refusal(token_level_loss=True, loss_aggregation="constant_length").startswith(
        "algorithm.token_level_loss: is the deprecated spelling of loss_aggregation=token_mean")
    check_policy_loss(AlgorithmConfig(use_kl_in_reward=True, kl_penalty=0.1, advantage_estimator="reinforce_plus_plus"))
    with caplog.at_level("WARNING", logger="corerl.algorithms.checks"):
        check_policy_loss(AlgorithmConfig(token_level_loss=False))
    assert "token_level_loss is deprecated: it acts as algorithm.loss_aggregation=sequence_mean" in caplog.text
    # DPO has no policy-gradient loss for CISPO to change
    import types

    from corerl.algorithms.checks import check_nothing_sampled

    dpo = types.SimpleNamespace(core=types.SimpleNamespace(algorithm=AlgorithmConfig(name="dpo", use_cispo=True)))
    with pytest.raises(ConfigError, match="acts on sampled rollouts or their policy-gradient loss, and dpo"):
        check_nothing_sampled(dpo)


class _Scoring:
    """A training engine that scores every token ``logprob`` and records the batches it trains on."""

    def __init__(self, logprob: float) -> None:
        self.logprob, self.trained = logprob, []

    def logprobs(self, batch):
        return torch.full(batch["input_ids"].shape, self.logprob) * batch["loss_mask"]

    def train_step(self, batch, loss):
        from corerl.training.contract import StepResult

        self.trained.append(batch)
        return StepResult(loss=0.0, grad_norm=0.0, lr=0.1, tokens=int(batch["loss_mask"].sum()), step=1)


def test_grpo_takes_reinforce_plus_plus_advantages_from_rewards_with_the_kl_in_them():
    """The loop's wiring: the training policy's and the reference's logprobs are scored before the
    advantages, which are each token's return to go; the loss itself has no KL term."""
    import types

    from corerl.algorithms.grpo import GRPO
    from corerl.algorithms.grpo_math import kl_estimate, kl_in_reward_advantages
    from corerl.environments.rollout import Rollout
    from corerl.generation.contract import Sample

    policy, reference = _Scoring(-1.0), _Scoring(-1.5)
    loss = GRPOLoss()
    loop = GRPO(types.SimpleNamespace(), policy, None, lambda sample, item: 0.0, loss=loss, reference=reference,
                advantage_estimator="reinforce_plus_plus", kl_in_reward=0.2, hand_over=lambda: None)

    def sample(tokens: int) -> Sample:
        return Sample(prompt_ids=(1, 2), completion_ids=tuple(range(tokens)), logprobs=(0.0,) * tokens,
                      finish_reason="stop")

    rollout = Rollout([[sample(3), sample(1)], [sample(2), sample(2)]], [[1.0, 0.0], [0.5, 0.5]])
    metrics = loop.learn(rollout, {})
    (batch,) = policy.trained
    mask = batch["loss_mask"]
    kl = kl_estimate(torch.full(mask.shape, -0.5), "k3") * mask
    want = kl_in_reward_advantages(torch.tensor([0.5, -0.5, 0.0, 0.0]), mask, kl, 0.2)
    assert torch.allclose(batch["advantages"], want)
    assert "ref_logprobs" in batch and "old_logprobs" in batch
    assert metrics["kl"] == pytest.approx(math.exp(-0.5) + 0.5 - 1.0)


def test_an_outcome_estimator_takes_each_samples_summed_kl_from_its_reward_before_the_baseline():
    """grpo (and rloo's leave-one-out) with the KL in the reward: each sample's reward less
    kl_coef x its tokens' summed KL, then the group baseline; every token of a sample gets its
    advantage (SkyRL's use_kl_in_reward with an outcome estimator). Checked by hand."""
    import types

    from corerl.algorithms.grpo import GRPO
    from corerl.environments.rollout import Rollout
    from corerl.generation.contract import Sample

    policy, reference = _Scoring(-1.0), _Scoring(-1.5)
    loop = GRPO(types.SimpleNamespace(), policy, None, lambda sample, item: 0.0, loss=GRPOLoss(), reference=reference,
                advantage_estimator="grpo", kl_in_reward=0.2, hand_over=lambda: None, leave_one_out_baseline=True,
                scale_rewards_by_std=False)

    def sample(tokens: int) -> Sample:
        return Sample(prompt_ids=(1, 2), completion_ids=tuple(range(tokens)), logprobs=(0.0,) * tokens,
                      finish_reason="stop")

    rollout = Rollout([[sample(3), sample(1)], [sample(2), sample(2)]], [[1.0, 0.0], [0.5, 0.5]])
    loop.learn(rollout, {})
    (batch,) = policy.trained
    per_token = math.exp(-0.5) + 0.5 - 1.0  # k3 of ref - policy = -0.5 on every sampled token
    penalised = [1.0 - 0.2 * 3 * per_token, 0.0 - 0.2 * 1 * per_token, 0.5 - 0.2 * 2 * per_token,
                 0.5 - 0.2 * 2 * per_token]
    # leave-one-out within each pair: each reward less the other one's
    want = [penalised[0] - penalised[1], penalised[1] - penalised[0], 0.0, 0.0]
    mask = batch["loss_mask"].bool()
    for row, value in enumerate(want):
        assert torch.allclose(batch["advantages"][row][mask[row]], torch.tensor(value), atol=1e-6), row
    assert want[0] != pytest.approx(1.0)  # the KL changed the advantage (without it: 1.0 - 0.0)


def _by_hand_group(rewards: list[float], eps: float = 1e-6) -> list[float]:
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    return [(r - mean) / (std + eps) for r in rewards]


def test_gdpo_normalises_each_reward_part_in_its_group_then_the_sums_over_the_step():
    """GDPO (arXiv:2601.05242): each part against its own group, the parts summed, the sums
    centred and scaled over the step; a rare part (format, hit once) weighs as much as a common one."""
    from corerl.algorithms.grpo_math import advantages_for, gdpo_advantages

    correctness = [[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]]
    fmt = [[0.0, 0.0, 0.0, 10.0], [0.0, 0.0, 0.0, 0.0]]  # another scale, and one group all equal
    sums = [[a + b for a, b in zip(_by_hand_group(c), _by_hand_group(f) if len(set(f)) > 1 else [0.0] * 4, strict=True)]
            for c, f in zip(correctness, fmt, strict=True)]
    flat = [x for group in sums for x in group]
    mean = sum(flat) / len(flat)
    std = math.sqrt(sum((x - mean) ** 2 for x in flat) / len(flat))
    want = torch.tensor([[(x - mean) / (std + 1e-6) for x in group] for group in sums])
    parts = torch.tensor([correctness, fmt])
    got = gdpo_advantages(parts)
    assert torch.allclose(got, want, atol=1e-5)
    assert torch.allclose(advantages_for("gdpo", torch.zeros(2, 4), components=parts), want, atol=1e-5)
    summed = group_advantages(parts.sum(dim=0))  # GRPO on the summed reward: the 10-point format part dominates
    assert not torch.allclose(summed, got, atol=1e-2)
    with pytest.raises(ValueError, match="needs the rewards' named parts"):
        advantages_for("gdpo", torch.zeros(2, 4))


def test_the_grpo_loop_trains_gdpo_advantages_from_the_rollouts_reward_parts():
    """The loop hands each sample's reward parts (``Rollout.components``) to the gdpo estimator and
    logs each part's mean; a rollout without parts is refused in one line at the key."""
    import types

    from corerl.algorithms.grpo import GRPO
    from corerl.environments.rollout import Rollout
    from corerl.errors import ConfigError
    from corerl.generation.contract import Sample
    from corerl.training.contract import StepResult

    class Recording:  # the training engine: what is under test is the loop's advantages
        def __init__(self) -> None:
            self.trained: list = []

        def logprobs(self, batch):
            return torch.zeros(batch["input_ids"].shape)

        def train_step(self, batch, loss):
            self.trained.append(batch)
            return StepResult(loss=0.0, grad_norm=0.0, lr=0.1, tokens=int(batch["loss_mask"].sum()), step=1)

    def sample(tokens: int) -> Sample:
        return Sample(prompt_ids=(1, 2), completion_ids=tuple(range(1, tokens + 1)), logprobs=(0.0,) * tokens,
                      finish_reason="stop")

    groups = [[sample(2), sample(1)], [sample(3), sample(2)]]
    parts = [[{"a": 1.0, "b": 0.0}, {"a": 0.0, "b": 1.0}], [{"a": 1.0, "b": 1.0}, {"a": 1.0, "b": 0.0}]]
    policy = Recording()
    loop = GRPO(types.SimpleNamespace(), policy, None, lambda s, item: 0.0, advantage_estimator="gdpo",
                hand_over=lambda: None)
    metrics = loop.learn(Rollout(groups, [[1.0, 1.0], [2.0, 1.0]], components=parts), {})
    assert metrics["reward_components/a"] == 0.75 and metrics["reward_components/b"] == 0.5
    from corerl.algorithms.grpo_math import gdpo_advantages

    want = gdpo_advantages(torch.tensor([[[p[k] for p in g] for g in parts] for k in ("a", "b")])).reshape(-1)
    (batch,) = policy.trained
    mask = batch["loss_mask"].bool()
    for row, advantage in enumerate(want):
        assert torch.allclose(batch["advantages"][row][mask[row]], advantage, atol=1e-5)
    with pytest.raises(ConfigError) as refused:
        loop.learn(Rollout(groups, [[1.0, 1.0], [2.0, 1.0]]), {})
    assert refused.value.key == "algorithm.advantage_estimator" and "gave none" in refused.value.one_line()
