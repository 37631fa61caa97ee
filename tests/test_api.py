"""The Python API: corerl.train, GRPOTrainer (dict, from_pretrained with tensor parallelism,
from_recipe) and SFTTrainer, run in this process on the real engines."""

from __future__ import annotations

import json

import datasets
import pytest

import corerl
from corerl.errors import ConfigError, ConfigErrors
from corerl.models.tiny import build_tiny_model

FAST = {"generation": {"backend": "hf", "max_new_tokens": 4}, "optimizer": {"lr": 3e-3},
        "train_micro_batch_size": 64, "max_seq_length": 32}
ROWS = [{"prompt": f"w1 {d} w{i % 5}", "answer": str(d)} for i, d in enumerate(list(range(10)) * 4)]


def _metrics(result):
    return [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]


def test_train_with_rows_and_a_python_reward_function(tmp_path):
    seen = []

    def says_the_answer(completion: str, example: dict) -> float:
        seen.append((completion, example["answer"]))
        return float(example["answer"] in completion.split())

    result = corerl.train(
        model="builtin:tiny-qwen2", dataset=ROWS, reward_fn=says_the_answer, policy=FAST,
        algorithm={"max_steps": 3, "batch_size": 4, "num_generations_per_prompt": 4},
        data={"held_out_size": 8}, run={"output_dir": str(tmp_path), "name": "api"},
    )
    assert result.run_dir == tmp_path / "api" and not result.interrupted
    assert result.summary["reward"] == "test_train_with_rows_and_a_python_reward_function.<locals>.says_the_answer"
    assert result.summary["task"] == "dataset" and len(_metrics(result)) == 3
    # 8 held-out x 2 evaluations + 3 steps x 16 samples, every completion decoded to text
    assert len(seen) == 2 * 8 + 3 * 16 and all(isinstance(text, str) for text, _ in seen)
    assert (tmp_path / "api" / "data" / "train.jsonl").exists()


def test_grpo_trainer_from_pretrained_runs_tensor_parallel_on_two_ranks(tmp_path):
    model = build_tiny_model(tmp_path / "model", hidden_size=64, num_layers=2, vocab_size=128)
    trainer = corerl.GRPOTrainer.from_pretrained(
        model, tensor_parallel_size=2, policy=FAST,
        algorithm={"max_steps": 2, "batch_size": 4, "num_generations_per_prompt": 4},
        run={"output_dir": str(tmp_path), "name": "tp2"},
    )
    assert trainer.tree["policy"]["dtensor_cfg"] == {"enabled": True, "tensor_parallel_size": 2}
    result = trainer.train()
    assert result.summary["training_backend"] == "dtensor" and result.summary["grpo_steps"] == 2
    rows = _metrics(result)
    assert [r["phase"] for r in rows] == ["grpo", "grpo"]
    assert max(r["logprob_mismatch/rms"] for r in rows) < 1e-3  # the TP=2 logprobs agree with hf generation


def test_trainer_from_a_config_dict_and_sft_trainer_from_a_datasets_dict(tmp_path):
    config = {"policy": {"model_name": "builtin:tiny-qwen2", **FAST},
              "algorithm": {"max_steps": 2, "batch_size": 4, "num_generations_per_prompt": 2},
              "run": {"output_dir": str(tmp_path), "name": "dict"}}
    result = corerl.GRPOTrainer(config).train()
    assert result.summary["task"] == "digit_echo" and len(_metrics(result)) == 2

    splits = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:30]),
                                   "test": datasets.Dataset.from_list(ROWS[30:])})
    sft = corerl.SFTTrainer({"policy": {"model_name": "builtin:tiny-qwen2", **FAST},
                             "algorithm": {"max_steps": 5, "batch_size": 8},
                             "data": {"reward": "exact_answer"},
                             "run": {"output_dir": str(tmp_path), "name": "sft"}}, dataset=splits)
    result = sft.train()
    assert result.summary["algorithm"] == "sft" and result.summary["sft_steps"] == 5
    assert [r["phase"] for r in _metrics(result)] == ["sft"] * 5
    held = (tmp_path / "sft" / "data" / "test.jsonl").read_text().splitlines()
    assert len(held) == 10


def test_trainer_from_a_recipe_file_with_overrides(tmp_path):
    result = corerl.GRPOTrainer.from_recipe(
        "examples/configs/demo.yaml", "sft.max_steps=2", "algorithm.max_steps=2", "algorithm.batch_size=2",
        "policy.generation.backend=hf", f"run.output_dir={tmp_path}", "run.name=recipe").train()
    assert [r["phase"] for r in _metrics(result)] == ["sft", "sft", "grpo", "grpo"]


def test_api_errors_name_the_key():
    with pytest.raises(ConfigErrors, match="algorithm.max_steps"):
        corerl.GRPOTrainer({"policy": {"model_name": "x"}, "algorithm": {"max_steps": 0}}).train()
    with pytest.raises(ConfigError, match="SFTTrainer runs 'sft', the config says 'grpo'"):
        corerl.SFTTrainer({"algorithm": {"name": "grpo"}})
    with pytest.raises(ConfigError, match="unknown algorithm 'rloo'"):
        corerl.train(model="x", algorithm="rloo")


def test_gdpo_trains_on_math_multi_rewards_parts(tmp_path):
    """GDPO end to end in this process: the math_multi_reward environment names each sample's three
    reward parts, the loop normalises each in its group (algorithm.advantage_estimator=gdpo) and
    logs each part's mean; the scalar reward is their sum."""
    result = corerl.train(
        model="builtin:tiny-qwen2", dataset=ROWS, policy=FAST,
        algorithm={"max_steps": 2, "batch_size": 4, "num_generations_per_prompt": 4, "advantage_estimator": "gdpo"},
        data={"held_out_size": 8, "env_name": "math_multi_reward"}, run={"output_dir": str(tmp_path), "name": "gdpo"},
    )
    rows = _metrics(result)
    assert len(rows) == 2 and result.summary["environment"] == "math_multi_reward"
    for row in rows:
        parts = [row[f"reward_components/{name}"] for name in ("correctness", "format", "integer")]
        assert all(0.0 <= p <= 1.0 for p in parts)
        assert row["reward/mean"] == pytest.approx(sum(parts))  # each sample's reward is the sum of its parts
