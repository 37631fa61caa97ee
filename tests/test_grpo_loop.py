"""GRPO end to end over the real dtensor and hf backends on a tiny model."""

from __future__ import annotations

import attrs
import pytest
import torch

from corerl.algorithms.grpo import GRPO
from corerl.algorithms.grpo_math import GRPOLoss
from corerl.config import load_config
from corerl.models.tiny import build_tiny_model
from corerl.plugin_manager import PluginHost
from corerl.testing import write_recipe

TARGET = 7  # the task: say "7" as often as possible


def reward(sample, item):
    return sum(token == TARGET for token in sample.completion_ids) / len(sample.completion_ids)


@pytest.fixture
def grpo(tmp_path):
    model = str(build_tiny_model(tmp_path / "model", hidden_size=64, num_layers=2, vocab_size=32))
    recipe = write_recipe(tmp_path / "r.yaml", {
        "policy": {"model_name": model, "precision": "float32", "train_micro_batch_size": 16, "max_seq_length": 32,
                   "optimizer": {"name": "adamw", "lr": 3e-3}, "generation": {"backend": "hf", "max_new_tokens": 6}},
        "algorithm": {"batch_size": 4, "num_generations_per_prompt": 8, "max_steps": 30, "seed": 3},
    })
    host = PluginHost(env={})
    config = load_config(recipe, [], host)
    training = host.training_backends.get("dtensor").create(config=config)
    generation = host.generation_backends.get("hf").create(config=config)
    training.load_hf(model)
    generation.load_hf(model)
    loop = GRPO(config, training, generation, reward, loss=GRPOLoss())
    yield loop
    training.shutdown()
    generation.shutdown()


PROMPTS = [[2, 10, 11], [2, 12], [2, 13, 14, 15], [2, 16]]


def test_a_step_reports_metrics_and_refits_the_generation_backend(grpo):
    metrics = grpo.step(PROMPTS)
    for key in ("reward/mean", "loss", "grad_norm", "logprob_mismatch/rms", "time/generation", "time/refit"):
        assert torch.isfinite(torch.tensor(metrics[key])), key
    assert metrics["optimizer_step"] == 1.0 and metrics["generated_tokens"] > 0
    # before the step both backends held the same weights, so their logprobs agreed
    assert metrics["logprob_mismatch/rms"] < 1e-4
    # after the refit they agree again on new samples
    assert grpo.step(PROMPTS)["logprob_mismatch/rms"] < 1e-4


def test_the_logprob_check_catches_a_generation_backend_that_missed_a_refit(grpo):
    grpo.step(PROMPTS)
    grpo.generation.update_weights = lambda weights: None  # a refit bug: the engine keeps old weights
    for _ in range(2):
        metrics = grpo.step(PROMPTS)
    assert metrics["logprob_mismatch/rms"] > 1e-3


def test_sequences_whose_engines_disagree_past_the_threshold_leave_the_loss(grpo):
    """``algorithm.seq_logprob_error_threshold``: while the two backends agree nothing is dropped;
    once the generation engine misses refits, its sequences' probability error passes a tight
    threshold and they leave the loss (the trained batch's loss mask is all zero)."""
    grpo.seq_logprob_error_threshold = 1.001
    seen = []
    train_step = grpo.training.train_step
    grpo.training.train_step = lambda batch, loss: seen.append(batch) or train_step(batch, loss)
    metrics = grpo.step(PROMPTS)
    assert metrics["logprob_mismatch/seq_dropped_share"] == 0.0 and metrics["time/logprobs"] > 0
    assert 1.0 <= metrics["logprob_mismatch/seq_prob_error/max"] < 1.001
    assert bool(seen[-1]["loss_mask"].any())
    grpo.generation.update_weights = lambda weights: None  # a refit bug: the engine keeps old weights
    for _ in range(3):
        metrics = grpo.step(PROMPTS)
    assert metrics["logprob_mismatch/seq_prob_error/max"] > 1.001
    dropped = metrics["logprob_mismatch/seq_dropped_share"]
    assert dropped > 0.5
    kept_rows = int(seen[-1]["loss_mask"].bool().any(dim=1).sum())
    assert kept_rows == round((1 - dropped) * seen[-1]["loss_mask"].shape[0])


def test_several_passes_use_a_separate_logprob_pass_and_report_the_largest_gap(grpo):
    grpo.optimization_passes = 2
    metrics = grpo.step(PROMPTS)
    assert metrics["logprob_mismatch/max"] < 1e-4 and metrics["time/logprobs"] > 0
    assert metrics["optimizer_step"] == 2.0


def test_a_global_batch_smaller_than_the_step_takes_one_optimizer_step_per_mini_batch(grpo):
    grpo.optimizer_batch_size = 8  # 32 samples per step: 4 optimizer steps on consecutive 8-row slices
    seen = []
    train_step = grpo.training.train_step
    grpo.training.train_step = lambda batch, loss: seen.append(batch) or train_step(batch, loss)
    metrics = grpo.step(PROMPTS)
    assert metrics["optimizer_step"] == 4.0
    assert [int(b["input_ids"].shape[0]) for b in seen] == [8, 8, 8, 8]
    # every mini-batch's ratio is taken against the logprobs from before the first update
    assert all("old_logprobs" in b for b in seen)


def test_reward_rises_on_a_learnable_task(grpo):
    first = [grpo.step(PROMPTS)["reward/mean"] for _ in range(3)]
    for _ in range(14):
        grpo.step(PROMPTS)
    last = [grpo.step(PROMPTS)["reward/mean"] for _ in range(3)]
    assert sum(last) / 3 > sum(first) / 3 + 0.3, (first, last)


@attrs.define
class SpyingGRPO(GRPO):
    """The GRPO loop, keeping each rollout it learns from (the loop itself is what is tested)."""

    learned: list = attrs.field(factory=list)

    def learn(self, rollout, timings):
        self.learned.append(rollout)
        return super().learn(rollout, timings)


def _spying(grpo, **fields):
    return SpyingGRPO(grpo.config, grpo.training, grpo.generation, grpo.reward_fn, loss=grpo.loss, **fields)


def test_dynamic_sampling_trains_only_on_groups_whose_rewards_differ(grpo):
    """DAPO's dynamic sampling over the real engines: a prompt whose group all scores the same is
    dropped and more prompts are drawn; the step trains on batch_size informative groups."""
    import random

    from corerl.algorithms.grpo_math import group_advantages
    from corerl.config.schema import DynamicSamplingConfig

    rng = random.Random(0)
    drawn = []

    def draw(count):
        drawn.append(count)
        return [PROMPTS[rng.randrange(len(PROMPTS))] for _ in range(count)], [None] * count

    def constant_for_short_prompts(sample, item):  # prompts of 2 tokens always score 0.5: no signal
        return 0.5 if len(sample.prompt_ids) == 2 else reward(sample, item)

    loop = _spying(grpo)
    loop.rollout.reward_fn = constant_for_short_prompts
    metrics = loop.dynamic_step(draw, 4, DynamicSamplingConfig(enabled=True, batch_multiplier=2, max_generation_batches=6))
    (rollout,) = loop.learned
    assert drawn[0] == 8 and len(rollout.groups) == 4  # 4 x 2 prompts per generation batch; the step keeps 4
    assert all(len(group[0].prompt_ids) != 2 for group in rollout.groups)
    assert all(float(a.abs().sum()) > 0 for a in group_advantages(torch.tensor(rollout.rewards)))
    assert metrics["optimizer_step"] == 1.0
    assert metrics["dynamic_sampling/dropped_groups"] == 8 * metrics["dynamic_sampling/generation_batches"] - 4
    assert 0 < metrics["dynamic_sampling/kept_share"] < 1


def test_shaping_and_a_sequence_level_loss_run_through_a_step(grpo):
    from corerl.algorithms.reward_shaping import RolloutShaping
    from corerl.config.schema import RewardScalingConfig

    scaling = RewardScalingConfig(enabled=True, source_min=0.0, source_max=1.0, target_min=-1.0, target_max=1.0)
    loop = _spying(grpo, shaping=RolloutShaping(scaling=scaling, filter_overlong=True))
    loop.loss = GRPOLoss(loss_aggregation="sequence_mean")
    metrics = loop.step(PROMPTS)
    assert torch.isfinite(torch.tensor(metrics["loss"])) and metrics["optimizer_step"] == 1.0
    assert metrics["reward/mean"] == pytest.approx(2 * metrics["reward/raw_mean"] - 1, abs=1e-6)
    (rollout,) = loop.learned
    samples = [s for group in rollout.groups for s in group]
    cut = [s for s in samples if s.finish_reason == "length"]
    assert cut and all(sum(s.completion_mask) == 0 for s in cut)  # left out of the loss
    assert metrics["overlong_filtered"] == pytest.approx(len(cut) / len(samples))
    assert metrics["generated_tokens"] == sum(len(s.completion_ids) for s in samples if s.finish_reason != "length")
