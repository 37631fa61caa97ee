"""Every registered algorithm is driven one step in-process (world size 1, no Ray) through a
:class:`corerl.run.context.RunContext`, as the run loop drives it; the runner knows no
algorithm by name."""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import pytest

from corerl.algorithms.contract import AlgorithmBase, StepCountError
from corerl.config import config_from_mapping
from corerl.config.selection import select
from corerl.plugin_manager import PluginHost
from corerl.registry import Algorithm
from corerl.reporting.console import make_console
from corerl.run.context import RunContext
from corerl.run.loop import execute
from corerl.run.steps import take_step
from corerl.testing import plugin_from
from corerl.testing.algorithm_conformance import AlgorithmConformance
from tests.conftest import REPO

ALGORITHMS = {
    "sft": {"data": {"task": "digit_echo"}},
    "grpo": {"data": {"task": "digit_echo"}, "algorithm": {"kl_penalty": 0.05}},
    "ppo": {"data": {"task": "digit_echo"}},
    "dpo": {"data": {"task": "digit_preference"}, "algorithm": {"dpo": {"precompute_reference_logprobs": False}}},
    "rm": {"data": {"task": "digit_preference"}},
    "distillation": {"data": {"task": "digit_echo"},
                     "algorithm": {"distillation": {"teacher_model": "builtin:tiny-qwen2", "kl_type": "mixed",
                                                    "topk_logits_k": 8}}},
}


def _context(tmp_path: Path, name: str, host: PluginHost, model: str = "builtin:tiny-qwen2") -> RunContext:
    extra = ALGORITHMS[name]
    recipe = {
        "cluster": {"gpus_per_node": 1},
        "policy": {"model_name": model, "generation": {"backend": "hf", "max_new_tokens": 4},
                   "max_seq_length": 64},
        "algorithm": {"name": name, "batch_size": 4, "num_generations_per_prompt": 2, "max_steps": 1,
                      **extra.get("algorithm", {})},
        "data": extra["data"],
        "run": {"output_dir": str(tmp_path), "name": name, "tensorboard": False},
    }
    config = config_from_mapping(recipe, host)
    return RunContext.open(config, select(config, host), make_console(), host)


#: algorithms whose dense step the conformance classes at the end of this file take
CONFORMING = {"grpo", "sft", "dpo"}
CASES = [pytest.param(name, model, id=f"{name}-{kind}") for name in sorted(ALGORITHMS)
         for model, kind in (("builtin:tiny-qwen2", "dense"), ("builtin:tiny-moe", "moe"))
         if not (kind == "dense" and name in CONFORMING)]


@pytest.mark.parametrize("name, model", CASES)
def test_one_step_of_each_core_algorithm_runs_in_process(tmp_path, name, model):
    """Every algorithm, on a dense policy (GRPO, SFT, DPO: their conformance classes below) and on a
    mixture of experts (PPO's critic then is one too: a value head on the MoE model); a MoE step
    reports its routers' expert load."""
    host = PluginHost(env={})
    context = _context(tmp_path, name, host, model)
    try:
        context.start_engines()
        registration = context.selection.algorithm.registration
        assert registration.id == name
        algorithm = registration.load()(context)
        before = algorithm.held_out()
        assert list(before)[0] == algorithm.measure and 0.0 <= before[algorithm.measure] <= 1.0
        algorithm.begin()
        metrics = take_step(algorithm)
        assert math.isfinite(metrics["loss"]) and metrics["optimizer_step"] == 1.0, metrics
        assert (context.generation is None) == (not registration.generation)
        if registration.critic:
            assert "critic/value_loss" in metrics
        if name in ("grpo", "ppo"):
            assert "reward/mean" in metrics
        if name in ("grpo", "ppo", "distillation"):  # the step's weight update, seen: counted, its tensors and bytes
            assert metrics["refit/updates"] >= 1 and metrics["refit/bytes"] >= 0, metrics  # 0: hf shares the model
        if name == "grpo":  # the KL penalty started a frozen reference beside the policy
            assert len(context.started) == 3
        if name == "rm":  # the policy's backend built as a value model: pairs scored, no generation engine
            assert 0.0 <= metrics["pairwise_accuracy"] <= 1.0 and len(context.started) == 1
        if name == "distillation":  # the teacher, a third engine: builtin:tiny-qwen2's own weights, so it
            assert len(context.started) == 3 and "reward/mean" in metrics  # agrees with the dense student only
            for kl in (metrics["reverse_kl"], metrics["forward_kl"]):  # mixed: both, the forward over the top-8
                assert abs(kl) < 1e-5 if model == "builtin:tiny-qwen2" else kl > 1e-4, metrics
            assert 0.0 < metrics["teacher_topk_mass"] <= 1.0
        experts = {key for key in metrics if key.startswith("moe/")}
        if model.endswith("moe"):  # each of the two layers' load, shares of the routed token-slots
            assert {"moe/layer0/load_min", "moe/layer1/load_max", "moe/layer1/load_entropy"} <= experts, metrics
            assert 0.0 <= metrics["moe/layer0/load_min"] <= 1 / 8 <= metrics["moe/layer0/load_max"] <= 1.0
        else:
            assert not experts
    finally:
        context.close(run_failed=False)


CORE_ALGORITHMS = {"sft", "grpo", "ppo", "dpo", "distillation", "rm"}


def _string_compares(path: Path) -> list[str]:
    """Places in ``path`` that compare with, test membership in, or key a dict by a core
    algorithm's id."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        constants: list[ast.expr] = []
        if isinstance(node, ast.Compare):
            constants = [node.left, *node.comparators]
            constants += [e for c in node.comparators if isinstance(c, (ast.Tuple, ast.List, ast.Set)) for e in c.elts]
        elif isinstance(node, ast.Dict):
            constants = [k for k in node.keys if k is not None]
        for constant in constants:
            if isinstance(constant, ast.Constant) and constant.value in CORE_ALGORITHMS:
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def test_no_algorithm_name_is_compared_outside_the_algorithm_modules():
    core = REPO / "core" / "src" / "corerl"
    # the NeMo RL dialect reads NeMo RL's own section names (grpo:, sft:, dpo:) in a foreign recipe;
    # the Tinker service reads the Tinker API's own loss function names (ppo is one) in a client's request
    exempt = {core / "algorithms", core / "config" / "dialects", core / "run" / "tinker" / "losses.py"}
    files = [p for p in core.rglob("*.py") if not any(p.is_relative_to(e) for e in exempt)]
    files += list((REPO / "plugins").glob("*/src/**/*.py"))
    assert [place for f in files for place in _string_compares(f)] == []


def test_the_runner_is_short():
    assert len((REPO / "core" / "src" / "corerl" / "run" / "loop.py").read_text().splitlines()) < 300


def test_no_algorithm_module_imports_another():
    """What GRPO, PPO, SFT and DPO share lives in corerl.algorithms.batches and the *_math modules."""
    folder = REPO / "core" / "src" / "corerl" / "algorithms"
    algorithms = {"grpo", "ppo", "sft", "dpo"}
    found = []
    for name in algorithms:
        for node in ast.walk(ast.parse((folder / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported = node.module.removeprefix("corerl.algorithms.")
                if imported in algorithms - {name}:
                    found.append(f"{name}.py:{node.lineno} imports {node.module}")
    assert found == []


class TestGRPOConformance(AlgorithmConformance):
    """The core's GRPO, with a KL penalty, through the suite a plugin's algorithm runs
    (corerl.testing.algorithm_conformance); it also takes the dense case of the one-step test."""

    algorithm_id = "grpo"
    recipe = ALGORITHMS["grpo"]

    def test_the_kl_penalty_starts_a_frozen_reference(self, first_step):
        assert first_step.engines == 3  # policy, generation and the reference of the starting weights
        assert 0.0 <= first_step.metrics["reward/mean"] <= 1.0 and first_step.metrics["optimizer_step"] == 1.0


class TestSFTConformance(AlgorithmConformance):
    algorithm_id = "sft"
    recipe = ALGORITHMS["sft"]


class TestDPOConformance(AlgorithmConformance):
    """A preference algorithm that samples nothing: no generation engine, a frozen reference."""

    algorithm_id = "dpo"
    recipe = ALGORITHMS["dpo"]

    def test_it_scores_pairs_against_a_reference_and_starts_no_generation_engine(self, first_step):
        assert first_step.engines == 2 and first_step.context.generation is None
        assert 0.0 <= first_step.metrics["preference_accuracy"] <= 1.0


class SelfCounting(AlgorithmBase):
    """An algorithm that advances its own step counter (as one written before contract 2.10 might):
    the run loop counts too, so it would run half its steps, logged under doubled numbers."""

    name = "selfcount"

    def held_out(self):
        return {"reward": 0.0}

    def step(self):
        self.done += 1
        return {"loss": 0.0}


def _self_counting_plugin():
    return plugin_from(algorithms=[Algorithm(id="selfcount", factory=SelfCounting, generation=False)])


def test_a_step_that_advances_its_own_counter_stops_the_run_in_one_line(tmp_path):
    host = PluginHost(env={})
    host.register(_self_counting_plugin(), name="selfcounter")
    config = config_from_mapping({
        "cluster": {"gpus_per_node": 1}, "policy": {"model_name": "builtin:tiny-qwen2", "max_seq_length": 64},
        "algorithm": {"name": "selfcount", "max_steps": 4}, "data": {"task": "digit_echo"},
        "run": {"output_dir": str(tmp_path), "name": "selfcount", "tensorboard": False}}, host)
    with pytest.raises(StepCountError) as stopped:
        execute(config, select(config, host), host, make_console(quiet=True))
    line = str(stopped.value)
    assert "\n" not in line and line.startswith(f"algorithm 'selfcount' (plugin 'selfcounter', {__name__}.SelfCounting) "
                                                "changed its step counter inside step(): done went from 0 to 1"), line
    assert "remove the assignment to done from step()" in line
    assert not (tmp_path / "selfcount" / "summary.json").exists()


def test_the_conformance_suite_catches_an_algorithm_that_counts_its_own_steps(tmp_path):
    class Case(AlgorithmConformance):
        algorithm_id = "selfcount"
        plugin = _self_counting_plugin()

    record = Case._first_step(tmp_path)
    try:
        with pytest.raises(pytest.fail.Exception) as failed:
            Case().test_the_step_counter_is_left_to_the_run_loop(record, None)
    finally:
        record.context.close(run_failed=False)
    assert str(failed.value).startswith("algorithm 'selfcount' (plugin 'selfcount-under-test'")
    assert "\n" not in str(failed.value)


class _Phase:
    name, done, total = "fake", 3, 10

    def __init__(self, metrics):
        self.metrics = metrics

    def step(self):
        return self.metrics


@pytest.mark.parametrize("metrics, says", [
    ({"loss": 0.1, "step": 7}, "returned the metric 'step' from step(), a key the run loop writes itself"),
    ({"loss": 0.1, "phase": "x"}, "returned the metric 'phase'"),
    ([0.1], "returned list from step(), not a dict of metrics"),
])
def test_a_step_may_not_write_what_the_run_loop_writes(metrics, says):
    phase = _Phase(metrics)
    with pytest.raises(StepCountError, match=re.escape(says)):
        take_step(phase)
    assert phase.done == 3
    assert take_step(_Phase({"loss": 0.1})) == {"loss": 0.1}
