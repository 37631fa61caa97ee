"""Tasks and rewards: the dataset task over real JSONL/Parquet/CSV files, the exact-answer reward,
rewards by import path, and their errors."""

from __future__ import annotations

import json

import attrs
import datasets
import pytest

from corerl.config.schema import DataConfig
from corerl.generation.contract import Sample
from corerl.models.tiny import build_tokenizer
from corerl.tasks import TaskContext, TaskSource
from corerl.tasks.dataset import DatasetTask
from corerl.tasks.rewards import exact_answer
from tests.conftest import clean_env, run_corerl
from tests.refusals import refused_in_one_line

ROWS = [{"question": f"w1 {d} w{i}", "answer": str(d), "id": i} for i, d in enumerate([3, 1, 4, 1, 5, 9, 2, 6, 5, 3] * 2)]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _write_csv(path, rows):
    import csv

    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _task(tmp_path, train, **data):
    values = {"prompt_key": "question", "held_out_size": 4, **data, "train_files": str(train)}
    return DatasetTask(TaskContext(build_tokenizer(), seed=5, data=attrs.evolve(DataConfig(), **values)))


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "csv"])
def test_dataset_task_reads_the_file_and_keeps_a_held_out_split(tmp_path, fmt):
    path = tmp_path / f"train.{fmt}"
    if fmt == "jsonl":
        _write_jsonl(path, ROWS)
    elif fmt == "csv":
        _write_csv(path, ROWS)
    else:
        datasets.Dataset.from_list(ROWS).to_parquet(str(path))
    task = _task(tmp_path, path)
    assert isinstance(task, TaskSource)
    tokenizer = build_tokenizer()
    held_prompts, held_rows = task.held_out()
    assert len(held_rows) == 4 and len(task.train) == 16
    assert {r["id"] for r in held_rows}.isdisjoint(r["id"] for r in task.train)
    assert held_prompts[0] == [tokenizer.bos_token_id, *tokenizer.encode(held_rows[0]["question"])]
    # one epoch of 16 draws visits every training row once
    _, drawn = task.sample(16)
    assert sorted(r["id"] for r in drawn) == sorted(r["id"] for r in task.train)
    prompt, response = task.demonstrations(1)[0]
    assert response[-1] == tokenizer.eos_token_id and len(response) == 2


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_max_train_rows_reads_only_the_first_rows_of_the_files(tmp_path, fmt):
    first, second = tmp_path / f"a.{fmt}", tmp_path / f"b.{fmt}"
    for path, rows in ((first, ROWS[:6]), (second, ROWS[6:])):
        if fmt == "jsonl":
            _write_jsonl(path, rows)
        else:
            datasets.Dataset.from_list(rows).to_parquet(str(path))
    data = attrs.evolve(DataConfig(), prompt_key="question", held_out_size=2, max_train_rows=8,
                        train_files=[str(first), str(second)])
    task = DatasetTask(TaskContext(build_tokenizer(), seed=5, data=data))
    # the first 8 rows in file order (the first file's 6, the second's first 2), then the held-out cut
    assert sorted(r["id"] for r in [*task.train, *task.held]) == list(range(8))
    assert len(task.held) == 2


def test_a_csv_file_gives_its_values_as_text_and_a_bad_row_its_line(tmp_path):
    """A CSV has no types: an id column of numbers is read as their text (no builder guessing it
    from the first rows); a row with more fields than the header is refused with its line."""
    task = _task(tmp_path, _write_csv(tmp_path / "train.csv", ROWS))
    assert {type(r["id"]) for r in task.train} == {str} and {r["answer"] for r in task.train} <= set("0123456789")
    bad = tmp_path / "bad.csv"
    bad.write_text("question,answer\nw1 3,3\nw1 4,4,extra\n")
    with pytest.raises(Exception, match=r"bad.csv line 3 has 3 fields for a header of 2"):
        _task(tmp_path, bad)


def test_dataset_task_state_replays_the_same_draws(tmp_path):
    task = _task(tmp_path, _write_jsonl(tmp_path / "t.jsonl", ROWS))
    task.sample(5)
    saved = json.loads(json.dumps(task.state()))
    want = task.sample(20)[1]
    other = _task(tmp_path, tmp_path / "t.jsonl")
    other.set_state(saved)
    assert other.sample(20)[1] == want


def test_exact_answer_reads_the_whole_answer_the_text_after_hashes_or_the_last_line():
    example = {"answer": "42"}
    assert exact_answer("42", example) == 1.0
    assert exact_answer("  42. ", example) == 1.0
    assert exact_answer("6 times 7 #### 42", example) == 1.0
    assert exact_answer("let me think\nit is 6 * 7\n42\n", example) == 1.0
    assert exact_answer("41", example) == 0.0
    assert exact_answer("142", example) == 0.0
    assert exact_answer("", example) == 0.0
    assert exact_answer("Paris", {"answer": "paris"}) == 1.0


def test_dataset_task_scores_decoded_completions_with_its_reward(tmp_path):
    task = _task(tmp_path, _write_jsonl(tmp_path / "t.jsonl", ROWS))
    tokenizer = build_tokenizer()
    right = Sample(prompt_ids=(2,), completion_ids=(*tokenizer.encode("4"), tokenizer.eos_token_id), logprobs=(0.0, 0.0),
                   finish_reason="stop")
    assert task.reward(right, {"answer": "4"}) == 1.0
    assert task.reward(right, {"answer": "5"}) == 0.0


def _recipe_args(tmp_path, *extra):
    return ["run", f"run.output_dir={tmp_path}", "policy.generation.backend=hf", "sft.enabled=false",
            "algorithm.batch_size=4", "algorithm.num_generations_per_prompt=4", "checkpointing.enabled=false", *extra]


def test_a_run_on_a_dataset_with_a_reward_given_by_import_path(tmp_path):
    train = _write_jsonl(tmp_path / "train.jsonl", ROWS)
    (tmp_path / "my_rewards.py").write_text(
        "def quarter(completion, example):\n"
        "    assert isinstance(completion, str) and example['answer'].isdigit()\n"
        "    return 0.25\n")
    env_path = {"PYTHONPATH": str(tmp_path)}
    result = run_corerl(*_recipe_args(tmp_path, "run.name=ds", "algorithm.max_steps=3", "data.task=dataset",
                                      f"data.train_files={train}", "data.prompt_key=question",
                                      "data.reward=my_rewards:quarter"), env=clean_env(env_path))
    assert result.code == 0, result
    summary = json.loads((tmp_path / "ds" / "summary.json").read_text())
    assert (summary["task"], summary["reward"]) == ("dataset", "my_rewards:quarter")
    assert summary["held_out_reward_before"] == summary["held_out_reward_after"] == 0.25
    rows = [json.loads(line) for line in (tmp_path / "ds" / "metrics.jsonl").read_text().splitlines()]
    assert [r["reward/mean"] for r in rows] == [0.25] * 3


def test_sft_alone_teaches_a_dataset_and_exact_answer_sees_it(tmp_path):
    # prompt "w1 d wN" -> answer "d": learnable by heart in a few dozen steps
    rows = [{"prompt": f"w1 {d} w{i % 7}", "answer": str(d)} for i, d in enumerate(list(range(10)) * 6)]
    train = _write_jsonl(tmp_path / "train.jsonl", rows)
    result = run_corerl(*_recipe_args(tmp_path, "run.name=sft", "algorithm.name=sft", "algorithm.max_steps=60",
                                      "algorithm.batch_size=16", "data.task=dataset", f"data.train_files={train}",
                                      "data.held_out_size=10", "data.reward=exact_answer", "policy.generation.max_new_tokens=3"))
    assert result.code == 0, result
    summary = json.loads((tmp_path / "sft" / "summary.json").read_text())
    assert summary["algorithm"] == "sft" and summary["grpo_steps"] == 0
    assert summary["held_out_reward_after"] >= summary["held_out_reward_before"] + 0.3, summary
    losses = [json.loads(line)["loss"] for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert losses[-1] < losses[0] / 4


def test_kl_penalty_measures_the_distance_to_the_frozen_sft_model(tmp_path):
    result = run_corerl(*_recipe_args(tmp_path, "run.name=kl", "algorithm.max_steps=4", "sft.enabled=true",
                                      "sft.max_steps=3", "algorithm.kl_penalty=0.5", "policy.generation.max_new_tokens=4"))
    assert result.code == 0, result
    rows = [json.loads(line) for line in (tmp_path / "kl" / "metrics.jsonl").read_text().splitlines()]
    kl = [r["kl"] for r in rows if r["phase"] == "grpo"]
    assert kl[0] == pytest.approx(0.0, abs=1e-6)  # the first step's policy is the reference
    assert all(k >= 0 for k in kl) and kl[-1] > 1e-6
    assert (tmp_path / "kl" / "sft_model" / "config.json").exists()


@pytest.mark.parametrize(("args", "key", "words"), [
    (["data.reward=no_such_module_here:fn"], "data.reward", "cannot import reward module 'no_such_module_here'"),
    (["data.reward=json:no_such_function"], "data.reward", "module 'json' has no 'no_such_function'"),
    (["data.reward=exact_answr"], "data.reward", "did you mean 'exact_answer'"),
    (["data.task=digit_echoo"], "data.task", "did you mean 'digit_echo'"),
])
def test_bad_task_or_reward_fails_validation_in_one_line(args, key, words):
    refused_in_one_line(run_corerl("validate", "examples/configs/demo.yaml", *args), words, key=key)


@pytest.mark.parametrize(("make", "args", "words"), [
    (None, ["data.train_files=nowhere.jsonl"], "data file nowhere.jsonl does not exist"),
    ("train.txt", [], "is not JSONL, Parquet or CSV"),
    ("train.jsonl", ["data.prompt_key=prompt_text"], "column 'prompt_text' (data.prompt_key) is not in"),
    (None, [], "the dataset task needs data.train_files"),
])
def test_bad_dataset_settings_stop_the_run_in_one_line(tmp_path, make, args, words):
    files = []
    if make:
        path = tmp_path / make
        _write_jsonl(path, ROWS)
        files = [f"data.train_files={path}"]
    result = run_corerl(*_recipe_args(tmp_path, "data.task=dataset", "data.prompt_key=question", *files, *args))
    refused_in_one_line(result, "data.", words)
    assert result.err.startswith("corerl: error: data."), result


@pytest.mark.parametrize("max_steps, epochs, batch, want", [
    (100, 2, 4, 8),  # 16 training rows, 4 a step: 4 steps an epoch; the epochs come first
    (5, 2, 4, 5),  # max_steps comes first
    (None, 3, 5, 12),  # max_steps unset (NeMo RL's max_num_steps: -1): ceil(16 / 5) = 4 steps an epoch
    (7, None, 4, 7),  # no max_epochs: max_steps alone
])
def test_max_epochs_sets_the_runs_steps_from_the_training_rows(tmp_path, max_steps, epochs, batch, want):
    from corerl.config import load_config
    from corerl.plugin_manager import PluginHost
    from corerl.run.epochs import limit_to_epochs

    task = _task(tmp_path, _write_jsonl(tmp_path / "train.jsonl", ROWS))
    assert task.train_rows == 16
    recipe = tmp_path / "r.yaml"
    recipe.write_text("policy:\n  model_name: builtin:tiny-qwen2\n")
    config = load_config(recipe, [f"algorithm.max_steps={'null' if max_steps is None else max_steps}",
                                  f"algorithm.max_epochs={'null' if epochs is None else epochs}",
                                  f"algorithm.batch_size={batch}"], PluginHost(env={}))
    limit_to_epochs(config, task)
    assert config.core.algorithm.max_steps == want
    drawn = [row["id"] for _ in range(-(-16 // batch)) for row in task.sample(batch)[1]]
    assert sorted(set(drawn)) == sorted(r["id"] for r in task.train)  # an epoch's steps draw every training row


def test_max_epochs_is_refused_for_a_task_that_makes_up_its_prompts(tmp_path):
    from corerl.config import load_config
    from corerl.errors import ConfigError, ConfigErrors
    from corerl.plugin_manager import PluginHost
    from corerl.run.epochs import limit_to_epochs
    from corerl.tasks.digit_echo import DigitEcho

    recipe = tmp_path / "r.yaml"
    recipe.write_text("policy:\n  model_name: builtin:tiny-qwen2\n")
    config = load_config(recipe, ["algorithm.max_epochs=2"], PluginHost(env={}))
    with pytest.raises(ConfigError) as refused:
        limit_to_epochs(config, DigitEcho(TaskContext(build_tokenizer(), seed=5, data=config.core.data)))
    assert refused.value.key == "algorithm.max_epochs" and "no fixed training set" in refused.value.one_line()
    with pytest.raises(ConfigErrors) as neither:  # nothing says when to stop
        load_config(recipe, ["algorithm.max_steps=null"], PluginHost(env={}))
    assert [e.key for e in neither.value.errors] == ["algorithm.max_steps"]
