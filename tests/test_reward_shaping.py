"""DAPO's rollout shaping (reward scaling, the soft overlong penalty, ProRL's truncated-reward
factor, overlong filtering, dynamic sampling) and the loss options NeMo RL's recipes switch on
(a sequence-level loss, the on-policy KL approximation, decoupled GAE lambdas)."""

from __future__ import annotations

import types

import pytest
import torch

from corerl.algorithms.reward_shaping import (
    RolloutShaping,
    dynamically_sampled,
    overlong_penalty,
    scale_reward,
)
from corerl.environments.rollout import Rollout
from corerl.generation.contract import Sample


def _sample(tokens: int, finish: str = "stop") -> Sample:
    return Sample(prompt_ids=(1, 2), completion_ids=tuple(range(tokens)), logprobs=(0.0,) * tokens,
                  finish_reason=finish)  # type: ignore[arg-type]


def _config(**algorithm: object) -> types.SimpleNamespace:
    """A config carrying the algorithm keys RolloutShaping reads, defaults as the schema's."""
    from corerl.config.schema import AlgorithmConfig

    core = types.SimpleNamespace(algorithm=AlgorithmConfig(**algorithm),
                                 policy=types.SimpleNamespace(generation=types.SimpleNamespace(max_new_tokens=20)))
    return types.SimpleNamespace(core=core)


def test_scaling_maps_the_source_range_onto_the_target_range_and_clamps():
    settings = types.SimpleNamespace(source_min=0.0, source_max=1.0, target_min=-1.0, target_max=1.0)
    assert [scale_reward(r, settings) for r in (0.0, 0.25, 1.0, 3.0, -2.0)] == [-1.0, -0.5, 1.0, 1.0, -1.0]


def test_the_overlong_penalty_is_zero_then_linear_then_the_whole_penalty():
    # 16 tokens allowed, the last 4 of them a buffer: 12 free, then -0.25 per token, -1 from 16 on
    assert [overlong_penalty(n, 4, 1.0, 16) for n in (5, 12, 13, 14, 16, 40)] == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    assert overlong_penalty(13, 0, 0.5, 12) == -0.5  # no buffer: a hard penalty past the limit


def test_shaping_scales_first_then_adds_the_penalty_and_keeps_the_raw_mean():
    from corerl.config.schema import OverlongPenaltyConfig, RewardScalingConfig

    shaping = RolloutShaping.from_config(_config(
        reward_scaling=RewardScalingConfig(enabled=True, target_min=-1.0, target_max=1.0),
        overlong_penalty=OverlongPenaltyConfig(enabled=True, buffer_length=4, penalty=1.0, max_response_length=8)))
    rollout = Rollout([[_sample(3), _sample(6), _sample(8, "length")]], [[1.0, 1.0, 0.0]])
    shaped = shaping.apply(rollout)
    assert shaped.rewards == [[1.0, 0.5, -2.0]]
    assert shaped.metrics["reward/raw_mean"] == pytest.approx(2 / 3)
    assert shaped.metrics["reward/overlong_penalised"] == pytest.approx(2 / 3)


def test_the_truncated_reward_factor_replaces_the_soft_penalty():
    from corerl.config.schema import OverlongPenaltyConfig

    shaping = RolloutShaping.from_config(_config(overlong_penalty=OverlongPenaltyConfig(
        enabled=True, buffer_length=4, truncated_reward_factor=0.25)))
    shaped = shaping.apply(Rollout([[_sample(19), _sample(20, "length")]], [[1.0, 1.0]]))
    assert shaped.rewards == [[1.0, 0.25]]  # 19 tokens is inside the buffer: no soft penalty here


def test_overlong_filtering_empties_the_loss_mask_of_truncated_samples_only():
    shaping = RolloutShaping.from_config(_config(overlong_filtering=True))
    shaped = shaping.apply(Rollout([[_sample(3), _sample(4, "length")]], [[1.0, 0.0]]))
    kept, cut = shaped.groups[0]
    assert kept.completion_mask is None and cut.completion_mask == (0, 0, 0, 0)
    assert shaped.rewards == [[1.0, 0.0]] and shaped.metrics["overlong_filtered"] == 0.5
    from corerl.algorithms.batches import samples_to_batch

    batch = samples_to_batch(shaped.groups, torch.tensor([1.0, -1.0]))
    assert batch["loss_mask"][1].sum() == 0 and batch["loss_mask"][0].sum() == 3


def test_no_shaping_key_on_leaves_the_rollout_as_it_was():
    rollout = Rollout([[_sample(3, "length")]], [[0.5]], {"x": 1.0})
    assert RolloutShaping.from_config(_config()).apply(rollout) is rollout


def test_dynamic_sampling_keeps_groups_whose_rewards_differ_until_the_batch_is_full():
    batches = iter([[[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]], [[0.0, 0.0], [1.0, 0.0], [0.5, 0.5]], [[0.0, 1.0]] * 3])
    asked = []

    def generate(count: int) -> Rollout:
        asked.append(count)
        rewards = next(batches)
        return Rollout([[_sample(len(asked))] * 2 for _ in rewards], rewards, {"m": float(len(asked))})

    rollout = dynamically_sampled(2, 1.5, 10, generate)
    assert asked == [3, 3]  # batch_size x batch_multiplier prompts per generation batch, two batches
    assert rollout.rewards == [[0.0, 1.0], [1.0, 0.0]]
    assert [g[0].completion_ids for g in rollout.groups] == [(0,), (0, 1)]  # one from each batch
    assert rollout.metrics["dynamic_sampling/generation_batches"] == 2.0
    assert rollout.metrics["dynamic_sampling/kept_share"] == pytest.approx(2 / 6)
    assert rollout.metrics["m"] == 1.5
    # 6 groups seen, 2 trained: the 4 dropped are all all-equal ([1, 1], [0, 0], [0, 0], [0.5, 0.5])
    assert rollout.metrics["dynamic_sampling/dropped_groups"] == 4.0
    assert rollout.metrics["dynamic_sampling/all_equal_groups"] == 4.0


def test_dynamic_sampling_drops_informative_groups_beyond_the_batch_and_counts_them():
    def generate(count: int) -> Rollout:
        return Rollout([[_sample(1)] * 2] * count, [[1.0, 1.0]] + [[0.0, 1.0]] * (count - 1))

    rollout = dynamically_sampled(2, 2.0, 3, generate)  # 4 prompts: 1 all-equal, 3 informative, 2 trained
    assert len(rollout.groups) == 2 and rollout.metrics["dynamic_sampling/generation_batches"] == 1.0
    assert rollout.metrics["dynamic_sampling/dropped_groups"] == 2.0  # the all-equal one and one surplus
    assert rollout.metrics["dynamic_sampling/all_equal_groups"] == 1.0


def test_dynamic_sampling_that_cannot_fill_the_batch_within_its_cap_stops_in_one_line():
    from corerl.errors import ConfigError

    def generate(count: int) -> Rollout:
        return Rollout([[_sample(1)] * 2] * count, [[1.0, 1.0]] * (count - 2) + [[0.0, 0.0], [0.0, 1.0]])

    with pytest.raises(ConfigError) as caught:
        dynamically_sampled(4, 1.0, 2, generate)
    line = caught.value.one_line()
    assert line == ("algorithm.dynamic_sampling.max_generation_batches: 2 generation batches of 4 prompts gave 2 "
                    "of the 4 groups with differing rewards a step needs: 6 of 8 groups had all-equal rewards "
                    "(2 all 0, 4 all 1); raise it or algorithm.dynamic_sampling.batch_multiplier, or set "
                    "algorithm.dynamic_sampling.enabled=false")
    assert caught.value.exit_code == 2


def test_a_sequence_level_loss_averages_each_sequences_token_mean():
    from corerl.algorithms.grpo_math import GRPOLoss, aggregation_weights

    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    per_token = torch.tensor([[1.0, 2.0, 3.0, 4.0, 9.0, 9.0], [10.0, 9.0, 9.0, 9.0, 9.0, 9.0], [9.0] * 6])
    weights = aggregation_weights(mask, "sequence_mean")
    normaliser = float(mask.sum())
    # (mean of row 0 = 2.5, of row 1 = 10) averaged over the two rows with loss tokens
    assert float((per_token * weights * mask).sum() / normaliser) == pytest.approx((2.5 + 10.0) / 2)
    # through the loss: advantages -1 and logprobs = -per_token make each token's loss -A * r = per_token * ...
    logprobs = torch.zeros(3, 6, requires_grad=True)
    batch = {"loss_mask": mask, "advantages": -per_token, "aggregation_weights": weights}
    token_level, _ = GRPOLoss()(logprobs, batch, normaliser)
    sequence_level, _ = GRPOLoss(loss_aggregation="sequence_mean")(logprobs, batch, normaliser)
    assert float(token_level.detach()) == pytest.approx(20 / 5)  # 1 + 2 + 3 + 4 + 10 over 5 tokens
    assert float(sequence_level.detach()) == pytest.approx((2.5 + 10.0) / 2)


def test_minibatches_carry_their_own_aggregation_weights():
    from corerl.algorithms.batches import minibatches
    from corerl.algorithms.grpo_math import GRPOLoss

    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1]])
    batch = {"input_ids": torch.zeros(4, 2, dtype=torch.long), "loss_mask": mask}
    first, second = minibatches(batch, 2, weights=GRPOLoss(loss_aggregation="sequence_mean").aggregation_weights)
    assert first["aggregation_weights"].tolist() == [[0.75, 0.75], [1.5, 1.5]]  # 3 tokens over 2 rows
    assert second["aggregation_weights"].tolist() == [[1.0, 1.0], [1.0, 1.0]]
    # Dr. GRPO: 3 tokens over 2 rows x 4 tokens each
    constant = GRPOLoss(loss_aggregation="constant_length", loss_aggregation_length=4)
    assert minibatches(batch, 2, weights=constant.aggregation_weights)[0]["aggregation_weights"].tolist() == [
        [0.375, 0.375], [0.375, 0.375]]
    assert "aggregation_weights" not in minibatches(batch, 2)[0]
    assert "aggregation_weights" not in minibatches(batch, 2, weights=GRPOLoss().aggregation_weights)[0]


def test_the_on_policy_kl_approximation_weights_each_tokens_kl_by_the_policy_over_the_sampler():
    from corerl.algorithms.grpo_math import GRPOLoss, kl_estimate

    logprobs = torch.tensor([[-1.0, -2.0]])
    batch = {"loss_mask": torch.ones(1, 2), "advantages": torch.zeros(1, 2),
             "ref_logprobs": torch.tensor([[-1.5, -1.0]]), "gen_logprobs": torch.tensor([[-1.2, -2.5]])}
    kl = kl_estimate(batch["ref_logprobs"] - logprobs, "k3")
    plain, _ = GRPOLoss(kl_penalty=1.0)(logprobs, batch, 2.0)
    approximated, _ = GRPOLoss(kl_penalty=1.0, on_policy_kl_approximation=True)(logprobs, batch, 2.0)
    weights = torch.exp(logprobs - batch["gen_logprobs"])
    assert float(plain) == pytest.approx(float(kl.sum() / 2))
    assert float(approximated) == pytest.approx(float((kl * weights).sum() / 2))


def test_decoupled_gae_takes_the_critics_targets_with_their_own_lambda():
    from corerl.algorithms.ppo_math import gae

    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.2, 0.4, 0.6]])
    mask = torch.ones(1, 3)
    _, monte_carlo = gae(rewards, values, mask, 1.0, 1.0)
    _, td = gae(rewards, values, mask, 1.0, 0.0)
    assert monte_carlo[0].tolist() == pytest.approx([1.0, 1.0, 1.0])  # lambda 1: the returns themselves
    assert td[0].tolist() == pytest.approx([0.4, 0.6, 1.0])  # lambda 0: one-step targets


def test_reinforce_plus_plus_subtracts_the_group_mean_then_normalises_over_the_step():
    from corerl.algorithms.grpo_math import group_advantages, reinforce_plus_plus_advantages

    rewards = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [3.0, 1.0]])
    centred = torch.tensor([[0.5, -0.5], [0.0, 0.0], [0.0, 0.0], [1.0, -1.0]])
    got = reinforce_plus_plus_advantages(rewards)
    want = (centred - centred.mean()) / centred.std(unbiased=False)
    assert torch.allclose(got, want, atol=1e-5)
    # unlike GRPO's per-group scaling, a group's spread keeps its weight: [3, 1] counts twice [1, 0]
    assert float(got[3, 0]) == pytest.approx(2 * float(got[0, 0]), rel=1e-4)
    assert float(group_advantages(rewards)[3, 0]) == pytest.approx(float(group_advantages(rewards)[0, 0]), rel=1e-4)
    no_baseline = reinforce_plus_plus_advantages(rewards, minus_baseline=False, normalise=False)
    assert torch.equal(no_baseline, rewards)


def test_dynamic_sampling_keeps_a_group_whose_reward_parts_differ_though_its_sums_are_equal():
    """With reward parts (gdpo's), a group of equal sums whose parts differ still teaches: it is kept;
    a group whose parts are equal too is dropped, and the kept groups' parts stay with them."""
    equal_sums = [{"a": 1.0, "b": 0.0}, {"a": 0.0, "b": 1.0}]
    all_equal = [{"a": 1.0, "b": 0.0}, {"a": 1.0, "b": 0.0}]

    def generate(count: int) -> Rollout:
        return Rollout([[_sample(1)] * 2, [_sample(2)] * 2], [[1.0, 1.0], [1.0, 1.0]], components=[equal_sums, all_equal])

    rollout = dynamically_sampled(1, 1.0, 3, generate)
    assert rollout.components == [equal_sums] and rollout.metrics["dynamic_sampling/all_equal_groups"] == 1.0
