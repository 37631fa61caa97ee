"""Bad inputs met while a run runs (data lines, rewards, prompt lengths, model paths, a diverging
loss): each stops the run in one line naming the row, the function or the step, with exit 1 or 2
and no traceback. Inputs refused before any engine starts (exit 2) are run in this process
(``corerl.cli.main``, the fast tier: about 10 s for eleven, 80 s as processes of their own); those
met by the run's steps (rewards, a diverging loss) in a ``corerl run`` process each."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import clean_env, run_corerl
from tests.refusals import refused_in_one_line

ROWS = [{"question": f"w1 {d} w{i % 7}", "answer": str(d)} for i, d in enumerate(list(range(10)) * 2)]
REWARDS = '''
import math
def explode(completion, example):
    if example["answer"] == "3":
        raise ValueError("boom")
    return 0.0
def not_a_number(completion, example):
    return "high"
def nan(completion, example):
    return math.nan
def nothing(completion, example):
    return None
def numpy_half(completion, example):
    import numpy
    return numpy.float32(0.5)
'''


def _jsonl(path: Path, rows: list[dict], broken: dict[int, str] | None = None) -> Path:
    lines = [json.dumps(r) for r in rows]
    for number, text in (broken or {}).items():
        lines[number - 1] = text
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _args(tmp_path: Path, extra: tuple[str, ...], train: Path | None) -> list[str]:
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    train = train or _jsonl(tmp_path / "train.jsonl", ROWS)
    return ["run", f"run.output_dir={tmp_path}", "run.name=bad", "policy.generation.backend=hf", "sft.enabled=false",
            "algorithm.max_steps=2", "algorithm.batch_size=4", "algorithm.num_generations_per_prompt=2",
            "checkpointing.enabled=false", "data.task=dataset", f"data.train_files={train}", "data.prompt_key=question",
            "data.held_out_size=5", *extra]


def _stderr(code: int, out: str, err: str) -> tuple[int, str]:
    """The exit status and stderr, for :func:`tests.refusals.refused_in_one_line` (one line, no
    traceback there), after checking stdout holds no traceback either and stderr no internal error."""
    assert "Traceback" not in out and "internal error" not in err, (code, out, err)
    return code, err


def _run(tmp_path: Path, *extra: str, train: Path | None = None) -> tuple[int, str]:
    """``corerl run`` on the rows, in a process of its own (the reward functions' module on its path)."""
    result = run_corerl(*_args(tmp_path, extra, train), env=clean_env({"PYTHONPATH": str(tmp_path)}))
    return _stderr(result.code, result.out, result.err)


@pytest.fixture
def refused(capfd, monkeypatch):
    """The same command in this process, for inputs refused before any engine starts (exit 2): the
    code and stderr of ``corerl.cli.main``, as its console script would end (fast tier)."""
    import corerl.reporting.quiet as quiet
    from corerl import cli

    monkeypatch.setattr(quiet, "_last_log", None)  # an error line names the log of a run this process started

    def run(tmp_path: Path, *extra: str, train: Path | None = None) -> tuple[int, str]:
        code = cli.main(_args(tmp_path, extra, train))
        captured = capfd.readouterr()
        return _stderr(code, captured.out, captured.err)

    return run


# (id, file name, line number, what that line holds, what the refusal says)
BAD_LINES = [
    ("malformed-jsonl-line", "train.jsonl", 7, '{"question": "w1 3 w2", "answer": ', "train.jsonl line 7 is not valid JSON"),
    ("line-not-an-object", "train.jsonl", 4, "[1, 2]", "train.jsonl line 4 holds a list, not a JSON object"),
    # a JSON-lines file named .json is read line by line too
    ("malformed-line-of-json-lines-named-json", "train.json", 5, '{"question": "w1 3 w2", ',
     "train.json line 5 is not valid JSON"),
]


@pytest.mark.parametrize(("name", "number", "text", "says"), [c[1:] for c in BAD_LINES], ids=[c[0] for c in BAD_LINES])
def test_a_bad_line_is_named_by_number(tmp_path, refused, name, number, text, says):
    train = _jsonl(tmp_path / name, ROWS, {number: text})
    refused_in_one_line(refused(tmp_path, train=train), says, key="data.train_files")


@pytest.mark.parametrize(("name", "text", "says"), [("train.jsonl", "\n", "holds no rows"),
                                                    ("train.json", "", "data.train_files: {train} is empty")],
                         ids=["jsonl-of-a-blank-line", "json-of-no-bytes"])
def test_an_empty_data_file_is_refused(tmp_path, refused, name, text, says):
    train = tmp_path / name
    train.write_text(text)
    refused_in_one_line(refused(tmp_path, train=train), says.format(train=train), key="data.train_files")


def test_a_reward_function_that_raises_is_named_with_the_row(tmp_path):
    line = refused_in_one_line(_run(tmp_path, "data.reward=my_rewards:explode"), key="data.reward", code=1)
    row = next(i for i, r in enumerate(ROWS, start=1) if r["answer"] == "3")
    assert line.startswith("corerl: error: data.reward: reward function explode raised ValueError: boom on ")
    assert "train.jsonl line " in line
    number = int(line.split("train.jsonl line ")[1].split()[0])
    assert "(at grpo step 1)" in line
    assert ROWS[number - 1]["answer"] == "3" and number in (row, row + 10)


@pytest.mark.parametrize("function, says", [("not_a_number", "returned 'high' (str)"), ("nan", "returned nan"),
                                            ("nothing", "returned None (NoneType)")])
def test_a_reward_that_is_not_a_finite_number_stops_the_run(tmp_path, function, says):
    refused_in_one_line(_run(tmp_path, f"data.reward=my_rewards:{function}"),
                        f"reward function {function} {says} on train.jsonl line ", key="data.reward", code=1)


def test_a_prompt_longer_than_the_sequence_allows_is_refused_with_its_row(tmp_path, refused):
    rows = [*ROWS[:12], {"question": " ".join(["w5"] * 40), "answer": "1"}, *ROWS[12:]]
    train = _jsonl(tmp_path / "train.jsonl", rows)
    result = refused(tmp_path, "policy.max_seq_length=32", "policy.generation.max_new_tokens=8", "data.held_out_size=10",
                     train=train)
    # 40 words and the beginning-of-sequence token; 31 tokens leave room for a completion in 32
    refused_in_one_line(result, "policy.max_seq_length: train.jsonl line 13: the prompt is 41 tokens",
                        "more than the 31 that leave room",
                        "prompts are not truncated: raise policy.max_seq_length by at least 10",
                        key="policy.max_seq_length")


def test_a_model_path_that_does_not_exist_is_named(tmp_path, refused):
    refused_in_one_line(refused(tmp_path, f"policy.model_name={tmp_path / 'no-such-model'}"),
                        f"policy.model_name: model path {tmp_path / 'no-such-model'} does not exist",
                        key="policy.model_name")


def test_a_nan_gradient_stops_the_run_at_its_step(tmp_path):
    result = run_corerl("run", f"run.output_dir={tmp_path}", "run.name=nan", "policy.generation.backend=hf",
                        "sft.max_steps=3", "algorithm.max_steps=2", "policy.optimizer.lr=1e30",
                        "checkpointing.enabled=false")
    assert result.code == 1, result
    (line,) = result.err.strip().splitlines()
    # lr 1e30 makes step 1's update blow up the weights: step 2's gradient is nan, and so may be its
    # loss, depending on the machine's kernels
    assert re.search(r"sft step 2: (loss nan, )?grad_norm nan; the run stopped there", line), line
    rows = (tmp_path / "nan" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in rows] == [1]  # the bad step is not logged


def test_a_prompt_too_long_anywhere_in_the_file_is_refused_before_training(tmp_path, refused):
    # one step of two prompts draws from 60 rows: only a check of every row finds row 57
    rows = [{"question": f"w1 {i % 10} w2", "answer": str(i % 10)} for i in range(60)]
    rows[56] = {"question": " ".join(["w5"] * 40), "answer": "1"}
    train = _jsonl(tmp_path / "train.jsonl", rows)
    result = refused(tmp_path, "policy.max_seq_length=32", "policy.generation.max_new_tokens=8",
                     "algorithm.max_steps=1", "algorithm.batch_size=2", train=train)
    refused_in_one_line(result, "policy.max_seq_length: train.jsonl line 57: the prompt is 41 tokens",
                        key="policy.max_seq_length")
    assert not (tmp_path / "bad" / "metrics.jsonl").exists()


def test_a_model_folder_without_weights_is_named(tmp_path, refused):
    from corerl.models.tiny import BUILTIN_MODELS, build_tiny_model

    model = tmp_path / "model"
    build_tiny_model(model, **BUILTIN_MODELS["builtin:tiny-qwen2"])
    (model / "model.safetensors").unlink()
    refused_in_one_line(refused(tmp_path, f"policy.model_name={model}"),
                        f"policy.model_name: {model} holds no weights (none of model.safetensors", key="policy.model_name")


def test_a_chat_template_asked_of_a_tokenizer_without_one_is_named(tmp_path, refused):
    line = refused_in_one_line(refused(tmp_path, "data.apply_chat_template=true"), key="data.apply_chat_template")
    assert line.startswith("corerl: error: data.apply_chat_template: data.apply_chat_template is set "
                           "and the tokenizer has no chat template")


NAN_LATER = '''
import math
calls = 0
def nan_from_step_4(completion, example):  # 10 held-out answers, then 16 samples a step
    global calls
    calls += 1
    return math.nan if calls > 10 + 3 * 16 else 0.5
'''


def _digit_echo(tmp_path: Path, name: str, *extra: str):
    """A GRPO run of the digit_echo task (hf generation, no SFT, 4 prompts a step), with the
    reward modules written into ``tmp_path`` importable."""
    return run_corerl("run", f"run.output_dir={tmp_path}", f"run.name={name}", "policy.generation.backend=hf",
                      "sft.enabled=false", "algorithm.batch_size=4", *extra,
                      env=clean_env({"PYTHONPATH": str(tmp_path)}))


def test_a_nan_reward_stops_the_run_keeping_the_last_checkpoint_and_exporting_nothing(tmp_path):
    (tmp_path / "later.py").write_text(NAN_LATER)
    result = _digit_echo(tmp_path, "nan", "algorithm.max_steps=6", "algorithm.num_generations_per_prompt=4",
                         "checkpointing.save_period=2", "data.reward=later:nan_from_step_4")
    assert result.code == 1, result
    (line,) = result.err.strip().splitlines()
    assert "data.reward: reward function nan_from_step_4 returned nan on the digit_echo prompt " in line, line
    assert "(at grpo step 4)" in line, line
    run_dir = tmp_path / "nan"
    assert [p.name for p in (run_dir / "checkpoints").iterdir() if not p.name.startswith(".")] == ["step_000002"]
    assert not (run_dir / "final").exists() and not (run_dir / "summary.json").exists()
    assert [json.loads(r)["step"] for r in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


def test_a_diverging_learning_rate_stops_the_run_keeping_the_last_checkpoint_and_exporting_nothing(tmp_path):
    result = _digit_echo(tmp_path, "lr", "algorithm.max_steps=8", "checkpointing.save_period=1",
                         "policy.optimizer.lr=1e8", "algorithm.num_generations_per_prompt=8")
    assert result.code == 1, result
    (line,) = result.err.strip().splitlines()
    assert line.startswith("corerl: error: policy.optimizer.lr: ") and "lower the learning rate" in line, line
    run_dir = tmp_path / "lr"
    done = len((run_dir / "metrics.jsonl").read_text().splitlines())
    assert 1 <= done < 8  # stopped early, at the first step that went non-finite
    assert [p.name for p in (run_dir / "checkpoints").iterdir() if not p.name.startswith(".")] == [f"step_{done:06d}"]
    assert not (run_dir / "final").exists() and not (run_dir / "summary.json").exists()


def test_a_numpy_number_is_a_reward(tmp_path):
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    result = _digit_echo(tmp_path, "np", "algorithm.max_steps=1", "algorithm.num_generations_per_prompt=2",
                         "checkpointing.enabled=false", "data.reward=my_rewards:numpy_half")
    assert result.code == 0, result
    assert json.loads((tmp_path / "np" / "metrics.jsonl").read_text())["reward/mean"] == 0.5


def test_a_row_without_the_answer_column_is_refused_with_its_line(tmp_path, refused):
    rows = [dict(r) for r in ROWS]
    del rows[8]["answer"]
    refused_in_one_line(refused(tmp_path, train=_jsonl(tmp_path / "train.jsonl", rows)),
                        "data.train_files: train.jsonl line 9 has no 'answer' (data.answer_key)", key="data.train_files")
