"""corerl-guess's tests, with the fixtures corerl installs (docs/plugins.md, "Testing a plugin")."""

from __future__ import annotations

import json
from importlib.metadata import entry_points

import corerl_guess.plugin
import pytest
from corerl_guess.plugin import GuessSettings, GuessTheNumber

from corerl.sdk import ConfigErrors, EnvironmentContext, EpisodeView, Turn
from corerl.testing import select_for, write_recipe


@pytest.fixture
def host(corerl_host):
    # corerl_host holds only the core's own plugin: a recipe plays `guess` under GRPO, which trains
    # with dtensor, so register the installed dtensor plugin too, then ours
    (dtensor,) = entry_points(group="corerl.plugins", name="dtensor")
    corerl_host.load_plugin(dtensor.name, dtensor.value)
    corerl_host.register(corerl_guess.plugin, name="guess")
    return corerl_host


@pytest.fixture
def recipe(tmp_path):
    numbers = tmp_path / "numbers.jsonl"
    numbers.write_text("".join(json.dumps({"prompt": "Guess my number (0-9):", "answer": str(n)}) + "\n"
                               for n in range(10)))
    return write_recipe(tmp_path / "recipe.yaml", {
        "cluster": {"gpus_per_node": 1},
        "policy": {"model_name": "builtin:tiny-qwen2", "generation": {"backend": "hf"}},
        "data": {"task": "dataset", "train_files": str(numbers), "env_name": "guess"},
        "algorithm": {"name": "grpo", "max_rollout_turns": 4},
        "env": {"guess": {"hints": True, "num_workers": 0, "timeout_s": 10}},
    })


def test_registers_the_guess_environment(host):
    environment = host.environments.get("guess")
    assert environment.plugin == "guess" and environment.config_schema is GuessSettings


def test_a_recipe_plays_it(host, recipe):
    config, selection = select_for(host, recipe, ["env.guess.hints=false"])
    assert selection.environment.id == "guess" and selection.algorithm.id == "grpo"
    settings = config.section("env.guess")
    assert (settings.hints, settings.num_workers, settings.timeout_s) == (False, 0, 10)


def test_its_section_is_validated(host, recipe):
    with pytest.raises(ConfigErrors) as refused:
        select_for(host, recipe, ["env.guess.hint=false"])
    assert [error.key for error in refused.value.errors] == ["env.guess.hint"]


def test_an_episode_with_hints():
    environment = GuessTheNumber(EnvironmentContext(settings=GuessSettings(hints=True), seed=0))
    row = {"answer": "7"}
    first = environment.step(EpisodeView(row=row, turn=1, responses=("I guess 3",)))
    assert isinstance(first, Turn) and (first.observation, first.done, first.state) == (" higher", False, {"guesses": 1})
    second = environment.step(EpisodeView(row=row, turn=2, responses=("I guess 3", "9"), state=first.state))
    assert (second.observation, second.state) == (" lower", {"guesses": 2})
    last = environment.step(EpisodeView(row=row, turn=3, responses=("I guess 3", "9", "7"), state=second.state))
    assert (last.reward, last.done) == (1.0, True)
    assert environment.step(EpisodeView(row=row, turn=1, responses=("no idea",))).observation == "say a number"


def test_no_hints():
    environment = GuessTheNumber(EnvironmentContext(settings=GuessSettings(hints=False), seed=0))
    assert environment.step(EpisodeView(row={"answer": "7"}, turn=1, responses=("3",))).observation == " no"
