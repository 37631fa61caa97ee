"""``corerl validate`` refuses what ``corerl run`` refuses at its start (the data files, models and
run directory a recipe names on this machine), in the same line, because both call
:func:`corerl.run.inputs.check_run_inputs`; ``--recipe-only`` checks the recipe alone; with no
recipe, both take the built-in demo with the overrides. Run in this process (fast tier)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corerl import cli
from tests.refusals import refused_in_one_line

ROW = '{"prompt": "1 2", "answer": "2"}\n'


@pytest.fixture(autouse=True)
def _no_earlier_run_log(monkeypatch):
    """An error line names the log of a run this process started: none here."""
    import corerl.reporting.quiet as quiet

    monkeypatch.setattr(quiet, "_last_log", None)


def _main(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _recipe(folder: Path, text: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    recipe = folder / "recipe.yaml"
    recipe.write_text("defaults: preset:fsdp\npolicy:\n  model_name: builtin:tiny-qwen2\n  generation:\n    backend: hf\n"
                      + text, encoding="utf-8")
    return recipe


def _weightless_model(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


# (id, overrides, what the one error line says); each case is refused by validate and by run alike
REFUSED = [
    ("missing-train-file", ["data.task=dataset", "data.train_files=nowhere.jsonl"],
     "data.train_files: data file nowhere.jsonl does not exist"),
    ("no-train-files", ["data.task=dataset"], "data.train_files: the dataset task needs data.train_files"),
    ("hub-dataset", ["algorithm.name=dpo", "data.task=preferences", "data.hub_dataset=org/pairs"],
     "data.hub_dataset: 'org/pairs' is a Hugging Face Hub dataset, and nothing is downloaded"),
    ("missing-held-out-file", ["data.task=dataset", "data.train_files={train}", "data.held_out_files=[{train}, gone.jsonl]"],
     "data.held_out_files: data file gone.jsonl does not exist"),
    ("text-file", ["data.task=dataset", "data.train_files={text}"], "is not JSONL, Parquet or CSV"),
    ("missing-prompt-file", ["data.prompt_file=nowhere.txt"], "data.prompt_file: cannot read the prompt file nowhere.txt"),
    ("missing-model", ["policy.model_name=no/such/model"], "policy.model_name: model path no/such/model does not exist"),
    ("weightless-model", ["policy.model_name={model}"], "holds no weights"),
    ("unknown-builtin", ["policy.model_name=builtin:tiny-nothing"], "policy.model_name: unknown built-in model"),
    ("hub-tokenizer", ["policy.tokenizer_name=org/tokenizer"], "policy.tokenizer_name: tokenizer org/tokenizer is not a local folder"),
    ("missing-reward-model", ["reward_model.kind=bradley_terry", "reward_model.model_name=runs/nothing/final"],
     "reward_model.model_name: model path runs/nothing/final does not exist"),
    ("output-dir-is-a-file", ["run.output_dir={csv}"], "run.output_dir: cannot make the run directory"),
    ("must-resume-nothing", ["run.output_dir={runs}", "run.name=empty", "run.resume=must"],
     "run.resume: run directory"),
]


def _filled(overrides: list[str], tmp_path: Path) -> list[str]:
    train, csv, text = tmp_path / "train.jsonl", tmp_path / "train.csv", tmp_path / "train.txt"
    train.write_text(ROW)
    csv.write_text("prompt,answer\n")
    text.write_text("a prompt\n")
    (tmp_path / "runs" / "empty").mkdir(parents=True, exist_ok=True)
    model = tmp_path / "model"
    if not model.exists():
        _weightless_model(tmp_path)
    return [o.format(train=train, csv=csv, text=text, model=model, runs=tmp_path / "runs") for o in overrides]


@pytest.mark.parametrize(("overrides", "says"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_validate_refuses_in_one_line_what_run_would_and_recipe_only_does_not(capsys, tmp_path, monkeypatch,
                                                                                overrides, says):
    monkeypatch.chdir(tmp_path)
    recipe = _recipe(tmp_path / "recipes")
    overrides = _filled(overrides, tmp_path)
    code, out, err = _main(capsys, "validate", str(recipe), *overrides)
    line = refused_in_one_line((code, err), says)
    assert "override '" in line  # where the key was set
    assert "not runnable" in out or "what it names on this machine is not" in out
    code, out, err = _main(capsys, "validate", "--recipe-only", str(recipe), *overrides)
    assert code == 0 and err == "", err


@pytest.mark.parametrize("case", ["missing-train-file", "weightless-model", "output-dir-is-a-file"])
def test_run_refuses_the_same_line_before_it_makes_a_run_directory(capsys, tmp_path, monkeypatch, case):
    overrides, _ = next(c[1:] for c in REFUSED if c[0] == case)
    monkeypatch.chdir(tmp_path)
    recipe = _recipe(tmp_path / "recipes")
    overrides = _filled(overrides, tmp_path)
    code, _, err = _main(capsys, "validate", str(recipe), *overrides)
    validated = refused_in_one_line((code, err))
    code, _, err = _main(capsys, "run", str(recipe), *overrides)
    assert refused_in_one_line((code, err)) == validated
    assert not (tmp_path / "runs").exists() or [p.name for p in (tmp_path / "runs").iterdir()] == ["empty"]


def test_every_problem_is_listed_and_json_keeps_the_selection(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = _recipe(tmp_path / "recipes", "data:\n  task: dataset\n  train_files: data/train.jsonl\n")
    code, out, err = _main(capsys, "validate", str(recipe), "policy.model_name=no/model", "--json")
    assert code == 2 and err == ""
    report = json.loads(out)
    assert report["valid"] is False and report["training_backend"]["id"] == "dtensor"
    assert [e["key"] for e in report["errors"]] == ["policy.model_name", "data.train_files"]
    # the recipe's relative path was looked for beside it, then here: both places said, and the file
    train_error = report["errors"][1]["message"]
    assert f"beside it ({tmp_path / 'recipes'})" in train_error and f"working directory ({tmp_path})" in train_error
    assert str(recipe) in train_error


def test_a_finished_run_without_a_checkpoint_is_refused(capsys, tmp_path):
    finished = tmp_path / "runs" / "done"
    finished.mkdir(parents=True)
    (finished / "summary.json").write_text("{}")
    code, _, err = _main(capsys, "validate", str(_recipe(tmp_path / "recipes")), f"run.output_dir={tmp_path / 'runs'}",
                         "run.name=done")
    refused_in_one_line((code, err), "run.name: run directory", "holds a finished run", key="run.name")


def test_validate_takes_overrides_without_a_recipe_as_run_does(capsys, tmp_path):
    from corerl.recipes import DEMO_RECIPE

    code, out, err = _main(capsys, "validate", "algorithm.max_steps=3", f"run.output_dir={tmp_path}", "--json")
    assert code == 0 and json.loads(out)["valid"] is True, err
    code, out, _ = _main(capsys, "validate", "policy.generation.backend=hf")
    assert code == 0 and out.startswith(f"{DEMO_RECIPE}: valid")
    code, out, _ = _main(capsys, "validate")
    assert code == 0 and out.startswith(f"{DEMO_RECIPE}: valid")
    code, _, err = _main(capsys, "validate", "data.task=dataset", "data.train_files=nowhere.jsonl")
    refused_in_one_line((code, err), "data file nowhere.jsonl does not exist", key="data.train_files")
