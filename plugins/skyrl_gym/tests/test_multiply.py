"""The ``multiply`` environment (SkyRL's multiply example, written here) played through the
skyrl_gym adapter as the SkyRL dialect's ``multiply`` entry point registers it, on rows laid out as
the example's multiply_dataset.py writes them."""

from __future__ import annotations

import pytest

from corerl_skyrl_gym.multiply import MultiplyEnv, boxed_answer
from tests.skyrl_gym_episodes import play, registered_as_its_entry_point

ENTRY = "corerl_skyrl_gym.multiply:MultiplyEnv"


def multiply_row(question="12 * 34", answer="408"):
    return {"data_source": "synthetic_multiply",
            "prompt": [{"role": "system", "content": "Solve the multiplication. Put your final answer in "
                                                       "\\boxed{answer} format."},
                       {"role": "user", "content": question}],
            "env_class": "multiply", "reward_spec": {"method": "rule", "ground_truth": answer},
            "extra_info": {"num_digits": 2, "split": "train"}}


@pytest.fixture
def environment():
    """The adapter with multiply registered as the entry point registers it; deregistered after."""
    yield from registered_as_its_entry_point("multiply", ENTRY)


def test_a_right_boxed_answer_scores_one_and_ends_the_episode(environment):
    (turn,) = play(environment, multiply_row(), ["12 * 34 = 408, so \\boxed{ 408 }"])
    assert turn.done and turn.reward == 1.0


def test_a_wrong_answer_is_told_and_retried_until_right(environment):
    turns = play(environment, multiply_row(), ["\\boxed{400}", "I think it is 408", "\\boxed{408}"])
    assert [t.reward for t in turns] == [0.0, 0.0, 1.0] and [t.done for t in turns] == [False, False, True]
    assert turns[0].observation[0]["role"] == "user" and "400" in turns[0].observation[0]["content"]
    assert "boxed" in turns[1].observation[0]["content"]
    assert sum(t.reward for t in turns) == 1.0  # corerl's episode reward: the turns' sum


def test_the_last_turn_scores_half_for_a_wrong_boxed_answer_and_nothing_for_none(environment):
    wrong = play(environment, {**multiply_row(), "max_turns": 2}, ["\\boxed{1}", "\\boxed{2}"])
    assert [t.reward for t in wrong] == [0.0, 0.5] and wrong[-1].done
    none = play(environment, {**multiply_row(), "max_turns": 1}, ["408"])
    assert [t.reward for t in none] == [0.0] and none[-1].done


def test_five_turns_unless_the_row_says_otherwise(environment):
    turns = play(environment, multiply_row(), ["\\boxed{7}"] * 6)
    assert len(turns) == 5 and turns[-1].done and turns[-1].reward == 0.5


def test_the_first_box_counts_and_an_empty_or_nested_box_is_none():
    assert boxed_answer("\\boxed{408} or \\boxed{409}") == "408"
    assert boxed_answer("\\boxed{}") is None and boxed_answer("no box") is None
    assert boxed_answer("\\boxed{\\frac{1}{2}}") == "\\frac{1"  # up to the first closing brace, as SkyRL reads it


def test_a_row_without_the_truth_is_refused():
    with pytest.raises(ValueError, match="reward_spec.ground_truth"):
        MultiplyEnv(extras={"reward_spec": {"method": "rule"}})
