"""Asynchronous GRPO in-process (the run context, its engines, the algorithm, the producer, the
buffer and the dedicated generation engine's driver side, all real; only the Ray actor is
replaced by the same :class:`~corerl.asynchronous.worker.GenerationWorker` in this process):
with ``policy.lora`` each hand-over carries the adapter alone and the worker then samples
exactly as the trained policy's merged weights do; with ``algorithm.async.simulate_training``
the steps sleep instead of training, the weights stay bit-identical and generation keeps to the
staleness bound."""

from __future__ import annotations

import math
import os
import time
from typing import Any

import pytest
import torch

from corerl.asynchronous.engine import DedicatedGeneration
from corerl.asynchronous.worker import AdapterRefit, GenerationWorker, SimulatedRefit
from corerl.config import config_from_mapping
from corerl.generation.contract import SamplingSettings
from corerl.plugin_manager import PluginHost
from corerl.reporting.console import bar_text


class InProcessGeneration(DedicatedGeneration):
    """The dedicated generation engine with its worker in this process: the transport (a Ray
    actor) is what is not under test; the worker's threads and every driver-side path are."""

    def _start(self) -> None:
        self.actor = GenerationWorker(self.registration, self.config, None, self.settings.in_flight)
        self.pid = os.getpid()

    def _call(self, method: str, *args: Any) -> Any:
        return getattr(self.actor, method)(*args)

    def _shutdown_actor(self) -> None:
        if self.actor is not None:
            self.actor.shutdown()
            self.actor = None


def recipe(tmp_path, name: str, **asynchronous: Any) -> dict[str, Any]:
    return {
        "cluster": {"gpus_per_node": 1},
        "policy": {"model_name": "builtin:tiny-qwen2", "max_seq_length": 64,
                   "generation": {"backend": "hf", "max_new_tokens": 6,
                                  "colocated": {"enabled": False, "resources": {"gpus_per_node": 1}}}},
        "algorithm": {"name": "grpo", "batch_size": 2, "num_generations_per_prompt": 2, "max_steps": 3,
                      "async": {"enabled": True, **asynchronous}},
        "run": {"output_dir": str(tmp_path), "name": name, "tensorboard": False},
    }


def started(monkeypatch, config_tree: dict[str, Any]) -> Any:
    from corerl.testing.algorithm_conformance import started_algorithm

    monkeypatch.setattr("corerl.asynchronous.engine.DedicatedGeneration", InProcessGeneration)
    host = PluginHost(env={})
    return started_algorithm(config_from_mapping(config_tree, host), host)


def spread_reward(completion: str, example: Any) -> float:
    """Rewards that differ within a group (a random tiny model earns the task's own rarely): something to learn."""
    return float(len(completion) % 5)


GREEDY = SamplingSettings(temperature=0.0, max_new_tokens=6, seed=1)
PROMPTS = [[3, 4, 5, 6], [7, 8, 9], [10, 11, 12, 13, 14]]


def test_async_lora_hands_the_worker_the_adapter_and_it_samples_as_the_merged_policy(tmp_path, monkeypatch):
    from corerl.generation.hf import HFGenerationBackend
    from corerl.training.weights import REFITS

    tree = recipe(tmp_path, "lora", max_staleness=0)
    tree["policy"]["lora"] = {"enabled": True, "dim": 4, "alpha": 8}
    tree["policy"]["optimizer"] = {"lr": 0.05}
    tree["data"] = {"reward": "tests.test_async_lora_sim:spread_reward"}
    with started(monkeypatch, tree) as (context, algorithm):
        generation = context.generation
        assert isinstance(generation, InProcessGeneration)
        algorithm.begin()
        base = generation.generate(PROMPTS, GREEDY)
        updates = REFITS.updates
        norms = [algorithm.step()["grad_norm"] for _ in range(2)]
        assert max(norms) > 0  # the adapter trained
        algorithm.asynchronous.stop()  # as before the held-out evaluation: the newest adapter in use
        assert REFITS.updates > updates
        # what crossed is the adapter: LoRA's A and B of each wrapped projection, no base weight
        assert isinstance(generation.manifest, AdapterRefit)
        assert generation.manifest.tensors and all("lora_" in name for name in generation.manifest.tensors)
        assert REFITS.tensors == len(generation.manifest.tensors)
        tuned = generation.generate(PROMPTS, GREEDY)

        merged = {name: tensor.detach().clone() for name, tensor in context.training.weight_stream()}
        reference = HFGenerationBackend(context.config)
        reference.load_hf(generation.model_path)
        reference.update_weights(merged.items())
        want = reference.generate(PROMPTS, GREEDY)
    for got, expected in zip(tuned, want, strict=True):
        assert got[0].completion_ids == expected[0].completion_ids
        assert max(abs(a - b) for a, b in zip(got[0].logprobs, expected[0].logprobs, strict=True)) < 1e-4
    # and the refits changed what the worker samples: its logprobs are no longer the base model's
    gaps = [abs(a - b) for t, b0 in zip(tuned, base, strict=True)
            for a, b in zip(t[0].logprobs, b0[0].logprobs, strict=False)]
    assert max(gaps) > 1e-3


def test_a_simulated_trainer_sleeps_keeps_the_weights_and_generation_keeps_the_staleness_bound(tmp_path,
                                                                                                monkeypatch):
    from corerl.run.steps import take_step

    tree = recipe(tmp_path, "sim", max_staleness=1, simulate_training=True, simulate_training_seconds=0.4,
                  simulate_refit_seconds=0.2)
    with started(monkeypatch, tree) as (context, algorithm):
        algorithm.begin()
        before = {name: tensor.detach().clone() for name, tensor in context.training.weight_stream()}
        pushed: list[Any] = []
        worker = context.generation.actor
        original = worker.update_weights

        def seen(weights: Any, version: int) -> int:
            pushed.append((type(weights), version))
            return original(weights, version)

        worker.update_weights = seen
        rows = []
        for _ in range(3):
            start = time.perf_counter()
            rows.append(take_step(algorithm))  # the run loop's own accounting of a step
            assert time.perf_counter() - start >= 0.4
        producer = algorithm.asynchronous.producer
        assert producer.next_batch >= 3  # the generation side drew (at least) three steps' batches
        algorithm.asynchronous.stop()
        after = {name: tensor.detach().clone() for name, tensor in context.training.weight_stream()}
        assert context.generation.version == 3 and worker.version == 3
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    # one real push of the starting weights, then a version without weights per simulated step
    assert [kind for kind, _ in pushed[1:4]] == [SimulatedRefit] * 3 and [v for _, v in pushed[:4]] == [0, 1, 2, 3]
    for row in rows:
        assert row["simulated"] == 1.0
        assert not {"loss", "grad_norm", "lr", "optimizer_step"} & row.keys()
        assert row["time/training"] >= 0.4 and row["async/staleness/max"] <= 1
        assert math.isfinite(row["reward/mean"]) and row["generated_tokens"] > 0
        shown = bar_text({**row, "time/step": 1.0})  # the progress bar reads the row (the loop adds time/step)
        assert "simulated" in shown and "loss" not in shown
    assert algorithm.done == 3


def test_a_simulated_refit_pauses_the_worker_and_leaves_its_weights(tmp_path):
    """On the worker itself: the version moves, the engine thread is held for the seconds, the
    weights are those it had."""
    from corerl.models.tiny import build_tiny_model

    model_dir = str(build_tiny_model(tmp_path / "model", hidden_size=64, num_layers=2, vocab_size=128))
    config = config_from_mapping({"policy": {"model_name": model_dir, "generation": {"backend": "hf"}}},
                                 PluginHost(discover=False, env={}))
    worker = GenerationWorker(PluginHost(discover=False, env={}).generation_backends.get("hf"), config,
                              threads=None, in_flight="wait")
    worker.load_hf(model_dir)
    sampling = SamplingSettings(temperature=1.0, max_new_tokens=5, seed=3)
    first, _ = worker.generate([[1, 2, 3]], sampling, 1)
    start = time.perf_counter()
    assert worker.update_weights(SimulatedRefit(0.3), 4) == 4
    assert time.perf_counter() - start >= 0.3
    again, _ = worker.generate([[1, 2, 3]], sampling, 1)
    assert again[0][0].completion_ids == first[0][0].completion_ids and set(again[0][0].versions) == {4}
    assert again[0][0].logprobs == pytest.approx(first[0][0].logprobs, abs=1e-6)
    worker.shutdown()


def test_simulated_training_without_asynchronous_grpo_is_refused_in_one_line():
    from corerl.asynchronous.settings import check_async
    from corerl.errors import SelectionError

    host = PluginHost(discover=False, env={})
    config = config_from_mapping({"policy": {"model_name": "builtin:tiny-qwen2"},
                                  "algorithm": {"async": {"simulate_training": True}}}, host)
    with pytest.raises(SelectionError, match="simulated trainer") as caught:
        check_async(config, None, [])
    assert caught.value.key == "algorithm.async.simulate_training"
