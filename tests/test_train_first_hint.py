"""A missing model that is a run's final model (the distillation demo's teacher) says what to run
first: the command the recipe's comments give for that run name, else the general form."""

from __future__ import annotations

from corerl import cli
from tests.conftest import REPO


def _line(capfd, *argv: str) -> str:
    assert cli.main(["validate", *argv]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_the_distillation_demo_says_how_to_train_its_teacher(capfd, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = _line(capfd, str(REPO / "examples" / "configs" / "distillation_demo.yaml"))
    assert line.startswith("corerl: error: algorithm.distillation.teacher_model: model path runs/demo-teacher/final "
                           "does not exist; it is the final model of a run named 'demo-teacher', not made yet: train "
                           "it first with corerl run examples/configs/demo.yaml run.name=demo-teacher"), line


def test_a_recipe_without_the_command_gets_the_general_form(capfd, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = _line(capfd, "algorithm.name=distillation", "policy.model_name=builtin:tiny-qwen2-small",
                 "algorithm.distillation.teacher_model=runs/teacher/final")
    assert "train it first with corerl run <the recipe that trains it> run.name=teacher" in line, line
