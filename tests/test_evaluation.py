"""Evaluation during training (``eval``), checkpoints kept by a metric (``checkpointing.metric_name``,
``keep_top_k``) and ``corerl eval RECIPE CHECKPOINT``: the pass@k estimator and the pruning rule by
hand, the refusals in one line each, and one short demo run end to end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from corerl.evaluation import EvalPlan, evaluate_policy, pass_at_k, sampled_figures
from corerl.reporting.metrics_log import latest_values
from corerl.run.checkpoints import KeepPolicy, best_checkpoint, checkpoints_to_keep, save_checkpoint
from tests.conftest import EXAMPLES, run_corerl
from tests.refusals import refused_in_one_line

DEMO = str(EXAMPLES / "demo.yaml")


# -- pass@k and mean@n -------------------------------------------------------------------------------

@pytest.mark.parametrize(("n", "c", "k", "expected"), [
    (4, 1, 1, 0.25),         # pass@1 is the share correct
    (4, 1, 2, 0.5),          # 1 - C(3,2)/C(4,2) = 1 - 3/6
    (5, 2, 3, 0.9),          # 1 - C(3,3)/C(5,3) = 1 - 1/10
    (10, 3, 4, 1 - 35 / 210),  # 1 - C(7,4)/C(10,4)
    (4, 3, 2, 1.0),          # fewer wrong answers than k: every draw of k holds a right one
    (4, 0, 4, 0.0),
    (4, 4, 4, 1.0),
])
def test_pass_at_k_is_the_unbiased_estimator(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, 1, 5), (4, 1, 0)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_mean_at_n_averages_every_answer_and_pass_at_k_counts_rewards_above_one_half():
    # prompt 1: one right answer of 4; prompt 2: 0.6 counts as right, 0.5 and 0.4 do not
    rewards = [[1.0, 0.0, 0.0, 0.0], [0.6, 0.5, 0.4, 0.0]]
    mean, passed = sampled_figures(rewards, 2)
    assert mean == pytest.approx((1.0 + 0.6 + 0.5 + 0.4) / 8)
    assert passed == pytest.approx((0.5 + 0.5) / 2)


class _Rollout:
    """Scores each answer by its prompt: prompt i's answers get rewards[i] (cycled over n)."""

    def __init__(self, greedy: list[float], sampled: list[list[float]]) -> None:
        self.greedy, self.sampled, self.calls = greedy, sampled, []

    def run(self, prompts, items, sampling, n, max_seq_length):
        from corerl.environments.rollout import Rollout

        self.calls.append((len(prompts), sampling.temperature, n))
        rows = [[self.greedy[i]] for i in items] if n == 1 else [self.sampled[i][:n] for i in items]
        return Rollout([[] for _ in prompts], rows)


class _Task:
    def held_out(self):
        return [[1, 2], [1, 3], [1, 4]], [0, 1, 2]


def _config(*overrides: str) -> Any:
    from corerl.config import load_config
    from corerl.plugin_manager import process_host

    return load_config(DEMO, list(overrides), process_host())


def test_an_evaluation_draws_greedy_answers_then_the_samples_at_the_eval_temperature():
    config = _config("eval.num_samples=3", "eval.pass_k=2", "eval.temperature=0.7", "eval.max_prompts=2")
    rollout = _Rollout(greedy=[1.0, 0.0, 1.0], sampled=[[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    result = evaluate_policy(rollout, _Task(), EvalPlan.from_config(config))
    assert rollout.calls == [(2, 0.0, 1), (2, 0.7, 3)]  # max_prompts: the first two held-out prompts
    assert result.prompts == 2
    assert result.figures == pytest.approx({"greedy": 0.5, "mean@3": 1 / 6, "pass@2": (1 - 1 / 3) / 2})
    assert list(result.named()) == ["eval/greedy", "eval/mean@3", "eval/pass@2"]


def test_the_sampled_answers_default_to_the_policy_temperature_and_k_to_the_samples():
    plan = EvalPlan.from_config(_config("policy.generation.temperature=0.9", "eval.num_samples=5"))
    assert plan.sampled.temperature == 0.9 and plan.pass_k == 5 and plan.keys == ["greedy", "mean@5", "pass@5"]
    assert plan.greedy.temperature == 0.0


def test_held_out_answers_end_where_the_recipes_samples_do():
    # the recipe's stop ids and stop strings end the greedy and the sampled answers alike (besides
    # the tokenizer's end of sequence, which every generation backend adds)
    plan = EvalPlan.from_config(_config("policy.generation.stop_token_ids=[7,9]",
                                        "policy.generation.stop_strings=[DONE]", "policy.generation.max_new_tokens=20"))
    for settings in (plan.greedy, plan.sampled):
        assert (settings.stop_token_ids, settings.stop_strings, settings.max_new_tokens) == ((7, 9), ("DONE",), 20)
    assert plan.greedy.temperature == 0.0


# -- checkpoints kept by a metric ------------------------------------------------------------------

def test_without_keep_top_k_the_newest_are_kept():
    found = [(2, 0.9), (4, 0.1), (6, None), (8, 0.5)]
    assert checkpoints_to_keep(found, KeepPolicy(keep_last=2)) == {6, 8}


def test_keep_top_k_keeps_the_best_and_the_newest():
    found = [(2, 0.9), (4, 0.1), (6, 0.7), (8, 0.2)]
    best = KeepPolicy(keep_last=1, keep_top_k=2, metric_name="eval/pass@4")
    assert checkpoints_to_keep(found, best) == {2, 6, 8}  # 8: the newest, to resume from
    lowest = KeepPolicy(keep_last=1, keep_top_k=2, metric_name="loss", higher_is_better=False)
    assert checkpoints_to_keep(found, lowest) == {4, 8}  # the newest is also second best here


def test_a_checkpoint_without_a_value_ranks_last_and_the_newer_of_equals_wins():
    policy = KeepPolicy(keep_last=1, keep_top_k=1, metric_name="eval/greedy")
    assert checkpoints_to_keep([(2, None), (4, 0.0), (6, None)], policy) == {4, 6}
    assert checkpoints_to_keep([(2, 0.5), (4, 0.5), (6, 0.1)], policy) == {4, 6}
    assert checkpoints_to_keep([(2, None), (4, None)], policy) == {4}


def test_saves_prune_by_the_value_each_checkpoint_recorded(tmp_path):
    policy = KeepPolicy(keep_last=1, keep_top_k=2, metric_name="eval/pass@4")
    for step, value in [(2, 0.3), (4, 0.8), (6, None), (8, 0.5), (10, 0.1)]:
        save_checkpoint(tmp_path, step, lambda folder: None, {"metric": {"name": "eval/pass@4", "value": value}},
                        policy)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000004", "step_000008",
                                                                           "step_000010"]
    assert best_checkpoint(tmp_path, policy) == (tmp_path / "checkpoints" / "step_000004", 0.8)
    other = KeepPolicy(keep_last=1, keep_top_k=1, metric_name="reward/mean")  # another metric's values: none
    assert best_checkpoint(tmp_path, other) is None


def test_the_latest_values_name_metrics_as_the_loggers_do():
    rows = [{"phase": "sft", "step": 1, "loss": 2.0},
            {"phase": "grpo", "step": 1, "loss": 0.5, "reward/mean": 0.25, "note": "x"},
            {"phase": "eval", "step": 1, "greedy": 0.4, "pass@4": 0.75}]
    assert latest_values(rows) == {"sft/loss": 2.0, "grpo/loss": 0.5, "loss": 0.5, "grpo/reward/mean": 0.25,
                                   "reward/mean": 0.25, "eval/greedy": 0.4, "eval/pass@4": 0.75}


# -- refusals --------------------------------------------------------------------------------------

REFUSED = [
    ("eval-metric-without-eval", ["checkpointing.metric_name=eval/pass@4", "checkpointing.keep_top_k=2"],
     "checkpointing.metric_name: eval/pass@4 is logged only when the run evaluates during training; "
     "set eval.every_n_steps"),
    ("eval-metric-k-not-drawn", ["eval.every_n_steps=5", "checkpointing.metric_name=eval/pass@8",
                                 "checkpointing.keep_top_k=2"],
     "checkpointing.metric_name: this run does not log eval/pass@8 during training; did you mean eval/pass@4?"),
    ("eval-metric-typo", ["eval.every_n_steps=5", "checkpointing.metric_name=eval/greedi"], "did you mean eval/greedy?"),
    ("training-metric-typo", ["checkpointing.metric_name=reward/maen", "checkpointing.keep_top_k=1"],
     "checkpointing.metric_name: reward/maen is not a metric grpo declares; did you mean reward/mean?"),
    ("keep-top-k-without-metric", ["checkpointing.keep_top_k=2"],
     "checkpointing.keep_top_k: ranking checkpoints needs a metric"),
    ("keep-top-k-without-checkpoints", ["checkpointing.enabled=false", "checkpointing.metric_name=reward/mean",
                                        "checkpointing.keep_top_k=2"],
     "checkpointing.keep_top_k: checkpoints are off"),
    ("pass-k-above-samples", ["eval.num_samples=2", "eval.pass_k=4"], "eval.pass_k: pass@4 needs at least 4 samples"),
    ("at-start-alone", ["eval.at_start=true"], "eval.at_start: evaluating at step 0 is the first point"),
    ("algorithm-samples-nothing", ["algorithm.name=dpo", "data.task=digit_preference", "eval.every_n_steps=2"],
     "eval.every_n_steps: dpo samples nothing"),
    ("asynchronous", ["eval.every_n_steps=2", "algorithm.async.enabled=true", "policy.generation.colocated.enabled=false",
                      "policy.generation.colocated.resources.gpus_per_node=1"],
     "eval.every_n_steps: asynchronous GRPO's generation worker runs ahead of training"),
]


def _main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from corerl.cli import main

    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(("overrides", "expected"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_bad_eval_and_keep_settings_are_refused_in_one_line(capsys, overrides, expected):
    code, _, err = _main(capsys, "validate", DEMO, *overrides)
    refused_in_one_line((code, err), expected)


@pytest.mark.parametrize("overrides", [
    ["eval.every_n_steps=5", "checkpointing.metric_name=eval/pass@4", "checkpointing.keep_top_k=2"],
    ["eval.every_n_steps=5", "eval.num_samples=8", "eval.pass_k=2", "checkpointing.metric_name=eval/mean@8"],
    ["checkpointing.metric_name=grpo/reward/mean", "checkpointing.keep_top_k=3"],
    ["checkpointing.metric_name=loss", "checkpointing.higher_is_better=false", "checkpointing.keep_top_k=1"],
])
def test_metrics_the_run_logs_are_accepted(capsys, overrides):
    code, _, err = _main(capsys, "validate", DEMO, *overrides)
    assert code == 0, err


def test_corerl_eval_refuses_what_is_not_a_checkpoint_in_one_line(capsys, tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "final").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_000004").mkdir(parents=True)  # never sealed: a save that did not finish
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
    cases = [
        ([str(tmp_path / "nope")], "does not exist; give a run's final/ folder"),
        (["eval.num_samples=8"], "CHECKPOINT comes before the KEY=VALUE overrides"),
        ([str(run_dir)], f"is a run directory, not a checkpoint; give {run_dir / 'final'}"),
        ([str(run_dir / "checkpoints" / "step_000004")], "is not complete"),
        ([str(tmp_path / "adapter")], "is a LoRA adapter"),
        ([DEMO], "is a file, not a folder"),
    ]
    for args, expected in cases:
        code, out, err = _main(capsys, "eval", DEMO, *args)
        assert out == "", (args, out)
        refused_in_one_line((code, err), expected)


def test_the_curves_show_the_evaluations_beside_the_training_reward(tmp_path):
    from corerl.plugin_manager import process_host
    from corerl.reporting.plot import plot_curves

    rows = [{"phase": "grpo", "step": s, "loss": 0.1, "reward/mean": 0.1 * s, "reward/max": 1.0} for s in (1, 2)]
    rows += [{"phase": "eval", "step": 2, "greedy": 0.5, "mean@4": 0.25, "pass@4": 0.75, "seconds": 1.0}]
    out = plot_curves(rows, tmp_path / "curves.png", "run", process_host().algorithms)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    only_eval = plot_curves(rows[-1:], tmp_path / "eval.png", "run", process_host().algorithms)
    assert only_eval.exists()


def test_eval_only_evaluates_the_model_as_it_is_and_writes_no_run(capsys, tmp_path, monkeypatch):
    """``corerl run eval.only=true``: the held-out figures of policy.model_name, no training and no
    run directory (SkyRL's main_generate runs this way)."""
    from corerl import cli

    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1 2", "answer": "2"}\n{"prompt": "3 4", "answer": "4"}\n', encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    code = cli.main(["run", "eval.only=true", "data.task=dataset", f"data.train_files={rows}",
                     f"data.held_out_files={rows}", "policy.generation.backend=hf", "eval.num_samples=2",
                     f"run.output_dir={tmp_path / 'runs'}"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "2 held-out prompts of dataset, 2 samples each" in out and "eval/pass@2" in out
    assert not (tmp_path / "runs").exists()
    assert cli.main(["run", "eval.only=true", "algorithm.name=dpo", "data.task=preferences"]) == 2
    assert "eval.only: dpo samples nothing" in capsys.readouterr().err


# -- end to end (slow) -----------------------------------------------------------------------------

def test_a_demo_run_evaluates_every_two_steps_keeps_its_best_checkpoint_and_corerl_eval_agrees(tmp_path):
    """A short demo run evaluates at GRPO steps 0, 2 and 4 (rows of metrics.jsonl), ranks its
    checkpoints by eval/greedy, and `corerl eval` on its final/ prints the figures of the run's
    last evaluation (its greedy one the run's held-out reward at the end)."""
    args = ["sft.max_steps=1", "algorithm.max_steps=4", "algorithm.batch_size=4", "algorithm.num_generations_per_prompt=4",
            "policy.generation.backend=hf", "eval.num_samples=2", "eval.max_prompts=10"]
    run = run_corerl("run", f"run.output_dir={tmp_path}", "run.name=evaluated", *args, "eval.every_n_steps=2",
                     "eval.at_start=true", "checkpointing.save_period=1", "checkpointing.metric_name=eval/greedy",
                     "checkpointing.keep_top_k=1")
    assert run.code == 0, run
    run_dir = tmp_path / "evaluated"
    assert "eval at GRPO step 2 (10 prompts" in run.out, run.out
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evaluations = [r for r in rows if r["phase"] == "eval"]
    assert [r["step"] for r in evaluations] == [0, 2, 4]
    assert all(set(r) == {"phase", "step", "greedy", "mean@2", "pass@2", "seconds"} for r in evaluations)

    kept = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    best = summary["best_checkpoint"]
    assert best["metric"] == "eval/greedy" and Path(best["path"]).name in kept and "step_000005" in kept
    assert len(kept) <= 2 and best["value"] == max(r["greedy"] for r in evaluations)  # the best and the newest

    report = tmp_path / "eval.json"
    result = run_corerl("eval", DEMO, str(run_dir / "final"), *args, "--output", str(report))
    assert result.code == 0, result
    assert "eval/greedy" in result.out and "eval/mean@2" in result.out and "eval/pass@2" in result.out, result.out
    figures = json.loads(report.read_text())["metrics"]
    assert figures["eval/greedy"] == pytest.approx(summary["held_out_reward_after"])
    # the same weights, prompts and seed: the figures of the run's last evaluation
    assert figures == pytest.approx({f"eval/{k}": evaluations[-1][k] for k in ("greedy", "mean@2", "pass@2")})
