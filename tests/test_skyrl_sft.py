"""SkyRL's SFT entry point (``skyrl.train.main_sft``), its data keys shown by the rows corerl
trains and evaluates on: an eval split that slices a dataset (``train[-500:]``) holds out those
rows (``data.held_out_rows``), each training dataset's slice is read (``data.train_rows``), and
several training datasets are mixed per batch by ``train_dataset_weights``
(``data.train_file_weights``); what SkyRL refuses of them is refused in one line (issue 75)."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from corerl.config import load_config
from corerl.config.schema import DataConfig
from corerl.errors import ConfigError, ConfigErrors
from corerl.models.tiny import build_tokenizer
from corerl.plugin_manager import PluginHost
from corerl.tasks import TaskContext
from corerl.tasks.dataset import DatasetTask, check_data_inputs


def _rows(path: Path, first_id: int, count: int) -> Path:
    path.write_text("".join(json.dumps({"question": f"w1 {i % 10} w{i}", "answer": str(i % 10), "id": i}) + "\n"
                            for i in range(first_id, first_id + count)))
    return path


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    """Two training files: ``a`` of 20 rows (ids 0..19), ``b`` of 6 (ids 100..105)."""
    return _rows(tmp_path / "a.jsonl", 0, 20), _rows(tmp_path / "b.jsonl", 100, 6)


def _config(tmp_path: Path, *keys: str) -> Any:
    """corerl's config of a SkyRL SFT launch script giving ``keys`` (the chat column is the
    rows' ``question``)."""
    script = tmp_path / "run_sft.sh"
    quoted = ['{}="{}"'.format(*key.split("=", 1)) for key in keys]  # as SkyRL's scripts quote a list
    script.write_text("python -m skyrl.train.main_sft \\\n  " + " \\\n  ".join(
        ["model.path=builtin:tiny", "messages_key=question", "num_steps=2", "batch_size=4",
         "placement.num_gpus_per_node=1", *quoted]) + "\n")
    return load_config(str(script), [], PluginHost(), [], "skyrl", environ={})


def _task(data: DataConfig) -> DatasetTask:
    return DatasetTask(TaskContext(build_tokenizer(), seed=5, data=data))


def _refusals(tmp_path: Path, *keys: str) -> list[ConfigError]:
    with pytest.raises(ConfigErrors) as caught:
        _config(tmp_path, *keys)
    for error in caught.value.errors:
        assert "\n" not in error.one_line()
    return caught.value.errors


def test_an_eval_split_slicing_the_training_dataset_holds_out_those_rows(tmp_path, files):
    a, _ = files
    config = _config(tmp_path, f"train_datasets=['{a}']", "train_dataset_splits=['train[:12]']",
                     f"eval_datasets=['{a}']", "eval_dataset_splits=['train[-4:]']")
    assert (config.core.data.max_train_rows, config.core.data.held_out_rows) == (12, ["-4:"])
    task = _task(config.core.data)
    # SkyRL's split: trains on the first 12 rows and evaluates on the last 4, none of them trained on
    assert sorted(row["id"] for row in task.train) == list(range(12))
    assert sorted(row["id"] for row in task.held_out()[1]) == [16, 17, 18, 19]
    # the whole split (SkyRL's "train") holds out every row of the file
    whole = _config(tmp_path, f"train_datasets=['{a}']", "train_dataset_splits=['train[:12]']",
                    f"eval_datasets=['{a}']", "eval_dataset_splits=['train']")
    assert whole.core.data.held_out_rows is None and len(_task(whole.core.data).held_out()[1]) == 20
    middle = _config(tmp_path, f"train_datasets=['{a}']", "train_dataset_splits=['train[2:10]']",
                     f"eval_datasets=['{a}']", "eval_dataset_splits=['train[12:15]']")
    task = _task(middle.core.data)
    assert sorted(row["id"] for row in task.train) == list(range(2, 10))
    assert sorted(row["id"] for row in task.held_out()[1]) == [12, 13, 14]


def test_several_training_datasets_are_mixed_per_batch_by_their_weights(tmp_path, files):
    a, b = files
    datasets = [f"train_datasets=['{a}','{b}']", "train_dataset_splits=['train[:8]','train']"]
    eval_rows = [f"eval_datasets=['{a}']", "eval_dataset_splits=['train[-2:]']"]
    config = _config(tmp_path, *datasets, *eval_rows, "train_dataset_weights=[0.75,0.25]")
    assert config.core.data.train_rows == [":8", ":"] and config.core.data.train_file_weights == [0.75, 0.25]
    task = _task(config.core.data)
    assert sorted(row["id"] for row in task.train) == [*range(8), *range(100, 106)]
    for _ in range(10):  # every batch of 4 draws 3 rows of a and 1 of b, whatever the files' sizes
        drawn = collections.Counter(row["id"] >= 100 for row in task.sample(4)[1])
        assert drawn == {False: 3, True: 1}
    # a's 8 rows are drawn in epochs of their own: 30 draws of a visit each row 3 or 4 times
    ids = collections.Counter(row["id"] for row in task.sample(40)[1])
    assert set(ids) == {*range(8), *range(100, 106)} and sum(ids[i] for i in range(8)) == 30
    # other weights, other batches; none given: SkyRL's equal shares
    flipped = _task(_config(tmp_path, *datasets, *eval_rows, "train_dataset_weights=[1,3]").core.data)
    assert collections.Counter(row["id"] >= 100 for row in flipped.sample(8)[1]) == {False: 2, True: 6}
    equal = _config(tmp_path, *datasets, *eval_rows)
    assert equal.core.data.train_file_weights == [0.5, 0.5]
    assert collections.Counter(row["id"] >= 100 for row in _task(equal.core.data).sample(8)[1]) == {False: 4, True: 4}


def test_a_mixtures_draws_resume_where_they_stopped(files):
    a, b = files
    data = attrs.evolve(DataConfig(), prompt_key="question", train_files=[str(a), str(b)], held_out_size=2,
                        train_file_weights=[2.0, 1.0])
    task = _task(data)
    task.sample(5)
    saved = json.loads(json.dumps(task.state()))
    want = task.sample(17)[1]
    other = _task(data)
    other.set_state(saved)
    assert other.sample(17)[1] == want


def test_what_skyrl_refuses_of_the_splits_and_weights_is_refused_in_one_line(tmp_path, files):
    a, b = files
    two = f"train_datasets=['{a}','{b}']"
    cases = [
        ((f"train_datasets=['{a}']", "train_dataset_splits=['train[:10%]']"), "train_dataset_splits", "percentages"),
        ((two, "train_dataset_splits=['train[:8]']"), "train_dataset_splits",
         "1 split(s) for 2 dataset(s) of train_datasets"),
        (("eval_dataset_splits=['train[-4:]']",), "eval_dataset_splits", "needs eval_datasets"),
        ((f"eval_datasets=['{a}','{b}']", "eval_dataset_splits=['train[-4:]']"), "eval_dataset_splits",
         "1 split(s) for 2 dataset(s) of eval_datasets"),
        ((two, "train_dataset_splits=['train','train']", "train_dataset_weights=[1.0]"), "train_dataset_weights",
         "one weight above 0 per entry"),
        ((two, "train_dataset_splits=['train','train']", "train_dataset_weights=[1.0,0]"), "train_dataset_weights",
         "one weight above 0 per entry"),
        ((two,), "train_datasets", "need train_dataset_splits"),
        ((f"train_datasets=['{a}']", "train_dataset_weights=[0.5,0.5]"), "train_dataset_weights",
         "one train_datasets entry per weight"),
    ]
    for keys, key, says in cases:
        errors = _refusals(tmp_path, *keys)
        assert any(error.key == key and says in error.one_line() for error in errors), (keys, errors)
    # without train_datasets SkyRL reads one dataset (dataset_name's, or its default): one split is its
    assert _config(tmp_path, "train_dataset_splits=['train[:8]']").core.data.max_train_rows == 8
    assert _config(tmp_path, "dataset_name=org/set", "train_dataset_splits=['train[4:8]']").core.data.train_rows == [
        "4:8"]


def test_row_slices_and_weights_are_checked_before_a_row_is_read(files):
    a, b = files
    data = attrs.evolve(DataConfig(), task="dataset", train_files=[str(a), str(b)])

    def refused(**settings: Any) -> list[str]:
        return [f"{e.key}: {e.message}" for e in check_data_inputs(attrs.evolve(data, **settings), "dataset")]

    assert refused(train_rows=[":8", ":"], train_file_weights=[1.0, 2.0]) == []
    assert refused(train_rows="8") == ["data.train_rows: '8' is not a slice of rows"]
    assert refused(train_rows=[":8"]) == ["data.train_rows: data.train_rows gives 1 slices for 2 files"]
    assert refused(held_out_rows="-4:")[0].startswith("data.held_out_rows: data.held_out_rows is set and "
                                                      "data.held_out_files is not")
    assert refused(train_file_weights=[1.0]) == ["data.train_file_weights: data.train_file_weights gives 1 weights "
                                                 "for 2 train files"]
    assert check_data_inputs(attrs.evolve(data, train_file_weights=[1.0, 1.0]), "preferences")[0].key == (
        "data.train_file_weights")
    with pytest.raises(ConfigError, match="holds no rows"):  # a slice past the file's end
        _task(attrs.evolve(data, prompt_key="question", held_out_size=1, train_rows=["30:", ":"]))


def _step(tmp_path: Path, algorithm: str, **recipe: Any) -> tuple[Any, dict[str, float]]:
    """One step of a tiny in-process run of ``algorithm`` (the conformance tests' recipe, ``recipe``
    laid over it): its task and the step's metrics."""
    from corerl.config.tree import deep_merge
    from corerl.reporting.console import make_console
    from corerl.run.context import RunContext
    from corerl.run.steps import start_algorithm, take_step
    from corerl.testing import host_for_component, select_for, write_recipe
    from corerl.testing.algorithm_conformance import base_recipe

    host = host_for_component("algorithms", algorithm, None, "algorithm")[0]
    folder = tmp_path / f"{algorithm}-{len(list(tmp_path.iterdir()))}"
    laid = deep_merge(base_recipe(algorithm, "prompts", 1), {**recipe, "run": {"output_dir": str(folder)}})
    config, selection = select_for(host, write_recipe(folder / "recipe.yaml", laid))
    context = RunContext.open(config, selection, make_console(quiet=True), host)
    try:
        context.start_engines()
        run = start_algorithm(context, selection.algorithm.registration)
        run.begin()
        return context.task, take_step(run, selection.algorithm.registration)
    finally:
        context.close(run_failed=False)


def test_a_dummy_run_trains_on_made_up_sequences_of_the_full_length(tmp_path):
    config = _config(tmp_path, "max_length=48", "num_steps=10", "dummy_run_full_ctx=true", "dummy_run_max_steps=3")
    assert (config.core.data.full_context, config.core.algorithm.max_steps, config.core.policy.max_seq_length) == (
        True, 3, 48)  # SkyRL's dummy run: dummy_run_max_steps steps, num_steps unused
    assert _config(tmp_path, "dummy_run_full_ctx=true").core.algorithm.max_steps == 5  # SkyRL's default
    assert not _config(tmp_path, "dummy_run_full_ctx=false", "dummy_run_max_steps=3").core.data.full_context
    errors = _refusals(tmp_path, "dummy_run_full_ctx=true", "dummy_run_max_steps=0")
    assert [error.key for error in errors] == ["dummy_run_max_steps"]
    # an SFT step of 4 demonstrations: 4 x 63 trained tokens (policy.max_seq_length 64, a one-token
    # prompt), against the few of digit_echo's own answers
    task, full = _step(tmp_path, "sft", data={"full_context": True})
    assert type(task).__name__ == "FullContextTask" and full["tokens"] == 4 * 63
    assert all(len(prompt) + len(response) == 64 for prompt, response in task.demonstrations(3))
    _, real = _step(tmp_path, "sft")
    assert real["tokens"] < 4 * 10


def test_a_full_context_grpo_step_fills_the_context_with_random_rewards(tmp_path):
    task, metrics = _step(tmp_path, "grpo", data={"full_context": True}, policy={"generation": {"ignore_eos": True}})
    # prompts of 64 - 4 tokens (max_new_tokens 4), every completion 4 tokens long: 4 prompts x 2 samples
    assert [len(prompt) for prompt in task.sample(3)[0]] == [60, 60, 60]
    assert metrics["generated_tokens"] == 4 * 2 * 4
    assert 0.0 <= metrics["reward/mean"] <= 1.0
    # the held-out evaluation keeps the task's own prompts and rewards
    assert task.held_out() == task.task.held_out() and task.held_out()[0]
    made_up = task.sample(1)[1][0]
    assert {task.reward(None, made_up) for _ in range(40)} == {0.0, 1.0}
    saved = json.loads(json.dumps(task.state()))
    want = task.sample(2)[0]
    task.set_state(saved)
    assert task.sample(2)[0] == want
    with pytest.raises(ConfigError, match="data.env_name") as caught:
        raise check_data_inputs(attrs.evolve(DataConfig(), full_context=True, env_name="math"), "digit_echo")[0]
    assert caught.value.key == "data.full_context"


#: what SkyRL's full_context entry point stands for in corerl (its EntryPoint.implies)
FULL_CONTEXT_IMPLIES = (("data.full_context", True), ("policy.generation.ignore_eos", True), ("data.env_name", None))


def test_the_full_context_entry_point_runs_its_dummy_steps_without_evaluating():
    from corerl.config.dialects.skyrl import entry_points
    from corerl.config.dialects.skyrl.translate import translate
    from corerl.config.tree import value_at

    real = entry_points.by_id("full_context")
    assert real.adds is None and real.implies == FULL_CONTEXT_IMPLIES  # the record as the translation reads it
    raw = {"trainer": {"epochs": 20, "eval_interval": 5, "eval_before_train": True, "train_batch_size": 8,
                       "policy_mini_batch_size": 8},
           "environment": {"env_class": "gsm8k"}}
    origins = {key: "run_full_ctx.sh:1" for key in ("trainer.epochs", "trainer.eval_interval",
                                                     "trainer.eval_before_train", "trainer.train_batch_size",
                                                     "trainer.policy_mini_batch_size", "environment.env_class")}
    result = translate(raw, origins, False, None, "full_context")
    assert value_at(result.tree, "algorithm.max_steps") == 5  # SkyRL's default of trainer.num_dummy_steps
    assert (value_at(result.tree, "eval.every_n_steps"), value_at(result.tree, "eval.at_start")) == (0, False)
    assert value_at(result.tree, "data.full_context") is True and value_at(result.tree, "data.env_name") is None
    fates = {fate.key: fate.fate for fate in result.fates}
    assert fates["trainer.epochs"] == fates["trainer.eval_interval"] == "inert"
    main_base = translate(raw, origins, False, None, "main_base").tree
    assert value_at(main_base, "eval.every_n_steps") == 5 and value_at(main_base, "data.full_context") is None
