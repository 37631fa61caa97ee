"""Relative paths in recipe files (:mod:`corerl.config.paths`): looked up beside the recipe that
writes them, then in the working directory; an override's, the Python API's and the output
folder's stay relative to the working directory."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from corerl.config import config_from_mapping, load_config
from corerl.config.fields import PATH_NOTE
from corerl.config.paths import path_keys
from corerl.config.schema import DataConfig
from corerl.plugin_manager import PluginHost
from corerl.run.record import RECIPE_FILE, record_recipe

ROW = '{"prompt": "1 2", "answer": "2"}\n'


@pytest.fixture
def host() -> PluginHost:
    return PluginHost(env={})


@pytest.fixture
def places(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """A recipe folder and a working directory apart from it (the working directory is entered)."""
    recipes, work = tmp_path / "recipes", tmp_path / "work"
    for folder in (recipes / "data", work / "data"):
        folder.mkdir(parents=True)
    monkeypatch.chdir(work)
    return recipes, work


def _recipe(folder: Path, data: str, name: str = "recipe.yaml", head: str = "") -> Path:
    path = folder / name
    path.write_text(f"{head}policy:\n  model_name: builtin:tiny-qwen2\ndata:\n  task: dataset\n{data}", encoding="utf-8")
    return path


def test_the_path_settings_are_declared_in_the_schema():
    keys = set(path_keys({}))
    assert {"policy.model_name", "policy.tokenizer_name", "critic.model_name", "reward_model.model_name",
            "data.train_files", "data.held_out_files", "data.prompt_file", "data.system_prompt_file"} <= keys
    assert "run.output_dir" not in keys  # a run writes under the working directory
    field = attrs.fields_dict(DataConfig)["train_files"]
    assert PATH_NOTE in field.metadata["help"]  # the configuration reference says so per key


def test_a_path_beside_the_recipe_is_used_from_any_working_directory(places, host):
    recipes, _ = places
    (recipes / "data" / "train.jsonl").write_text(ROW)
    (recipes / "prompt.txt").write_text("Q: {}")
    config = load_config(_recipe(recipes, "  train_files: data/train.jsonl\n  prompt_file: prompt.txt\n"), [], host)
    assert config.core.data.train_files == str(recipes / "data" / "train.jsonl")
    assert config.core.data.prompt_file == str(recipes / "prompt.txt")
    assert config.warnings == []


def test_a_path_only_in_the_working_directory_is_still_found_there(places, host):
    recipes, work = places
    (work / "data" / "train.jsonl").write_text(ROW)
    config = load_config(_recipe(recipes, "  train_files: [data/train.jsonl]\n"), [], host)
    assert config.core.data.train_files == [str(work / "data" / "train.jsonl")]
    assert config.warnings == []


def test_a_path_in_both_places_is_the_recipes_with_a_warning_naming_the_key(places, host):
    recipes, work = places
    for folder in (recipes, work):
        (folder / "data" / "train.jsonl").write_text(ROW)
    recipe = _recipe(recipes, "  train_files: data/train.jsonl\n")
    config = load_config(recipe, [], host)
    assert config.core.data.train_files == str(recipes / "data" / "train.jsonl")
    (warning,) = config.warnings
    assert warning.startswith("data.train_files: data/train.jsonl is both beside the recipe") and str(recipe) in warning


def test_a_path_found_nowhere_is_left_as_written(places, host):
    recipes, _ = places
    config = load_config(_recipe(recipes, "  train_files: data/later.jsonl\n"), [], host)
    assert config.core.data.train_files == "data/later.jsonl"
    assert config.core.policy.model_name == "builtin:tiny-qwen2"  # not a path: as written


def test_a_parents_path_is_beside_the_parent(places, host):
    recipes, _ = places
    (recipes / "data" / "train.jsonl").write_text(ROW)
    _recipe(recipes, "  train_files: data/train.jsonl\n", name="base.yaml")
    child_folder = recipes / "child"
    child_folder.mkdir()
    child = child_folder / "child.yaml"
    child.write_text(f"defaults: {recipes / 'base.yaml'}\nalgorithm:\n  max_steps: 3\n")
    assert load_config(child, [], host).core.data.train_files == str(recipes / "data" / "train.jsonl")


def test_overrides_the_python_api_and_the_output_folder_stay_relative_to_the_working_directory(places, host):
    recipes, work = places
    (recipes / "data" / "train.jsonl").write_text(ROW)
    recipe = _recipe(recipes, "  train_files: data/elsewhere.jsonl\n", head="run:\n  output_dir: runs\n")
    config = load_config(recipe, ["data.train_files=data/train.jsonl"], host)
    assert config.core.data.train_files == "data/train.jsonl"  # the override's: the working directory's, as written
    assert config.core.run.output_dir == "runs"
    mapped = config_from_mapping({"policy": {"model_name": "builtin:tiny-qwen2"},
                                  "data": {"task": "dataset", "train_files": "data/train.jsonl"}}, host)
    assert mapped.core.data.train_files == "data/train.jsonl"


def test_the_recorded_recipe_names_the_same_files_from_its_run_directory(places, host, tmp_path):
    recipes, _ = places
    (recipes / "data" / "train.jsonl").write_text(ROW)
    config = load_config(_recipe(recipes, "  train_files: data/train.jsonl\n"), [], host)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    record_recipe(run_dir, config)
    again = load_config(run_dir / RECIPE_FILE, [], host)
    assert again.core.data.train_files == config.core.data.train_files == str(recipes / "data" / "train.jsonl")
