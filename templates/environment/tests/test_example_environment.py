"""The template environment's own tests, written the way a third-party author would write them:
its registration and section, a few turns by hand, and corerl's environment conformance suite."""

from __future__ import annotations

import corerl_example_environment.plugin
import pytest
from corerl_example_environment.environment import DigitGuess

from corerl.sdk import ConfigErrors, EnvironmentContext, EpisodeView
from corerl.testing import select_for, write_recipe
from corerl.testing.environment_conformance import EnvironmentConformance

RECIPE = {"policy": {"model_name": "builtin:tiny-qwen2"}, "data": {"env_name": "digit_guess"},
          "algorithm": {"max_rollout_turns": 4}}


def test_registers_the_environment_and_validates_its_section(corerl_host, tmp_path):
    corerl_host.register(corerl_example_environment.plugin, name="example_environment")
    recipe = write_recipe(tmp_path / "recipe.yaml", RECIPE)
    config, selection = select_for(corerl_host, recipe, ["env.digit_guess.hints=messages"])
    assert selection.environment.id == "digit_guess"
    assert config.section("env.digit_guess").hints == "messages"
    with pytest.raises(ConfigErrors) as wrong:
        select_for(corerl_host, recipe, ["env.digit_guess.turn_penalty=2"])
    assert [e.key for e in wrong.value.errors] == ["env.digit_guess.turn_penalty"]


def test_a_wrong_guess_gets_a_hint_and_a_right_one_ends_the_episode():
    from corerl_example_environment.plugin import DigitGuessSettings

    environment = DigitGuess(EnvironmentContext(DigitGuessSettings(turn_penalty=0.25, higher="higher"), seed=0))
    first = environment.step(EpisodeView(row={"answer": "7"}, turn=1, responses=("3",)))
    assert (first.observation, first.done, first.state) == (" higher", False, {"wrong": 1})
    assert environment.step(EpisodeView(row={"answer": "7"}, turn=1, responses=("8",))).observation == " -"
    second = environment.step(EpisodeView(row={"answer": "7"}, turn=2, responses=("3", "7"), state=first.state))
    assert second.done and second.reward == 0.75


class TestExampleEnvironmentConformance(EnvironmentConformance):
    """corerl's environment conformance suite: scripted turns through the pool a run uses."""

    environment_id = "digit_guess"
    plugin = corerl_example_environment.plugin
    rows = [{"answer": "3"}, {"answer": "7"}, 5]  # a dataset's rows, and digit_echo's (the digit itself)
    failing_rows = [{"question": "no digit here"}]

    @classmethod
    def respond(cls, row, turn):
        """A model that guesses 4, then reads the hint and says the digit."""
        digit = row if isinstance(row, int) else row.get("answer", "0")
        return "4" if turn == 1 else f"it is {digit}"


class TestExampleEnvironmentWithChatHints(TestExampleEnvironmentConformance):
    settings = {"hints": "messages"}
