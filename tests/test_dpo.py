"""DPO end to end: the preference tasks, the demo recipe through the CLI, the two ways of
getting the reference's logprobs, and resuming."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import attrs
import datasets
import pytest

from corerl.config.schema import DataConfig
from corerl.errors import ConfigError
from corerl.models.tiny import build_tokenizer
from corerl.tasks import TaskContext
from corerl.tasks.preferences import DigitPreference, PreferenceDataset, PreferenceSource
from tests.conftest import CORERL, EXAMPLES, REPO, clean_env, run_corerl, wait_for_marker

# roles as words of the tiny vocabulary: w2 user, w3 assistant
CHAT = ("{% for m in messages %}<bos> {{ 'w3' if m['role'] == 'assistant' else 'w2' }} : {{ m['content'] }} <eos> "
        "{% endfor %}{% if add_generation_prompt %}<bos> w3 : {% endif %}")
ROWS = [{"q": f"w1 {d}", "good": f"{d} {d}", "bad": f"{(d + 1) % 10}", "id": i} for i, d in enumerate(range(10))]


def _write(path, rows):
    if path.suffix == ".parquet":
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _task(path, tokenizer=None, **data):
    values = {"prompt_key": "q", "chosen_key": "good", "rejected_key": "bad", "held_out_size": 2, **data,
              "train_files": str(path)}
    return PreferenceDataset(TaskContext(tokenizer or build_tokenizer(), seed=3,
                                         data=attrs.evolve(DataConfig(), **values), max_prompt_tokens=15))


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_the_preferences_task_reads_text_pairs_and_keeps_a_held_out_split(tmp_path, suffix):
    task = _task(_write(tmp_path / f"pairs{suffix}", ROWS))
    assert isinstance(task, PreferenceSource)
    train, held = task.train_pairs(), task.held_out_pairs()
    assert len(train) == 8 and len(held) == 2
    tok = build_tokenizer()
    prompt, chosen, rejected = train[0]
    assert prompt[0] == tok.bos_token_id and chosen[-1] == rejected[-1] == tok.eos_token_id
    digit = tok.decode(prompt[2:])
    assert tok.decode(chosen[:-1]) == f"{digit} {digit}" and tok.decode(rejected[:-1]) == str((int(digit) + 1) % 10)
    drawn = task.draw(12)  # shuffled epochs: the first 8 are each pair once
    assert sorted(drawn[:8]) == list(range(8))
    state = task.state()
    again = task.draw(5)
    task.set_state(json.loads(json.dumps(state)))
    assert task.draw(5) == again


def test_the_preferences_task_accepts_chat_messages(tmp_path):
    tok = build_tokenizer()
    tok.chat_template = CHAT
    rows = [{"q": [{"role": "user", "content": f"w1 {d}"}], "good": [{"role": "assistant", "content": f"{d}"}],
             "bad": [{"role": "assistant", "content": "0"}]} for d in range(1, 9)]
    task = _task(_write(tmp_path / "chat.jsonl", rows), tok)
    prompt, chosen, rejected = task.train_pairs()[0]
    assert tok.decode(prompt).split()[-3:] == ["<bos>", "w3", ":"]  # the generation prompt ends the prompt
    assert tok.decode(rejected).split() == ["0", "<eos>"]  # what the conversation adds after the prompt


@pytest.mark.parametrize("rows, data, words", [
    (ROWS, {"chosen_key": "nope"}, "column 'nope' (data.chosen_key)"),
    ([{**r, "good": [{"role": "assistant", "content": "1"}]} for r in ROWS], {}, "no chat template"),
    ([{**r, "good": " ".join(["1"] * 20)} for r in ROWS], {}, "policy.max_seq_length"),
])
def test_bad_preference_rows_are_refused_in_one_line_naming_the_row_or_key(tmp_path, rows, data, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        _task(_write(tmp_path / "pairs.jsonl", rows), **data)


def test_digit_preference_holds_out_combinations_training_never_shows():
    task = DigitPreference(TaskContext(build_tokenizer(), seed=7, data=DataConfig()))
    train, held = task.train_pairs(), task.held_out_pairs()
    assert len(train) == 72 and len(held) == 18
    assert not {tuple(map(tuple, p)) for p in train} & {tuple(map(tuple, p)) for p in held}
    for prompt, chosen, rejected in train + held:
        assert chosen[0] == prompt[2] != rejected[0] and len(chosen) == len(rejected)


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_dpo_demo_raises_held_out_preference_accuracy_by_30_points(tmp_path):
    result = run_corerl("run", str(EXAMPLES / "dpo_demo.yaml"), f"run.output_dir={tmp_path}", "run.name=demo")
    assert result.code == 0, result
    run_dir = tmp_path / "demo"
    summary = json.loads((run_dir / "summary.json").read_text())
    gain = summary["held_out_preference_accuracy_after"] - summary["held_out_preference_accuracy_before"]
    assert gain >= 0.30, summary
    assert summary["generation_backend"] is None and summary["dpo_steps"] == 100
    rows = _metrics(run_dir)
    assert {"rewards/chosen", "rewards/rejected", "rewards/margin", "preference_accuracy"} <= set(rows[-1])
    assert rows[-1]["rewards/margin"] > rows[0]["rewards/margin"]
    assert (run_dir / "curves.png").exists() and any((run_dir / "tensorboard").iterdir())
    assert (run_dir / "reference_logprobs" / "scores.safetensors").exists()
    assert "held-out preference accuracy:" in result.out and "vllm" not in result.out


def test_a_frozen_reference_copy_gives_the_precomputed_reference_s_steps(tmp_path):
    args = [str(EXAMPLES / "dpo_demo.yaml"), f"run.output_dir={tmp_path}", "algorithm.max_steps=4",
            "checkpointing.enabled=false", "run.tensorboard=false"]
    runs = {}
    for name, precompute in (("table", "true"), ("copy", "false")):
        result = run_corerl("run", *args, f"run.name={name}", f"algorithm.dpo.precompute_reference_logprobs={precompute}")
        assert result.code == 0, result
        runs[name] = _metrics(tmp_path / name)
    assert not (tmp_path / "copy" / "reference_logprobs").exists()
    assert abs(runs["table"][0]["loss"] - 0.6931472) < 1e-5  # the policy is its reference at step 1: log 2
    for ours, theirs in zip(runs["table"], runs["copy"], strict=True):
        for key in ("loss", "rewards/margin", "grad_norm"):
            assert abs(ours[key] - theirs[key]) <= 1e-5 * max(1.0, abs(theirs[key])), (key, ours, theirs)


def test_a_killed_dpo_run_resumes_with_the_reference_it_started_with(tmp_path):
    args = [str(EXAMPLES / "dpo_demo.yaml"), f"run.output_dir={tmp_path}", "checkpointing.save_period=3",
            "run.tensorboard=false", "algorithm.max_steps=6"]
    straight = run_corerl("run", *args, "run.name=straight")
    assert straight.code == 0, straight
    markers = tmp_path / "markers"  # killed after step 4: the step-3 checkpoint and the reference table are on disk
    proc = subprocess.Popen([str(CORERL), "run", *args, "run.name=killed"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=REPO,
                            env=clean_env({"CORERL_PROGRESS_MARKERS": str(markers), "CORERL_TEST_HOLD_AT": "dpo:step:4"}))
    wait_for_marker(markers, "dpo:step:4", proc, seconds=240)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    resumed = run_corerl("run", *args, "run.name=killed")
    assert resumed.code == 0 and "resuming from step 3" in resumed.out, resumed
    assert "reference: scored" not in resumed.out  # read back, not rescored with moved weights
    ours, theirs = _metrics(tmp_path / "killed"), _metrics(tmp_path / "straight")
    assert [r["step"] for r in ours] == list(range(1, 7))
    for a, b in zip(ours, theirs, strict=True):
        assert abs(a["loss"] - b["loss"]) <= 1e-6 and abs(a["rewards/margin"] - b["rewards/margin"]) <= 1e-6
