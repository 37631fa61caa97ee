"""NeMo RL's VLM reward environments (``clevr_cogent``, ``geometry3k``, ``refcoco``, ``vlm``): each
reward function on hand-made turns (right, wrong, malformed), their weighted sum, the one-line
refusals of what they do not know, and NeMo RL's own VLM GRPO recipe validating with them."""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path

import pytest

from corerl.environments.vlm_env import (
    ClevrCogentSettings,
    RefcocoSettings,
    VLMEnvironment,
    WeightedReward,
    bbox_giou_reward,
    exact_alnum_reward,
    format_reward,
    giou,
    math_expr_reward,
    read_box,
    reward_function_errors,
)
from corerl.testing.environment_conformance import EnvironmentConformance
from tests.conftest import REPO
from tests.refusals import refused_in_one_line

CORPUS = Path(os.environ.get("CORERL_NEMO_RL_CONFIGS") or REPO.parent / "shared" / "nemo-rl" / "examples" / "configs")
needs_math_verify = pytest.mark.skipif(importlib.util.find_spec("math_verify") is None,
                                       reason="math_expr needs the math-verify package")

GOOD = "<think>two cubes and a sphere</think> <answer>3</answer>"


# -- format --------------------------------------------------------------------------------------

@pytest.mark.parametrize("response, reward", [
    (GOOD, 1.0),
    ("<think>hm</think> it is 3", 0.25),
    ("<answer>3</answer>", 0.75),
    ("3", 0.0),
    ("<think>unclosed <answer>3", 0.0),
    ("</answer>3<answer>", 0.0),  # closed before it opens: no block
])
def test_format_gives_a_quarter_for_thinking_and_three_quarters_for_an_answer(response, reward):
    assert format_reward(response, "3") == reward


def test_format_reads_the_tags_it_is_given():
    assert format_reward("<reason>x</reason><final>3</final>", "3", think_tag="reason", answer_tag="final") == 1.0
    assert format_reward(GOOD, "3", think_tag="reason", answer_tag="final") == 0.0


# -- exact_alnum ---------------------------------------------------------------------------------

@pytest.mark.parametrize("response, gold, reward", [
    (GOOD, "3", 1.0),
    ("<answer> Yes. </answer>", "yes", 1.0),  # case, spaces and punctuation dropped
    ("<answer>(B) red-cube</answer>", "b redcube", 1.0),
    ("<answer>4</answer>", "3", 0.0),
    ("<answer>33</answer>", "3", 0.0),
    ("the answer is 3", "3", 0.0),  # no answer block
    ("<answer>...</answer>", "3", 0.0),
    ("<answer>2</answer> no, <answer>3</answer>", "3", 1.0),  # the last block is the answer
    (GOOD, "<answer> 3 </answer>", 1.0),  # a ground truth in answer tags is read inside them
    (GOOD, 3, 1.0),  # a number column
])
def test_exact_alnum_compares_letters_and_digits_only(response, gold, reward):
    assert exact_alnum_reward(response, gold) == reward


# -- math_expr -----------------------------------------------------------------------------------

@needs_math_verify
@pytest.mark.parametrize("response, gold, reward", [
    ("<think>x</think><answer>\\frac{1}{2}</answer>", "0.5", 1.0),
    ("<answer>$2\\sqrt{3}$</answer>", "2\\sqrt{3}", 1.0),
    ("<answer>2\\sqrt{3}</answer>", "2\\sqrt{3}", 1.0),
    ("<answer>2</answer>", "2\\sqrt{3}", 0.0),  # a bare ground truth is read whole, not as its first number
    ("<answer>so $x = 4$</answer>", "4", 1.0),
    ("<answer>12</answer>", "<answer>12</answer>", 1.0),
    ("<answer>0.3</answer>", "0.5", 0.0),
    ("0.5", "0.5", 0.0),  # no answer block
    ("<answer></answer>", "0.5", 0.0),
])
def test_math_expr_checks_the_answer_as_mathematics(response, gold, reward):
    assert math_expr_reward(response, gold) == reward


# -- bbox_giou -----------------------------------------------------------------------------------

def test_giou_is_the_iou_less_the_uncovered_share_of_the_enclosing_box():
    assert giou((0, 0, 2, 2), (0, 0, 2, 2)) == 1.0
    # half overlapping: intersection 2, union 6, hull 6 -> IoU 1/3 = GIoU
    assert giou((0, 0, 2, 2), (1, 0, 3, 2)) == pytest.approx(1 / 3)
    # disjoint: IoU 0, union 2, hull 1 x 4... (0,0)-(4,1) = 4 -> GIoU -(4 - 2) / 4
    assert giou((0, 0, 1, 1), (3, 0, 4, 1)) == pytest.approx(-0.5)
    # overlapping in x only: intersection 0.5 x 1... boxes (0,0,1,1) and (0.5,0,1.5,2): inter 0.5, union 2.5,
    # hull 1.5 x 2 = 3 -> IoU 0.2, GIoU 0.2 - 0.5 / 3
    assert giou((0, 0, 1, 1), (0.5, 0, 1.5, 2)) == pytest.approx(0.2 - 0.5 / 3)


def test_giou_penalty_thres_keeps_the_plain_iou_at_and_above_it():
    boxes = (0, 0, 1, 1), (0.5, 0, 1.5, 2)  # IoU 0.2, GIoU 0.2 - 1/6
    assert giou(*boxes, penalty_threshold=0.2) == pytest.approx(0.2)
    assert giou(*boxes, penalty_threshold=0.5) == pytest.approx(0.2 - 0.5 / 3)
    assert giou(*boxes, penalty_threshold=0.0) == pytest.approx(0.2)  # 0: IoU always


@pytest.mark.parametrize("response, reward", [
    ("<answer>[10, 20, 50, 60]</answer>", 1.0),
    ("<think>left</think><answer>The box is [10,20,50,60].</answer>", 1.0),
    ("<answer>10, 20, 50, 60</answer>", 1.0),  # four numbers, no brackets
    ("<answer>[30, 20, 70, 60]</answer>", pytest.approx(20 * 40 / (2 * 40 * 40 - 20 * 40))),  # IoU 1/3
    ("<answer>[60, 20, 100, 60]</answer>", pytest.approx(-(90 - 80) / 90 * 1.0)),  # disjoint: GIoU < 0
    ("<answer>[10, 20, 50]</answer>", 0.0),  # three numbers
    ("<answer>[50, 20, 10, 60]</answer>", 0.0),  # x2 < x1: no box
    ("<answer>[10, 20, 10, 60]</answer>", 0.0),  # empty
    ("[10, 20, 50, 60]", 0.0),  # no answer block
])
def test_bbox_giou_scores_the_answers_box_against_the_ground_truths(response, reward):
    assert bbox_giou_reward(response, "[10, 20, 50, 60]") == reward
    assert bbox_giou_reward(response, [10, 20, 50, 60]) == reward  # a list column reads the same


def test_bbox_giou_with_a_threshold_scores_good_boxes_by_their_iou_and_poor_ones_by_giou():
    near, far = "<answer>[30, 20, 70, 60]</answer>", "<answer>[0, 0, 5, 5]</answer>"  # IoU 1/3; disjoint
    assert bbox_giou_reward(near, "[10, 20, 50, 60]", giou_penalty_thres=0.3) == pytest.approx(1 / 3)
    assert bbox_giou_reward(near, "[10, 20, 50, 60]", giou_penalty_thres=0.5) == pytest.approx(1 / 3)  # hull = union
    hull = 50 * 60
    assert bbox_giou_reward(far, "[10, 20, 50, 60]", giou_penalty_thres=0.5) == pytest.approx(
        -(hull - (25 + 1600)) / hull)


def test_a_ground_truth_that_is_no_box_fails_the_episode_in_one_line():
    with pytest.raises(ValueError, match="ground truth 'left' is not a box"):
        bbox_giou_reward("<answer>[1, 2, 3, 4]</answer>", "left")
    assert read_box([1, 2, True, 4]) is None and read_box("[1, 2, 3, inf]") is None


# -- the weighted sum ----------------------------------------------------------------------------

def test_the_reward_is_the_weighted_sum_of_the_functions():
    reward = WeightedReward([{"name": "format", "weight": 0.2}, {"name": "exact_alnum", "weight": 0.8}])
    assert reward(GOOD, "3") == pytest.approx(1.0)
    assert reward("<think>x</think><answer>4</answer>", "3") == pytest.approx(0.2)
    assert reward("<answer>3</answer>", "3") == pytest.approx(0.2 * 0.75 + 0.8)
    assert reward("3", "3") == 0.0


def test_the_weights_are_normalised_to_sum_to_one():
    equal = WeightedReward([{"name": "format", "weight": 1}, {"name": "exact_alnum", "weight": 1}])
    assert equal("<answer>4</answer>", "3") == pytest.approx(0.75 / 2)
    alone = WeightedReward([{"name": "exact_alnum", "weight": 3.0}, {"name": "format", "weight": 0}])
    assert alone(GOOD, "3") == 1.0 and alone("<answer>4</answer>", "3") == 0.0


def test_the_refcoco_defaults_are_nemo_rls_box_reward():
    reward = WeightedReward(RefcocoSettings().reward_functions)
    assert reward("<think>a</think><answer>[10, 20, 50, 60]</answer>", "[10, 20, 50, 60]") == pytest.approx(1.0)
    far = reward("<answer>[0, 0, 5, 5]</answer>", "[10, 20, 50, 60]")  # format 0.75 x 0.1, GIoU below 0 x 0.9
    assert far == pytest.approx(0.1 * 0.75 + 0.9 * -(3000 - 1625) / 3000)


def test_the_environment_answers_one_turn_with_the_rows_answer_column():
    from corerl.environments.contract import EnvironmentContext, EpisodeView

    env = VLMEnvironment(EnvironmentContext(ClevrCogentSettings(), seed=0))
    turn = env.step(EpisodeView(row={"answer": "3", "images": []}, turn=1, responses=(GOOD,)))
    assert turn.done and turn.reward == pytest.approx(1.0)
    with pytest.raises(ValueError, match="the row has no 'answer' column"):
        env.step(EpisodeView(row={"solution": "3"}, turn=1, responses=(GOOD,)))


# -- refusals ------------------------------------------------------------------------------------

def _lines(functions, section="env.clevr_cogent"):
    return [e.one_line() for e in reward_function_errors(functions, section)]


def test_an_unknown_reward_function_is_refused_naming_its_key_and_the_known_ones():
    assert _lines([{"name": "format", "weight": 0.2}, {"name": "exact_alnm", "weight": 0.8}]) == [
        "env.clevr_cogent.reward_functions[1].name: 'exact_alnm' is not a reward function of the VLM environments; "
        "known: format, exact_alnum, math_expr, bbox_giou"]


@pytest.mark.parametrize("functions, line", [
    ([], "env.clevr_cogent.reward_functions: needs at least one reward function"),
    ([{"name": "format", "weight": -1}], "env.clevr_cogent.reward_functions[0].weight: must be a number >= 0, got -1"),
    ([{"name": "format", "weight": 0}], "env.clevr_cogent.reward_functions: the weights add up to 0"),
    ([{"name": "format", "wieght": 1}], "env.clevr_cogent.reward_functions[0].wieght: unknown key"),
    ([{"name": "bbox_giou", "kwargs": {"thres": 0.5}}],
     "env.clevr_cogent.reward_functions[0].kwargs.thres: bbox_giou takes no argument 'thres'; its arguments: "
     "giou_penalty_thres, answer_tag"),
    ([{"name": "bbox_giou", "kwargs": {"giou_penalty_thres": -0.5}}],
     "env.clevr_cogent.reward_functions[0].kwargs.giou_penalty_thres: expected a number >= 0, got -0.5"),
    ([{"name": "format", "kwargs": {"answer_tag": "<a>"}}],
     "env.clevr_cogent.reward_functions[0].kwargs.answer_tag: expected a tag name"),
])
def test_what_the_reward_functions_do_not_take_is_refused_in_one_line(functions, line):
    lines = _lines(functions)
    assert len(lines) == 1 and lines[0].startswith(line), lines


def _validated_in_process(capsys, *args: str) -> tuple[int, str]:
    from corerl.cli import main

    code = main(["validate", "--recipe-only", *args])
    return code, capsys.readouterr().err


def test_validate_refuses_an_unknown_reward_function_in_one_line(tmp_path, capsys):
    recipe = tmp_path / "vlm.yaml"
    recipe.write_text("policy:\n  model_name: builtin:tiny-qwen2\nalgorithm:\n  name: grpo\ndata:\n"
                      "  env_name: refcoco\nenv:\n  refcoco:\n    reward_functions:\n    - name: format\n"
                      "      weight: 0.1\n    - name: giou\n      weight: 0.9\n")
    refused_in_one_line(_validated_in_process(capsys, str(recipe)),
                        "'giou' is not a reward function of the VLM environments; known: format, exact_alnum, "
                        "math_expr, bbox_giou", key="env.refcoco.reward_functions[1].name")


# -- NeMo RL's recipes ---------------------------------------------------------------------------

@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"NeMo RL's recipes are not at {CORPUS}")
def test_nemo_rls_vlm_grpo_recipe_validates_playing_clevr_cogent(capsys):
    from corerl.config import load_config
    from corerl.plugin_manager import PluginHost

    recipe = CORPUS / "vlm_grpo_3B.yaml"
    config = load_config(recipe, [], PluginHost())
    assert config.core.data.env_name == "clevr_cogent"
    settings = config.section("env.clevr_cogent")
    assert settings.num_workers == 8
    assert [(f["name"], f["weight"]) for f in settings.reward_functions] == [("format", 0.2), ("exact_alnum", 0.8)]
    fates = {f.key: (f.fate, f.detail) for f in config.fates}
    assert fates["env.clevr-cogent.reward_functions"] == ("acts", "env.clevr_cogent.reward_functions")
    assert fates["env.refcoco.reward_functions"] == (
        "inert", "env.refcoco is not the environment the recipe plays (data.env_name: clevr-cogent)")
    code, err = _validated_in_process(capsys, str(recipe))
    assert code == 0, err
    code, err = _validated_in_process(capsys, str(recipe), "data.default.env_name=refcoco")
    assert code == 0, err
    code, err = _validated_in_process(capsys, str(recipe), "env.clevr-cogent.num_worker=2")
    assert code == 2 and "env.clevr-cogent.num_worker: a setting NeMo RL's VLM environment clevr-cogent does not " \
                         "have" in err, err


# -- the environment conformance suite -----------------------------------------------------------

class TestRefcocoConformance(EnvironmentConformance):
    environment_id = "refcoco"
    rows = [{"answer": "[10, 20, 50, 60]"}, {"answer": [0, 0, 1, 1]}]
    responses = ["<think>the left one</think> <answer>[10, 20, 50, 60]</answer>"]
    failing_rows = [{"answer": "left"}, {"solution": "[1, 2, 3, 4]"}]

    def test_a_right_box_scores_one(self, played):
        first = played[0][0]
        assert first.turns()[0].reward == pytest.approx(1.0) and math.isfinite(played[0][1].turns()[0].reward)
