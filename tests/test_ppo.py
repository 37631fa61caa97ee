"""PPO with a critic: the critic's config and selection, one PPO step over real engines, the demo
recipe through the CLI, and a killed run resuming with its critic."""

from __future__ import annotations

import json

import pytest
import torch

from corerl import TrainingBackend, hookimpl
from corerl.algorithms.ppo import PPO, whiten
from corerl.config import config_from_mapping
from corerl.config.selection import select
from corerl.errors import ConfigErrors
from corerl.models.tiny import build_tiny_model
from corerl.models.value_model import is_value_model
from corerl.plugin_manager import PluginHost
from tests.conftest import EXAMPLES, run_corerl


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _recipe(model: str, **sections):
    return {"policy": {"model_name": model, "max_seq_length": 32, "train_micro_batch_size": 8,
                       "generation": {"backend": "hf", "max_new_tokens": 4}, "optimizer": {"lr": 3e-3}},
            "algorithm": {"name": "ppo", "batch_size": 4, "num_generations_per_prompt": 2, "seed": 3}, **sections}


def test_the_critic_config_lays_the_critic_keys_over_the_policy():
    host = PluginHost()
    config = config_from_mapping(_recipe("builtin:tiny-qwen2", critic={
        "optimizer": {"name": "sgd", "lr": 0.01}, "train_micro_batch_size": 3, "max_grad_norm": 0.5,
        "dtensor_cfg": {"enabled": True, "activation_checkpointing": True}}), host)
    selection = select(config, host)
    critic = selection.critic_config
    assert selection.critic_backend.id == "dtensor" and critic.role == "critic" and config.role == "policy"
    assert critic.core.policy.optimizer.name == "sgd" and critic.core.policy.optimizer.lr == 0.01
    assert critic.core.policy.train_micro_batch_size == 3 and critic.core.policy.max_grad_norm == 0.5
    assert critic.section("policy.dtensor_cfg").activation_checkpointing is True
    assert config.section("policy.dtensor_cfg").activation_checkpointing is False  # the policy keeps its own
    assert critic.core.policy.generation == config.core.policy.generation


class _PlainBackendPlugin:
    """A third-party training backend that does not train value models (its engine is never built here)."""

    @hookimpl
    def corerl_register_training_backends(self, register):
        register(TrainingBackend(id="plain", factory="builtins:dict", description="no critic"))


def test_ppo_refuses_a_critic_backend_that_does_not_train_value_models_and_grpo_keeps_it():
    host = PluginHost()
    host.register(_PlainBackendPlugin(), name="plain-plugin")
    recipe = _recipe("builtin:tiny-qwen2")
    recipe["policy"]["training_backend"] = "plain"
    with pytest.raises(ConfigErrors) as caught:
        select(config_from_mapping(recipe, host), host)
    message = str(caught.value)
    assert "critic.training_backend" in message and "'plain'" in message and "does not train value models" in message
    assert len(message.strip().splitlines()) == 1
    recipe["algorithm"]["name"] = "grpo"
    assert select(config_from_mapping(recipe, host), host).training_backend.id == "plain"
    recipe["algorithm"]["name"] = "ppo"  # the policy on it, the critic on dtensor
    recipe["critic"] = {"training_backend": "dtensor"}
    selection = select(config_from_mapping(recipe, host), host)
    assert (selection.training_backend.id, selection.critic_backend.id) == ("plain", "dtensor")


def test_whitened_advantages_have_zero_mean_and_unit_std_over_the_mask():
    values = torch.tensor([[5.0, 1.0, 2.0, 3.0], [9.0, 4.0, 0.0, 0.0]])
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 0, 0]])
    out = whiten(values, mask)
    picked = out[mask.bool()]
    assert abs(float(picked.mean())) < 1e-6 and abs(float(picked.std(unbiased=False)) - 1.0) < 1e-5
    assert float(out[~mask.bool()].abs().sum()) == 0.0


def test_one_ppo_step_trains_critic_and_policy_over_real_engines(tmp_path):
    from transformers import AutoTokenizer

    from corerl.models.value_model import init_value_model
    from corerl.tasks import TaskContext
    from corerl.tasks.digit_echo import DigitEcho

    model = build_tiny_model(tmp_path / "policy", hidden_size=32, num_layers=1)
    critic_dir = init_value_model(model, tmp_path / "critic")
    host = PluginHost()
    recipe = _recipe(str(model), critic={"optimizer": {"lr": 1e-2}})
    recipe["algorithm"]["kl_penalty"] = 0.05  # folded into the token rewards, against a frozen reference
    config = config_from_mapping(recipe, host)
    selection = select(config, host)
    training = selection.training_backend.registration.create(config=config)
    reference = selection.training_backend.registration.create(config=config)
    critic = selection.critic_backend.registration.create(config=selection.critic_config)
    generation = selection.generation_backend.registration.create(config=config)
    try:
        for engine in (training, reference, generation):
            engine.load_hf(str(model))
        critic.load_hf(str(critic_dir))
        task = DigitEcho(TaskContext(AutoTokenizer.from_pretrained(model), seed=3, data=config.core.data))
        ppo = PPO.from_config(config, training=training, critic=critic, generation=generation, reward_fn=task.reward,
                              reference=reference)
        prompts, items = task.sample(4)
        first = ppo.step(prompts, items)
        batch_values = critic.values({"input_ids": torch.tensor([[1, 5, 6]]), "attention_mask": torch.ones(1, 3,
                                                                                                         dtype=torch.long)})
        second = ppo.step(*task.sample(4))
    finally:
        for engine in (generation, critic, reference, training):
            engine.shutdown()
    expected = {"critic/value_loss", "critic/explained_variance", "advantages/mean", "advantages/std",
                "returns/mean", "returns/std", "values/mean", "reward/mean", "loss", "grad_norm", "time/critic_training"}
    assert expected <= set(first)
    assert first["values/mean"] == 0.0  # the zero head: every value starts at 0
    assert first["critic/value_loss"] > 0 and first["critic/grad_norm"] > 0
    assert float(batch_values[0, 1:].abs().sum()) > 0  # after one critic step the head has moved
    assert second["values/mean"] != 0.0 and second["optimizer_step"] == 2.0
    assert first["kl"] == 0.0 and second["kl"] > 0.0  # the policy equals its reference until it moves


def test_the_ppo_demo_raises_held_out_reward_by_25_points(tmp_path):
    result = run_corerl("run", str(EXAMPLES / "ppo_demo.yaml"), f"run.output_dir={tmp_path}", "run.name=demo")
    assert result.code == 0, result
    run_dir = tmp_path / "demo"
    summary = json.loads((run_dir / "summary.json").read_text())
    gain = summary["held_out_reward_after"] - summary["held_out_reward_after_sft"]
    assert gain >= 0.25, summary
    assert summary["algorithm"] == "ppo" and summary["critic_backend"] == "dtensor" and summary["ppo_steps"] == 60
    rows = [r for r in _metrics(run_dir) if r["phase"] == "ppo"]
    assert rows[-1]["critic/explained_variance"] > rows[0]["critic/explained_variance"]
    assert is_value_model(run_dir / "final_critic") and is_value_model(run_dir / "critic_init")
    assert "critic backend" in result.out and "value loss" in result.out


def test_the_ppo_trainer_runs_from_python(tmp_path):
    import corerl

    result = corerl.PPOTrainer({
        "policy": {"model_name": "builtin:tiny-qwen2", "max_seq_length": 32,
                   "generation": {"backend": "hf", "max_new_tokens": 4}},
        "critic": {"optimizer": {"lr": 1e-3}},
        "algorithm": {"max_steps": 2, "batch_size": 4, "num_generations_per_prompt": 2},
        "run": {"output_dir": str(tmp_path), "name": "api", "tensorboard": False},
    }).train()
    assert result.summary["algorithm"] == "ppo" and result.summary["ppo_steps"] == 2
    assert result.summary["critic_backend"] == "dtensor" and is_value_model(result.run_dir / "final_critic")


class _Moves:
    """Records what an offload schedule asks of an engine (the schedule is under test, not an engine)."""

    def __init__(self):
        self.calls = []

    def offload(self, parts):
        self.calls.append(("offload", list(parts)))

    def reload(self, parts):
        self.calls.append(("reload", list(parts)))


@pytest.mark.parametrize("policy, parts", [("none", []), ("optimizer", ["optimizer"]),
                                           ("full", ["optimizer", "parameters"])])
def test_the_critic_leaves_the_accelerator_with_what_the_offload_policy_moves(policy, parts):
    from corerl.offload.schedule import FullOffload, NoOffload, OptimizerOffload

    schedule = {"none": NoOffload, "optimizer": OptimizerOffload, "full": FullOffload}[policy](_Moves(), _Moves())
    critic = _Moves()
    ppo = PPO(config=None, training=schedule.training, critic=critic, generation=schedule.generation,
              reward_fn=lambda s, i: 0.0, offload=schedule)
    ppo.critic_offload.idle()
    ppo.critic_offload.idle()  # idempotent
    ppo.critic_offload.active()
    assert critic.calls == ([("offload", parts), ("reload", parts)] if parts else [])


def test_the_critic_may_run_on_another_backend_than_the_policy(tmp_path):
    result = run_corerl("run", str(EXAMPLES / "ppo_demo.yaml"), "critic.training_backend=megatron",
                        "critic.megatron_cfg.enabled=true", "sft.max_steps=2", "algorithm.max_steps=2",
                        "algorithm.batch_size=8", "policy.generation.backend=hf", "checkpointing.enabled=false",
                        f"run.output_dir={tmp_path}", "run.name=mixed")
    assert result.code == 0, result
    summary = json.loads((tmp_path / "mixed" / "summary.json").read_text())
    assert (summary["training_backend"], summary["critic_backend"]) == ("dtensor", "megatron")
    assert "megatron: 1 rank(s) on 1 Ray node(s)" in result.out
    assert is_value_model(tmp_path / "mixed" / "final_critic")
    rows = [r for r in _metrics(tmp_path / "mixed") if r["phase"] == "ppo"]
    assert rows[-1]["values/mean"] != 0.0  # the megatron critic trained
