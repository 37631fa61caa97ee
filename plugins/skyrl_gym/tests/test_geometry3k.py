"""The ``geometry3k`` environment (SkyRL's Geometry-3K example, written here): its answers scored as
the example scores them (right, wrong, unparsable, a wrong answer retried, the last turn), its
grading checked against the example's own grader where SkyRL's corpus is beside this checkout, the
launch scripts read as corerl recipes, and one GRPO step of a tiny vision-language model built in
code on a Parquet file laid out as the example's geometry_3k_dataset.py writes it."""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import os
from pathlib import Path

import pytest
import skyrl_gym

from corerl_skyrl_gym.boxed_math import grade_boxed
from corerl_skyrl_gym.geometry3k import Geometry3kEnv, score_answer, tool_call_of
from tests.skyrl_gym_episodes import play, registered_as_its_entry_point

ENTRY = "corerl_skyrl_gym.geometry3k:Geometry3kEnv"
REPO = Path(__file__).resolve().parents[3]
CORPUS = Path(os.environ.get("CORERL_SKYRL_CORPUS") or REPO.parent / "shared" / "skyrl")


def calc(answer) -> str:
    return f'I think so. <tool_call>{{"name": "calc_score", "arguments": {{"answer": {json.dumps(answer)}}}}}</tool_call>'


def data_url(image) -> str:
    """A PIL image as the dataset script stores it: a JPEG data URL."""
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="JPEG")
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def geometry_row(answer="12", question="Find x.", image=None, split="train", index=0):
    """A row as geometry_3k_dataset.py writes it: the diagram(s) as image_url parts, then the question."""
    content = [] if image is None else [{"type": "image_url", "image_url": {"url": data_url(image)}}]
    content.append({"type": "text", "text": question})
    return {"prompt": [{"role": "user", "content": content}], "env_class": "geometry3k",
            "reward_spec": {"method": "rule", "ground_truth": answer},
            "extra_info": {"split": split, "index": index, "problem": question, "answer": answer}}


@pytest.fixture
def environment():
    """The adapter with geometry3k registered as the entry point registers it; deregistered after."""
    yield from registered_as_its_entry_point("geometry3k", ENTRY)


def test_a_right_calc_score_ends_the_episode_with_one(environment):
    (turn,) = play(environment, geometry_row("2\\sqrt{3}"), [calc("2\\sqrt3")])
    assert turn.done and turn.reward == 1.0


def test_a_wrong_answer_is_told_and_retried_and_the_turn_before_the_last_warns(environment):
    turns = play(environment, geometry_row("12"), [calc("10"), calc("11"), "So the answer is \\boxed{12}."])
    assert [(t.reward, t.done) for t in turns] == [(0.0, False), (0.0, False), (1.0, True)]
    first, second = turns[0].observation[0]["content"], turns[1].observation[0]["content"]
    assert turns[0].observation[0]["role"] == "user" and "calc_score result: 0.0" in first and "'10'" in first
    assert "one answer left" not in first and "one answer left" in second  # turn 2 of 3: the next answer is final
    assert sum(t.reward for t in turns) == 1.0  # corerl's episode reward: the turns' sum


def test_the_last_turn_scores_a_wrong_calc_score_zero_and_ends(environment):
    turns = play(environment, geometry_row("12"), [calc("10")] * 5)
    assert len(turns) == 3 and [t.reward for t in turns] == [0.0, 0.0, 0.0] and turns[-1].done
    assert turns[-1].observation is None or turns[-1].observation == []
    one = play(environment, {**geometry_row("12"), "max_turns": 1}, [calc("10")])
    assert len(one) == 1 and one[0].done and one[0].reward == 0.0


def test_a_turn_without_a_tool_call_is_the_final_answer(environment):
    right = play(environment, geometry_row("\\frac{40}{3}"), ["so x = 40/3\nAnswer: \\boxed{\\dfrac{40}{3}}"])
    assert [(t.reward, t.done) for t in right] == [(1.0, True)]
    last_line = play(environment, geometry_row("60"), ["reasoning...\n\n60^\\circ\n  "])
    assert [(t.reward, t.done) for t in last_line] == [(1.0, True)]  # no box: the last non-empty line
    wrong = play(environment, geometry_row("60"), ["it is \\boxed{30}"])
    assert [(t.reward, t.done) for t in wrong] == [(0.0, True)]


def test_an_unparsable_tool_call_is_read_as_a_final_answer_and_other_calls_are_retried(environment):
    # JSON that does not parse: no tool call, so the turn's last line is the (unparsable) answer
    broken = play(environment, geometry_row("12"), ['<tool_call>{"name": "calc_score", "arguments": {answer: 12}}'
                                                    '</tool_call>'])
    assert [(t.reward, t.done) for t in broken] == [(0.0, True)]
    turns = play(environment, geometry_row("12"), ['<tool_call>{"name": "calculator", "arguments": {"x": 1}}</tool_call>',
                                                   '<tool_call>{"name": "calc_score", "arguments": {}}</tool_call>',
                                                   calc("12")])
    assert [(t.reward, t.done) for t in turns] == [(0.0, False), (0.0, False), (1.0, True)]
    assert "no tool `calculator`" in turns[0].observation[0]["content"]
    assert "no `answer`" in turns[1].observation[0]["content"]
    # on the last turn such a call ends the episode without a message
    (last,) = play(environment, {**geometry_row("12"), "max_turns": 1}, ['<tool_call>{"name": "x"}</tool_call>'])
    assert last.done and last.reward == 0.0 and not last.observation


def test_tool_calls_are_read_in_each_form_the_example_takes():
    assert tool_call_of('<tool_call>{"function": {"name": "calc_score", "arguments": "{\\"answer\\": \\"3\\"}"}}'
                        '</tool_call>') == ("calc_score", {"answer": "3"})
    assert tool_call_of(calc("1") + " then " + calc("2")) == ("calc_score", {"answer": "2"})  # the last one
    assert tool_call_of('<tool_call>{"arguments": {"answer": "2"}}</tool_call>') is None  # no name
    assert tool_call_of('<tool_call>{"name": "calc_score", "arguments": "not json"}</tool_call>') is None
    assert tool_call_of("no call here") is None


@pytest.mark.parametrize(("answer", "truth", "right"), [
    ("12", "12", True), ("12.0", "12", True), ("x = 12", "12", True), ("12 cm", "12", True),
    ("60^\\circ", "60", True), ("2\\sqrt{3}", "2\\sqrt3", True), ("\\sqrt{12}", "2\\sqrt{3}", True),
    ("\\frac{40}{3}", "40/3", True), ("\\dfrac{1}{2}", "0.5", True), ("\\boxed{7}", "7", True),
    ("13.33", "\\frac{40}{3}", False), ("4/8", "1/2", False), ("11", "12", False), ("", "12", False),
    ("\\frac{", "12", False), ("x^{2}", "x^2", True), ("2^{10}", "1024", False),
])
def test_answers_are_graded_as_mathematics(answer, truth, right):
    assert score_answer(answer, truth) == (1.0 if right else 0.0)


def test_a_row_without_the_truth_is_refused():
    with pytest.raises(ValueError, match="reward_spec.ground_truth"):
        Geometry3kEnv(extras={"reward_spec": {"method": "rule"}})


def _skyrl_grader():
    path = CORPUS / "examples" / "train" / "geometry3k" / "math_utils.py"
    if not path.is_file():
        pytest.skip(f"SkyRL's corpus is not at {CORPUS} (set CORERL_SKYRL_CORPUS)")
    spec = importlib.util.spec_from_file_location("skyrl_geometry3k_math_utils", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.grade_answer_from_boxed


def test_grading_agrees_with_the_examples_own_grader():
    """Each pair graded by this package and by the example's math_utils (run, not copied)."""
    theirs = _skyrl_grader()
    answers = ["12", "12.0", "12.5", "x=12", "AB = 12", "12 cm", "12\\text{ units}", "\\text{12}", "60^\\circ",
               "60^{\\circ}", "2\\sqrt{3}", "2\\sqrt3", "\\sqrt{12}", "2 \\sqrt 3", "\\frac{40}{3}", "\\dfrac{40}{3}",
               "\\frac40{3}", "40/3", "13.33", "0.5", ".5", "\\frac{1}{2}", "1/2", "2/4", "(1, 2)", "[1,2)",
               "(2,1)", "1,000", "1000", "\\frac{", "\\sqrt", "3\\pi", "3 \\pi", "9.42", "x^{2}", "3 and 4",
               "3, 4", "\\left( 3 \\right)", "7 1/2", "7.5", "-3", "- 3", "", "\\boxed{5}", "abc", "2 \\times 6",
               "\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}", "10%", "12 degrees", "1 million"]
    truths = ["12", "2\\sqrt{3}", "\\frac{40}{3}", "0.5", "(1,2)", "1000", "3\\pi", "\\frac{\\sqrt{3}}{2}",
              "7\\frac{1}{2}", "-3", "\\boxed{12}", "10", "x^2"]
    for truth in truths:
        for answer in answers:
            for solution in (f"\\boxed{{{answer}}}", f"so {answer}"):
                assert grade_boxed(solution, truth) == theirs(solution, truth), (solution, truth)


def _script_config(script: str):
    from corerl.config import load_config
    from corerl.plugin_manager import PluginHost

    path = CORPUS / "examples" / "train" / "geometry3k" / script
    if not path.is_file():
        pytest.skip(f"SkyRL's corpus is not at {CORPUS} (set CORERL_SKYRL_CORPUS)")
    environ = {"HOME": "/home/someone", "PATH": "/usr/bin", "DATA_DIR": "/data/g3k", "NUM_GPUS": "8"}
    return load_config(str(path), [], PluginHost(), [], "skyrl", environ=environ)


@pytest.mark.parametrize("script", ["run_geometry3k.sh", "run_geometry3k_lora.sh"])
def test_the_launch_scripts_play_this_packages_geometry3k_on_their_vision_language_model(script):
    config = _script_config(script)
    gym = config.section("env.skyrl_gym")
    assert gym.register == {"geometry3k": ENTRY} and gym.env_class == "geometry3k" and gym.max_turns is None
    core = config.core
    assert core.data.env_name == "skyrl_gym" and core.algorithm.max_rollout_turns == 3
    assert core.policy.model_name == "Qwen/Qwen3-VL-8B-Instruct"
    assert core.data.train_files == ["/data/g3k/train.parquet"]


def _grpo_step(folder: Path, truths: list[str], monkeypatch) -> tuple[dict, dict[str, list[str]]]:
    """One GRPO step of the tiny Qwen2.5-VL on eight rows written as geometry_3k_dataset.py writes
    them (a 56x56 diagram as a JPEG data URL, then the question; the datasets library's
    to_parquet), each episode played by geometry3k registered as the entry point registers it.
    Returns the step's metrics and, per truth, the answers the model gave (the environment's own
    step, watched)."""
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    from corerl.config import config_from_mapping
    from corerl.plugin_manager import PluginHost
    from corerl.testing.algorithm_conformance import started_algorithm

    colours = [(255, 0, 0), (0, 0, 255), (0, 255, 0), (255, 255, 0)]
    rows = [geometry_row(truth, "what is the answer ?", Image.new("RGB", (56, 56), colours[i % 4]), index=i)
            for i, truth in enumerate(truths)]
    folder.mkdir()
    datasets.Dataset.from_list(rows).to_parquet(str(folder / "train.parquet"))
    answers: dict[str, list[str]] = {}
    step = Geometry3kEnv.step

    def watched(env, action):
        answers.setdefault(env.truth, []).append(action)
        return step(env, action)

    monkeypatch.setattr(Geometry3kEnv, "step", watched)
    recipe = {
        "cluster": {"gpus_per_node": 1},
        "policy": {"model_name": "builtin:tiny-vl", "precision": "float32", "max_seq_length": 96,
                   "generation": {"backend": "hf", "max_new_tokens": 1, "temperature": 1.0},
                   "optimizer": {"lr": 1.0e-3}, "sequence_packing": {"enabled": False}},
        "algorithm": {"name": "grpo", "batch_size": 2, "num_generations_per_prompt": 4, "max_steps": 1,
                      "max_rollout_turns": 3, "seed": 3},
        "data": {"task": "dataset", "train_files": str(folder / "train.parquet"), "held_out_size": 2,
                 "env_name": "skyrl_gym", "answer_key": "reward_spec.ground_truth"},  # as the SkyRL dialect sets it
        "env": {"skyrl_gym": {"env_class": "gsm8k", "register": {"geometry3k": ENTRY}}},  # the rows' env_class wins
        "run": {"output_dir": str(folder), "name": "geometry3k", "tensorboard": False},
    }
    host = PluginHost(env={})
    try:
        with started_algorithm(config_from_mapping(recipe, host), host) as (context, algorithm):
            algorithm.begin()
            metrics = algorithm.step()
    finally:
        skyrl_gym.envs.registration.deregister("geometry3k")
        monkeypatch.undo()
    return metrics, answers


def test_one_grpo_step_trains_a_tiny_vision_language_model_through_the_environment(tmp_path, monkeypatch):
    """End to end in this process: the Parquet rows read by the dataset task with the tiny
    Qwen2.5-VL's image processor, each episode answered by geometry3k through the adapter, one GRPO
    step trained on its rewards; the training forward reads the images generation saw. The
    untrained model writes one word a turn and no tool call, so each turn is its final answer: a
    first run (truths no word matches: every reward 0, nothing to learn) shows what it answers, and
    the same run again, each row's truth now one of those answers, scores that sample 1.0 and the
    others 0.0, which GRPO trains on."""
    unreachable = [f"row{i}" for i in range(8)]
    metrics, answers = _grpo_step(tmp_path / "first", unreachable, monkeypatch)
    assert metrics["optimizer_step"] == 1.0 and metrics.get("env/failures", 0.0) == 0.0
    assert metrics["reward/max"] == 0.0 and metrics["grad_norm"] == 0.0
    assert metrics["env/turns"] == 1.0 and metrics["env/stop/done"] == 1.0  # no tool call: the answer is final
    assert metrics["logprob_mismatch/max"] < 1e-4  # training saw the images generation saw
    played = {truth: [a for a in said if a.strip()] for truth, said in answers.items()}
    assert len(played) == 2 and all(len(said) == 4 for said in answers.values())  # two prompts, four samples each
    truths = [played[t][0] if played.get(t) else t for t in unreachable]
    metrics, answers = _grpo_step(tmp_path / "again", truths, monkeypatch)
    assert sorted(answers) == sorted(t for t in truths if t not in unreachable)  # the same rows, the same answers
    assert 0.0 < metrics["reward/mean"] < 1.0 and metrics["reward/max"] == 1.0
    assert metrics["grad_norm"] > 0.0 and metrics.get("env/failures", 0.0) == 0.0
