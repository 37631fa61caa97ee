"""Text is never dropped silently: the built-in tokenizer reads an unknown word as ``<unk>``, and a
prompt or observation that loses text in encoding is said once (naming the task or environment)
and counted per step in ``encoding/lost_text``. In-process, no model: a scripted engine."""

from __future__ import annotations

import json
import logging

import pytest

from corerl.environments.contract import Turn
from corerl.environments.encoding import ObservationEncoder
from corerl.environments.pool import InProcessPool
from corerl.environments.rollout import MultiTurnRollout, SingleTurnRollout
from corerl.generation.contract import Sample, SamplingSettings
from corerl.models.tiny import build_tokenizer
from corerl.models.tokenizer import lost_text
from corerl.reporting.lost_text import METRIC, check_prompts, prompts_lost

SAMPLING = SamplingSettings(temperature=1.0, max_new_tokens=2, seed=1)
LOGGER = "corerl.reporting.lost_text"


@pytest.fixture
def tokenizer():
    return build_tokenizer(128)  # a new object per test: what was seen is kept per tokenizer


class Engine:
    """Generation that answers every prompt with the tokens ``w1 5``."""

    def generate(self, prompts, sampling, n=1):
        return [[Sample(prompt_ids=tuple(p), completion_ids=(22, 9), logprobs=(-0.5, -0.5), finish_reason="stop")
                 for _ in range(n)] for p in prompts]


class Guess:
    """The docs' environment: a hint in words the tiny tokenizer does not know, then done."""

    def step(self, episode):
        if episode.turn >= 2:
            return Turn(reward=1.0, done=True)
        return Turn(observation=" higher")


def test_the_tiny_tokenizer_reads_unknown_words_as_unk_and_keeps_its_ids(tokenizer):
    assert len(tokenizer.get_vocab()) == 128
    assert [tokenizer.convert_tokens_to_ids(t) for t in ("<pad>", "<unk>", "<bos>", "<eos>", "0", "w0", "<tool_call>")] \
        == [0, 1, 2, 3, 4, 21, 120]
    assert tokenizer.encode(" higher lower correct", add_special_tokens=False) == [1, 1, 1]
    assert tokenizer.encode("w0 3 :", add_special_tokens=False) == [21, 7, 18]


def test_lost_text_is_an_unknown_token_or_characters_that_do_not_read_back(tokenizer):
    def check(text, bos=False):
        ids = tokenizer.encode(text, add_special_tokens=False)
        return lost_text(tokenizer, text, [2, *ids] if bos else ids)

    assert check(" higher") and check("w0 higher :", bos=True)
    assert not check("w0 3 :", bos=True) and not check("w5   w6\n") and not check("<tool_call> w1") and not check("")
    assert not check("<unk>")  # the text spells the unknown token itself

    class Dropping:  # a tokenizer without an unknown token that drops what it cannot encode
        unk_token_id = unk_token = None
        all_special_tokens: list[str] = []

        def decode(self, ids, skip_special_tokens=False):
            return "ab"

    assert lost_text(Dropping(), "a b c", [5, 6]) and not lost_text(Dropping(), "a b", [5, 6])


def test_a_lossy_observation_is_warned_about_once_naming_the_environment_and_counted_each_step(tokenizer, caplog):
    rollout = MultiTurnRollout(Engine(), InProcessPool(Guess(), 10), ObservationEncoder(tokenizer), tokenizer, "guess")
    prompts, rows = [[2, 21, 7, 18]] * 2, [{"answer": "3"}] * 2
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        first = rollout.run(prompts, rows, SAMPLING, n=3, max_seq_length=64)
        second = rollout.run(prompts, rows, SAMPLING, n=3, max_seq_length=64)
    assert first.metrics[METRIC] == second.metrics[METRIC] == 6.0  # one observation per episode, 6 episodes
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warnings) == 1
    assert warnings[0].startswith("environment 'guess': an observation lost text in encoding ('higher' reads back "
                                  "as '<unk>')")
    assert METRIC in warnings[0]


def test_an_observation_in_known_words_counts_nothing_and_says_nothing(tokenizer, caplog):
    class Known:
        def step(self, episode):
            return Turn(reward=1.0, done=True) if episode.turn >= 2 else Turn(observation=" w5 w6")

    rollout = MultiTurnRollout(Engine(), InProcessPool(Known(), 10), ObservationEncoder(tokenizer), tokenizer, "known")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        result = rollout.run([[2, 21, 7, 18]], [{}], SAMPLING, n=2, max_seq_length=64)
    assert result.metrics[METRIC] == 0.0
    assert not [r for r in caplog.records if r.name == LOGGER]


def test_lossy_prompts_are_warned_about_once_naming_the_task_and_counted_when_drawn(tokenizer, caplog):
    texts = {"rows.jsonl line 1": "w0 3 :", "rows.jsonl line 2": "w0 higher :", "rows.jsonl line 3": "w0 lower :"}
    encoded = {label: [2, *tokenizer.encode(text, add_special_tokens=False)] for label, text in texts.items()}
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert check_prompts(tokenizer, "task 'dataset'", [(texts[k], ids, k) for k, ids in encoded.items()]) == 2
        check_prompts(tokenizer, "task 'dataset'", [(texts[k], ids, k) for k, ids in encoded.items()])
    (warning,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert warning.startswith("task 'dataset': 2 of 3 prompts lost text in encoding (the first, rows.jsonl line 2: "
                              "'higher :' reads back as '<unk> :')")
    prompts = list(encoded.values())
    assert prompts_lost(tokenizer, prompts) == 2 and prompts_lost(build_tokenizer(128), prompts) == 0
    single = SingleTurnRollout(Engine(), lambda sample, item: 0.0, tokenizer=tokenizer)
    assert single.run(prompts, [None] * 3, SAMPLING, n=2, max_seq_length=64).metrics == {METRIC: 2.0}
    assert SingleTurnRollout(Engine(), lambda sample, item: 0.0).run(prompts, [None] * 3, SAMPLING, n=1,
                                                                    max_seq_length=64).metrics == {}


def test_the_preferences_task_names_itself_when_its_pairs_lose_text(tokenizer, tmp_path, caplog):
    from corerl.config.schema import DataConfig
    from corerl.tasks import TaskContext
    from corerl.tasks.preferences import PreferenceDataset

    rows = tmp_path / "pairs.jsonl"
    lines = [{"prompt": f"w0 {d} :", "chosen": f"{d}", "rejected": "higher" if d == 2 else "9"} for d in range(6)]
    rows.write_text("".join(json.dumps(line) + "\n" for line in lines))
    data = DataConfig(task="preferences", train_files=str(rows), held_out_size=2)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        PreferenceDataset(TaskContext(tokenizer=tokenizer, seed=0, data=data))
    (warning,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert warning.startswith("task 'preferences': 1 of 18 prompts and responses lost text in encoding (the first, "
                              "pairs.jsonl line 3: 'higher' reads back as '<unk>')")


def test_a_prompt_with_a_chat_template_is_the_ids_apply_chat_template_gives(tokenizer):
    from corerl.tasks.prompts import encode_prompt

    tokenizer.chat_template = "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}<eos>"
    ids, text = encode_prompt(tokenizer, "w0 3 :", True, "w9")
    assert ids == list(tokenizer.apply_chat_template(
        [{"role": "system", "content": "w9"}, {"role": "user", "content": "w0 3 :"}], add_generation_prompt=True,
        tokenize=True, return_dict=False))
    assert text == "<system> w9 <user> w0 3 : <eos>"
    assert encode_prompt(tokenizer, "w0 3 :", False, None) == ([2, 21, 7, 18], "w0 3 :")


def test_the_dataset_task_names_itself_when_its_prompts_lose_text(tokenizer, tmp_path, caplog):
    """The issue's own case: a dataset whose prompts hold words the tiny tokenizer does not know."""
    from corerl.config.schema import DataConfig
    from corerl.tasks import TaskContext
    from corerl.tasks.dataset import DatasetTask

    rows = tmp_path / "train.jsonl"
    lines = [{"prompt": f"w0 {d} :" if d != 4 else "w0 higher :", "answer": str(d)} for d in range(8)]
    rows.write_text("".join(json.dumps(line) + "\n" for line in lines))
    data = DataConfig(task="dataset", train_files=str(rows), held_out_size=2)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        task = DatasetTask(TaskContext(tokenizer=tokenizer, seed=0, data=data))
    (warning,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert warning.startswith("task 'dataset': 1 of 8 prompts lost text in encoding (the first, train.jsonl line 5: "
                              "'higher :' reads back as '<unk> :')"), warning
    prompts = [row["_corerl_prompt_ids"] for row in [*task.train, *task.held]]
    assert prompts_lost(tokenizer, prompts) == 1
