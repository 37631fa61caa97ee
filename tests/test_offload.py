"""Offload policies: the order of their calls around a real GRPO step, that each offload moves
the state it names (on a CPU too: it is parked in host memory), and that no policy changes a
result (dtensor training, hf generation, a tiny model)."""

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
    """Passes every call to the real engine and notes the watched ones in ``log``; around each
    ``offload``/``reload`` of an engine that reports ``state_bytes``, notes in ``held`` the bytes
    its ranks hold of the parts moved, before and after the call."""

    def __init__(self, engine, name, log, held=None):
        self._engine, self._name, self._log = engine, name, log
        self._held = held if held is not None else []

    def __getattr__(self, attr):
        target = getattr(self._engine, attr)
        if attr not in WATCHED:
            return target

        def call(*args, **kwargs):
            parts = f"({','.join(args[0])})" if attr in ("offload", "reload") else ""
            self._log.append(f"{self._name}.{attr}{parts}")
            if attr not in ("offload", "reload") or not hasattr(self._engine, "state_bytes"):
                return target(*args, **kwargs)
            before = self._engine.state_bytes()
            result = target(*args, **kwargs)
            after = self._engine.state_bytes()
            self._held.append((f"{self._name}.{attr}", {part: ([r[part] for r in before], [r[part] for r in after])
                                                        for part in args[0]}))
            return result

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
    held: list = []
    engines = []
    for registration in (selection.training_backend.registration, selection.generation_backend.registration):
        engine = registration.create(config=config)
        engine.load_hf(model)
        engines.append(engine)
    training, generation = Recording(engines[0], "T", log, held), Recording(engines[1], "G", log)
    offload = selection.offload_policy.registration.create(training=training, generation=generation, config=config)
    loop = GRPO(config, training, generation, reward, loss=GRPOLoss(kl_penalty=kl), offload=offload)
    return loop, log, engines, held


def run_steps(model, tmp_path, policy, steps=3):
    """``steps`` GRPO steps: three, so that the optimizer state the first step made and an
    offload moved is used by the second step's update, which the third step's figures show."""
    loop, log, engines, held = make_loop(model, tmp_path, policy)
    try:
        metrics = [loop.step(PROMPTS) for _ in range(steps)]
    finally:
        for engine in engines:
            engine.shutdown()
    return metrics, log, held


STEP_NONE = ["G.generate", "T.train_step", "T.weight_stream", "G.update_weights"]
LATER_OPTIMIZER = ["G.generate", "G.sleep", "T.reload(optimizer)", "T.train_step",
                   "T.offload(optimizer)", "G.wake", "T.weight_stream", "G.update_weights"]
LATER_FULL = ["G.generate", "G.sleep", "T.reload(optimizer,parameters)", "T.train_step",
              "T.offload(optimizer)", "G.wake", "T.weight_stream", "G.update_weights", "T.offload(parameters)"]
EXPECTED = {
    "none": STEP_NONE * 3,
    "optimizer": ["T.offload(optimizer)", *LATER_OPTIMIZER * 3],
    "full": ["T.offload(optimizer,parameters)", *LATER_FULL * 3],
}


@pytest.fixture(scope="module")
def runs(model, tmp_path_factory):
    return {policy: run_steps(model, tmp_path_factory.mktemp(policy), policy) for policy in EXPECTED}


@pytest.mark.parametrize("policy", list(EXPECTED))
def test_the_policy_is_called_at_each_phase_boundary_in_order(runs, policy):
    _, log, _ = runs[policy]
    assert log == EXPECTED[policy]


@pytest.mark.parametrize("policy", ["optimizer", "full"])
def test_each_offload_leaves_no_bytes_of_its_parts_and_each_reload_brings_them_back(runs, policy):
    """The parts really leave (a no-op offload fails here): after each offload the rank holds 0
    bytes of them, after each reload what it held before that offload; and each part left with
    bytes in it at least once (the optimizer has no state before the first step)."""
    _, _, held = runs[policy]
    assert [call for call, _ in held] == [entry.split("(")[0] for entry in EXPECTED[policy]
                                          if entry.startswith(("T.offload", "T.reload"))]
    left, moved = {}, set()
    for call, parts in held:
        for part, (before, after) in parts.items():
            if call == "T.offload":
                assert after == [0], (call, part, before, after)
                left[part] = before
                moved.update([part] if all(b > 0 for b in before) else [])
            else:
                assert after == left.pop(part), (call, part, before, after)
    assert moved == ({"optimizer", "parameters"} if policy == "full" else {"optimizer"}), held


@pytest.mark.parametrize("policy", ["optimizer", "full"])
def test_no_policy_changes_the_results(runs, policy):
    baseline, _, _ = runs["none"]
    metrics, _, _ = runs[policy]
    for ours, theirs in zip(metrics, baseline, strict=True):
        for key, value in theirs.items():
            if not key.startswith(("time/", "refit/")):
                assert math.isclose(ours[key], value, rel_tol=1e-6, abs_tol=1e-7), (key, ours[key], value)


def test_the_reference_model_comes_back_only_to_score(model, tmp_path):
    loop, log, engines, _ = make_loop(model, tmp_path, "none", ["policy.reference.cpu_offload=true"], kl=0.1)
    size = engines[0].state_bytes()[0]["parameters"]  # the policy's: the reference is the same model
    reference = engines[0].__class__(config=loop.config)
    held: list = []
    try:
        reference.load_hf(model)
        loop.reference = Recording(reference, "R", log, held)
        loop.reference_offload = ReferenceOffload(loop.reference, loop.config.core.policy.reference.cpu_offload)
        metrics = loop.step(PROMPTS)
    finally:
        for engine in (*engines, reference):
            engine.shutdown()
    assert log == ["R.offload(parameters)", "G.generate", "R.reload(parameters)", "R.logprobs",
                   "R.offload(parameters)", "T.train_step", "T.weight_stream", "G.update_weights"]
    # the reference's parameters left while generating and came back: 0 bytes, then all of them
    assert [(call, parts["parameters"]) for call, parts in held] == [
        ("R.offload", ([size], [0])), ("R.reload", ([0], [size])), ("R.offload", ([size], [0]))]
    assert size > 0
    # and came back as they were: the reference and the policy load the same weights, so a reload
    # that brings other bytes back (the check can fail now that offload moves them) shows as KL
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-6)


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


def test_hf_generation_sleeps_by_freeing_its_own_model_and_wakes_with_it_unchanged(model, tmp_path):
    """On a CPU too: asleep, its parameters hold no bytes; awake, the same samples and logprobs."""
    from corerl.generation.contract import SamplingSettings
    from corerl.training.memory import storage_bytes

    recipe = write_recipe(tmp_path / "r.yaml", {"policy": {"model_name": model, "precision": "float32",
                                                           "generation": {"backend": "hf"}}})
    config, selection = select_for(PluginHost(env={}), recipe, [])
    generation = selection.generation_backend.registration.create(config=config)
    generation.load_hf(model)
    sampling = SamplingSettings(temperature=1.0, max_new_tokens=6, seed=5)
    try:
        size = storage_bytes(generation.model.parameters())
        before = generation.generate(PROMPTS, sampling, n=2)
        generation.sleep()
        asleep = storage_bytes(generation.model.parameters())
        with pytest.raises(RuntimeError, match="cannot sample while asleep: call wake"):
            generation.generate(PROMPTS, sampling, n=2)  # not from freed memory
        generation.wake()
        assert (size, asleep, storage_bytes(generation.model.parameters())) == (size, 0, size) and size > 0
        assert generation.generate(PROMPTS, sampling, n=2) == before
    finally:
        generation.shutdown()


def test_the_offload_check_passes_the_dtensor_backend_on_a_cpu(model, tmp_path):
    """corerl.testing.offload_check against a real backend (world size 1, in this process), after
    a step (the optimizer holds state); it fails for an offload that moves nothing or a reload that
    brings other bytes back (checked by hand)."""
    from corerl.testing.conformance import conformance_batch, conformance_loss
    from corerl.testing.offload_check import check_offload_keeps_state

    recipe = write_recipe(tmp_path / "r.yaml", {"policy": {"model_name": model, "precision": "float32",
                                                           "optimizer": {"name": "adamw", "lr": 1e-3},
                                                           "generation": {"backend": "hf"}}})
    config, selection = select_for(PluginHost(env={}), recipe, [])
    backend = selection.training_backend.registration.create(config=config)
    try:
        backend.load_hf(model)
        batch = conformance_batch(vocab=32)
        backend.train_step(batch, conformance_loss)
        check_offload_keeps_state(backend, batch, tolerance=1e-6)
        with pytest.raises(RuntimeError, match="parameters offloaded; reload"):  # nothing computes from parked state
            backend.offload(["parameters"])
            backend.logprobs(batch)
    finally:
        backend.shutdown()
