"""Rewards from models: a reward model or an LLM judge scoring GRPO's samples, held-out figures
scored by the task; what is refused."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from corerl.config import config_from_mapping
from corerl.config.selection import select
from corerl.environments.model_rewards import JudgeScorer, ValueModelScorer, as_value_model
from corerl.errors import ConfigError
from corerl.generation.contract import Sample
from corerl.plugin_manager import PluginHost
from corerl.reporting.console import make_console
from corerl.run.context import RunContext


def _sample(prompt: list[int], completion: list[int], finish: str) -> Sample:
    return Sample(prompt_ids=tuple(prompt), completion_ids=tuple(completion), logprobs=(0.0,) * len(completion),
                  finish_reason=finish)


def test_the_judge_reads_the_first_grade_and_scales_it():
    judge = JudgeScorer(None, None, "{prompt}{response}", r"(\d+(?:\.\d+)?)", 10.0, 4)
    assert judge.grade(" 7 out of 10") == 0.7 and judge.grade("12") == 1.0 and judge.grade("none") is None


def test_a_sample_is_scored_at_the_slot_after_its_completion_as_in_training():
    scorer = ValueModelScorer(offload=None, end_token=3)
    assert scorer.row(_sample([2, 5], [7, 7], "length")) == [2, 5, 7, 7, 3]
    assert scorer.row(_sample([2, 5], [7, 3], "stop")) == [2, 5, 7, 3, 3]


def test_a_sequence_classifier_becomes_the_value_model_it_scores_as(tmp_path):
    """reward_model/ (sequence classifier) -> a one-label token classifier whose head at the
    last token gives the classifier's score."""
    from transformers import AutoModelForSequenceClassification

    from corerl.algorithms.reward_model import export_sequence_classifier
    from corerl.models.tiny import build_tiny_model
    from corerl.models.value_model import init_value_model, load_pretrained

    build_tiny_model(tmp_path / "policy", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, vocab_size=128)
    init_value_model(tmp_path / "policy", tmp_path / "value")
    value = load_pretrained(str(tmp_path / "value"), role="critic")
    with torch.no_grad():
        value.score.weight.normal_(generator=torch.Generator().manual_seed(1))
    value.save_pretrained(tmp_path / "value")
    export_sequence_classifier(tmp_path / "value", tmp_path / "rm")
    back = as_value_model(str(tmp_path / "rm"), tmp_path / "converted")
    assert back == str(tmp_path / "converted") and as_value_model(back, tmp_path / "unused") == back
    ids = torch.tensor([[2, 21, 7, 18, 7, 3]])
    with torch.no_grad():
        pooled = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm")(input_ids=ids).logits[0, 0]
        head = load_pretrained(back, role="critic")(input_ids=ids).logits[0, -1, 0]
    assert torch.isclose(pooled, head, atol=1e-5)


def _context(tmp_path: Path, reward_model: dict, name: str = "grpo") -> RunContext:
    host = PluginHost(env={})
    recipe = {"policy": {"model_name": "builtin:tiny-qwen2", "generation": {"backend": "hf", "max_new_tokens": 4},
                         "max_seq_length": 64},
              "algorithm": {"name": name, "batch_size": 4, "num_generations_per_prompt": 2, "max_steps": 1},
              "data": {"task": "digit_echo"}, "reward_model": reward_model,
              "run": {"output_dir": str(tmp_path), "name": "r", "tensorboard": False}}
    config = config_from_mapping(recipe, host)
    return RunContext.open(config, select(config, host), make_console(), host)


@pytest.mark.parametrize("kind", ["bradley_terry", "llm_judge"])
def test_a_grpo_step_trains_on_the_model_scores_and_logs_the_task_reward(tmp_path, kind):
    from corerl.models.tiny import build_tiny_model
    from corerl.models.value_model import init_value_model, load_pretrained

    settings: dict = {"kind": kind}
    if kind == "bradley_terry":  # a reward model whose score is the same for every answer: advantages 0
        build_tiny_model(tmp_path / "policy", hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                         vocab_size=128)
        init_value_model(tmp_path / "policy", tmp_path / "rm")
        value = load_pretrained(str(tmp_path / "rm"), role="critic")
        with torch.no_grad():
            value.score.bias.fill_(0.25)
        value.save_pretrained(tmp_path / "rm")
        settings["model_name"] = str(tmp_path / "rm")
    else:  # the policy grades itself; its untrained answers hold no number: every grade is 0
        settings["judge_pattern"] = r"(\d+)"
    context = _context(tmp_path, settings)
    try:
        context.start_engines()
        algorithm = context.selection.algorithm.registration.load()(context)
        algorithm.begin()
        metrics = algorithm.step()
        assert "task_reward/mean" in metrics and math.isfinite(metrics["loss"])
        if kind == "bradley_terry":
            assert metrics["reward/mean"] == pytest.approx(0.25, abs=1e-6) and len(context.started) == 3
        else:
            assert 0.0 <= metrics["reward/mean"] <= 1.0 and "reward_model/unparsed" in metrics
        assert context.rollout() is not context.training_rollout()  # held-out figures keep the task's reward
    finally:
        context.close(run_failed=False)


def test_a_reward_model_for_an_algorithm_that_samples_nothing_is_refused(tmp_path):
    host = PluginHost(env={})
    recipe = {"policy": {"model_name": "builtin:tiny-qwen2"}, "algorithm": {"name": "dpo"},
              "data": {"task": "digit_preference"}, "reward_model": {"kind": "llm_judge"}}
    config = config_from_mapping(recipe, host)
    with pytest.raises(ConfigError) as caught:
        select(config, host)
    assert caught.value.key == "reward_model.kind" and "samples nothing" in str(caught.value)


def test_a_judge_prompt_longer_than_the_judge_takes_is_refused_in_one_line():
    from corerl.errors import RunError
    from corerl.models.tiny import build_tokenizer

    judge = JudgeScorer(None, build_tokenizer(128), "w1 " * 20 + "{prompt} {response}", r"(\d+)", 10.0, 4,
                        max_length=16)
    with pytest.raises(RunError) as caught:
        judge.score([[_sample([5, 6], [7], "stop")]], [None])
    assert caught.value.key == "reward_model.judge_template" and "\n" not in str(caught.value)
