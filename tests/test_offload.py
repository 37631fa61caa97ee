"""Offload policies: the order of their calls around a real GRPO step, and that no policy
changes a result (dtensor training, hf generation, a tiny model)."""

from __future__ import annotations

import math

import pytest

from corerl.algorithms.grpo import GRPO
from corerl.algorithms.grpo_math import GRPOLoss
from corerl.models.tiny import build_tiny_model
from corerl.offload import ReferenceOffload
from corerl.plugin_manager import PluginHost
from corerl.registry import OffloadPolicy
from corerl.testing import plugin_from, select_for, write_recipe

PROMPTS = [[2, 10, 11], [2, 12], [2, 13, 14, 15], [2, 16]]
WATCHED = {"offload", "reload", "generate", "sleep", "wake", "train_step", "logprobs", "weight_stream", "update_weights"}


def reward(sample, item):
    return sum(token == 7 for token in sample.completion_ids) / len(sample.completion_ids)


class Recording:
    """Passes every call to the real engine and notes the watched ones in ``log``."""

    def __init__(self, engine, name, log):
        self._engine, self._name, self._log = engine, name, log

    def __getattr__(self, attr):
        target = getattr(self._engine, attr)
        if attr not in WATCHED:
            return target

        def call(*args, **kwargs):
            parts = f"({','.join(args[0])})" if attr in ("offload", "reload") else ""
            self._log.append(f"{self._name}.{attr}{parts}")
            return target(*args, **kwargs)

        return call


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("model"), hidden_size=64, num_layers=2, vocab_size=32))


def make_loop(model, tmp_path, policy, extra=(), kl=0.0):
    recipe = write_recipe(tmp_path / f"{policy}.yaml", {
        "policy": {"model_name": model, "precision": "float32", "train_micro_batch_size": 8, "max_seq_length": 32,
                   "optimizer": {"name": "adamw", "lr": 3e-3}, "generation": {"backend": "hf", "max_new_tokens": 6},
                   "offload": {"policy": policy}},
        "algorithm": {"batch_size": 4, "num_generations_per_prompt": 4, "max_steps": 10, "seed": 3, "kl_penalty": kl},
    })
    host = PluginHost(env={})
    config, selection = select_for(host, recipe, list(extra))
    log: list[str] = []
    engines = []
    for registration in (selection.training_backend.registration, selection.generation_backend.registration):
        engine = registration.create(config=config)
        engine.load_hf(model)
        engines.append(engine)
    training, generation = Recording(engines[0], "T", log), Recording(engines[1], "G", log)
    offload = selection.offload_policy.registration.create(training=training, generation=generation, config=config)
    loop = GRPO(config, training, generation, reward, loss=GRPOLoss(kl_penalty=kl), offload=offload)
    return loop, log, engines


def run_steps(model, tmp_path, policy, steps=2):
    loop, log, engines = make_loop(model, tmp_path, policy)
    try:
        metrics = [loop.step(PROMPTS) for _ in range(steps)]
    finally:
        for engine in engines:
            engine.shutdown()
    return metrics, log


STEP_NONE = ["G.generate", "T.train_step", "T.weight_stream", "G.update_weights"]
EXPECTED = {
    "none": STEP_NONE * 2,
    "optimizer": [
        "T.offload(optimizer)", "G.generate", "G.sleep", "T.reload(optimizer)", "T.train_step",
        "T.offload(optimizer)", "G.wake", "T.weight_stream", "G.update_weights",
        "G.generate", "G.sleep", "T.reload(optimizer)", "T.train_step",
        "T.offload(optimizer)", "G.wake", "T.weight_stream", "G.update_weights",
    ],
    "full": [
        "T.offload(optimizer,parameters)", "G.generate", "G.sleep", "T.reload(optimizer,parameters)", "T.train_step",
        "T.offload(optimizer)", "G.wake", "T.weight_stream", "G.update_weights", "T.offload(parameters)",
        "G.generate", "G.sleep", "T.reload(optimizer,parameters)", "T.train_step",
        "T.offload(optimizer)", "G.wake", "T.weight_stream", "G.update_weights", "T.offload(parameters)",
    ],
}


@pytest.fixture(scope="module")
def runs(model, tmp_path_factory):
    return {policy: run_steps(model, tmp_path_factory.mktemp(policy), policy) for policy in EXPECTED}


@pytest.mark.parametrize("policy", list(EXPECTED))
def test_the_policy_is_called_at_each_phase_boundary_in_order(runs, policy):
    _, log = runs[policy]
    assert log == EXPECTED[policy]


@pytest.mark.parametrize("policy", ["optimizer", "full"])
def test_no_policy_changes_the_results(runs, policy):
    baseline, _ = runs["none"]
    metrics, _ = runs[policy]
    for ours, theirs in zip(metrics, baseline, strict=True):
        for key, value in theirs.items():
            if not key.startswith(("time/", "refit/")):
                assert math.isclose(ours[key], value, rel_tol=1e-6, abs_tol=1e-7), (key, ours[key], value)


def test_the_reference_model_comes_back_only_to_score(model, tmp_path):
    loop, log, engines = make_loop(model, tmp_path, "none", ["policy.reference.cpu_offload=true"], kl=0.1)
    reference = engines[0].__class__(config=loop.config)
    try:
        reference.load_hf(model)
        loop.reference = Recording(reference, "R", log)
        loop.reference_offload = ReferenceOffload(loop.reference, loop.config.core.policy.reference.cpu_offload)
        metrics = loop.step(PROMPTS)
    finally:
        for engine in (*engines, reference):
            engine.shutdown()
    assert log == ["R.offload(parameters)", "G.generate", "R.reload(parameters)", "R.logprobs",
                   "R.offload(parameters)", "T.train_step", "T.weight_stream", "G.update_weights"]
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-6)  # the reference still holds the policy's weights


class ParametersOnly:
    """A third-party policy: only the parameters leave, and only for generation."""

    def __init__(self, training, generation, config):
        self.training = training

    def before_generation(self):
        self.training.offload(["parameters"])

    def before_training(self):
        self.training.reload(["parameters"])

    def before_refit(self):
        pass

    def after_refit(self):
        pass

    def restore(self):
        pass


def test_a_third_party_policy_is_selected_by_id_and_called(model, tmp_path):
    host = PluginHost(env={})
    host.register(plugin_from(offload_policies=[OffloadPolicy(id="params-only", factory=ParametersOnly)]), name="mine")
    recipe = write_recipe(tmp_path / "r.yaml", {"policy": {"model_name": model, "generation": {"backend": "hf"}}})
    config, selection = select_for(host, recipe, ["policy.offload.policy=params-only"])
    assert selection.offload_policy.id == "params-only"
    log: list[str] = []
    training = host.training_backends.get("dtensor").create(config=config)
    training.load_hf(model)
    policy = selection.offload_policy.registration.create(training=Recording(training, "T", log), generation=None, config=config)
    try:
        policy.before_generation()
        policy.before_training()
    finally:
        training.shutdown()
    assert log == ["T.offload(parameters)", "T.reload(parameters)"]


def test_an_unknown_policy_is_a_config_error_naming_the_key(tmp_path):
    from corerl.errors import ConfigErrors

    recipe = write_recipe(tmp_path / "r.yaml", {"policy": {"model_name": "m"}})
    with pytest.raises(ConfigErrors, match="policy.offload.policy"):
        select_for(PluginHost(env={}), recipe, ["policy.offload.policy=sometimes"])
