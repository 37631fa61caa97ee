"""GRPO end to end over the real dtensor and hf backends on a tiny model."""

from __future__ import annotations

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
