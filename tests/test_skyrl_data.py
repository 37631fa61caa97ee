"""SkyRL's data files read as they are (issue 75): the Parquet layout its example dataset scripts
write (``prompt`` as chat messages, ``env_class``, ``reward_spec`` with the ``ground_truth``,
``extra_info``, ``data_source``), through ``data.task=dataset`` with
``data.answer_key=reward_spec.ground_truth``: the prompt is the chat-templated conversation, the
rewards read the ground truth, environments and rewards see every column as read, a file in the
wrong layout is refused in one line naming the file, the row and the key, and a short GRPO run
trains on such a file. In this process (fast tier)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corerl import cli
from corerl.config.schema import DataConfig
from corerl.errors import ConfigError
from corerl.generation.contract import Sample
from corerl.models.tiny import build_tokenizer
from corerl.tasks import TaskContext
from corerl.tasks.dataset import DatasetTask
from tests.refusals import refused_in_one_line

#: a chat template over the tiny vocabulary that writes each role as its own word (system w20,
#: user w21, assistant w22), so a prompt shows which message each text came from
TEMPLATE = ("{% set names = {'system': 'w20', 'user': 'w21', 'assistant': 'w22'} %}"
            "{% for m in messages %}<bos> {{ names[m['role']] }} : {{ m['content'] }} <eos> {% endfor %}"
            "{% if add_generation_prompt %}<bos> w22 :{% endif %}")
SYSTEM = {"role": "system", "content": "w9 w9"}  # multiply_dataset.py's rows start with a system message


def skyrl_row(index: int, split: str = "train", system: bool = False) -> dict[str, object]:
    """A row as SkyRL's gsm8k_dataset.py writes it (the question in the tiny vocabulary)."""
    digit = index % 10
    question = f"w1 {digit} w{index % 5}"
    return {
        "data_source": "openai/gsm8k",
        "prompt": [*([SYSTEM] if system else []), {"role": "user", "content": f"{question} ?"}],
        "env_class": "gsm8k",
        "reward_spec": {"method": "rule", "ground_truth": str(digit)},
        "extra_info": {"split": split, "index": index, "answer": f"w3 #### {digit}", "question": question},
    }


def write_parquet(path: Path, rows: list[dict[str, object]]) -> Path:
    """``rows`` as one Parquet table, struct and list-of-struct columns as pyarrow infers them (the
    layout ``datasets.Dataset.to_parquet`` writes for SkyRL's scripts)."""
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture
def tokenizer():
    tok = build_tokenizer(128)
    tok.chat_template = TEMPLATE
    return tok


def _task(tokenizer, train: Path, **data: object) -> DatasetTask:
    settings = {"prompt_key": "prompt", "answer_key": "reward_spec.ground_truth", "apply_chat_template": True,
                "held_out_size": 2, "shuffle": False, **data}
    return DatasetTask(TaskContext(tokenizer, 0, DataConfig(task="dataset", train_files=str(train), **settings)))


def _completion(tokenizer, text: str) -> Sample:
    ids = tuple(tokenizer.encode(text, add_special_tokens=False)) + (tokenizer.eos_token_id,)
    return Sample(prompt_ids=(), completion_ids=ids, logprobs=(0.0,) * len(ids), finish_reason="stop")


def test_a_conversation_prompt_is_chat_templated_and_rewards_read_the_ground_truth(tokenizer, tmp_path):
    rows = [skyrl_row(i, system=i % 3 == 0) for i in range(8)]
    task = _task(tokenizer, write_parquet(tmp_path / "train.parquet", rows))
    prompts, examples = task.sample(6)
    held, held_examples = task.held_out()
    seen = {e["extra_info"]["index"]: (p, e) for p, e in zip([*prompts, *held], [*examples, *held_examples], strict=True)}
    assert sorted(seen) == list(range(8))
    # the conversation, each message under its role, then the model's turn (a system message where the row has one)
    prompt, example = seen[3]
    assert prompt == tokenizer.encode("<bos> w20 : w9 w9 <eos> <bos> w21 : w1 3 w3 ? <eos> <bos> w22 :",
                                      add_special_tokens=False)
    prompt, example = seen[4]
    assert prompt == tokenizer.encode("<bos> w21 : w1 4 w4 ? <eos> <bos> w22 :", add_special_tokens=False)
    # the row as rewards and environments see it: every column as read, structs as nested dicts
    assert dict(example) == rows[4] and type(example["reward_spec"]) is dict and type(example["extra_info"]) is dict
    from corerl.environments.rollout import clean_row  # what EpisodeView.row is for a dataset row

    assert clean_row(example) == rows[4]
    # the built-in exact_answer reads data.answer_key's path: the ground truth, not extra_info.answer
    assert task.reward(_completion(tokenizer, "4"), example) == 1.0
    assert task.reward(_completion(tokenizer, "5"), example) == 0.0
    # SFT demonstrations answer with the same path (data.response_key unset)
    (pair_prompt, response), = task.demonstrations(1)
    assert tokenizer.decode(response, skip_special_tokens=True).strip() in {str(d) for d in range(10)}


def test_string_prompts_beside_a_struct_answer_and_a_system_prompt_file(tokenizer, tmp_path):
    """A text prompt goes through the template as the user's message, as it always did; the system
    prompt file comes before a conversation as before a text."""
    (tmp_path / "system.txt").write_text("w8")
    rows = [{"question": f"w1 {i}", "reward_spec": {"ground_truth": str(i)}} for i in range(4)]
    task = _task(tokenizer, write_parquet(tmp_path / "text.parquet", rows), prompt_key="question",
                 system_prompt_file=str(tmp_path / "system.txt"), held_out_size=1)
    (prompt,), (example,) = task.sample(1)
    assert prompt == tokenizer.encode(f"<bos> w20 : w8 <eos> <bos> w21 : {example['question']} <eos> <bos> w22 :",
                                      add_special_tokens=False)
    chats = _task(tokenizer, write_parquet(tmp_path / "chat.parquet", [skyrl_row(i) for i in range(4)]),
                  system_prompt_file=str(tmp_path / "system.txt"), held_out_size=1)
    (prompt,), (example,) = chats.sample(1)
    question = example["extra_info"]["question"]
    assert prompt == tokenizer.encode(f"<bos> w20 : w8 <eos> <bos> w21 : {question} ? <eos> <bos> w22 :",
                                      add_special_tokens=False)


def _row3(**changes: object):
    """Eight rows, the third changed."""
    def rows() -> list[dict[str, object]]:
        made = [skyrl_row(i) for i in range(8)]
        made[2] = {**made[2], **changes}
        return made

    return rows


def _every_row(**changes: object):
    """Eight rows, each changed (a struct field missing from the whole file, as pyarrow writes it)."""
    return lambda: [{**skyrl_row(i), **changes} for i in range(8)]


# (id, the rows, data settings besides SKYRL's, the key, what the one line says)
BAD = [
    ("message-without-content", _row3(prompt=[{"role": "user"}]), {}, "data.prompt_key",
     ["train.parquet row 3: message 0 of column 'prompt' (data.prompt_key) has no 'content' (it holds: role)"]),
    ("message-without-role", _row3(prompt=[SYSTEM, {"content": "w1 2 ?"}]), {}, "data.prompt_key",
     ["train.parquet row 3: message 1 of column 'prompt' (data.prompt_key) has no 'role' (it holds: content)"]),
    ("no-messages", _row3(prompt=[]), {}, "data.prompt_key",
     ["train.parquet row 3: column 'prompt' (data.prompt_key) holds no messages"]),
    ("spec-without-ground-truth", _every_row(reward_spec={"method": "rule", "target": "2"}), {}, "data.answer_key",
     ["train.parquet row 1: column 'reward_spec' has no field 'ground_truth' (it holds: method, target), which "
      "data.answer_key=reward_spec.ground_truth reads"]),
    ("null-ground-truth", _row3(reward_spec={"method": "rule", "ground_truth": None}), {}, "data.train_files",
     ["train.parquet row 3 has no 'reward_spec.ground_truth' (data.answer_key)"]),
    ("no-such-column", _row3(), {"answer_key": "reward_model.ground_truth"}, "data.answer_key",
     ["column 'reward_model' (data.answer_key=reward_model.ground_truth) is not in ",
      "columns: data_source, env_class, extra_info, prompt, reward_spec"]),
]


@pytest.fixture
def corerl(capfd, monkeypatch, tmp_path):
    """``corerl <command> <overrides>`` in this process: its exit status and stderr."""
    import corerl.reporting.quiet as quiet

    monkeypatch.chdir(tmp_path)

    def command(*argv: str) -> tuple[int, str]:
        monkeypatch.setattr(quiet, "_last_log", None)
        code = cli.main(list(argv))
        return code, capfd.readouterr().err

    return command


@pytest.mark.parametrize(("rows", "data", "key", "says"), [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_a_file_in_the_wrong_layout_is_refused_in_one_line(corerl, tokenizer, tmp_path, rows, data, key, says):
    from corerl.testing import write_recipe

    train = write_parquet(tmp_path / "train.parquet", rows())
    recipe = write_recipe(tmp_path / "skyrl.yaml", {
        "policy": {"model_name": "builtin:tiny-qwen2", "chat_template": TEMPLATE, "generation": {"backend": "hf"}},
        "sft": {"enabled": False},
        "data": {"task": "dataset", "train_files": str(train), "prompt_key": "prompt",
                 "answer_key": "reward_spec.ground_truth", "apply_chat_template": True, **data},
    })
    # corerl validate (and corerl run, which checks the same before it writes anything): exit 2, one line
    refused_in_one_line(corerl("validate", str(recipe)), *says, key=key)
    with pytest.raises(ConfigError) as refused:  # the task itself, as a run makes it
        _task(tokenizer, train, **data)
    assert refused.value.key == key and all(text in str(refused.value) for text in says), str(refused.value)


def test_a_conversation_the_template_cannot_render_is_refused_naming_the_row(tmp_path):
    tok = build_tokenizer(128)
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'system' %}"
                         "{{ raise_exception('System role not supported') }}{% endif %}{{ m['content'] }} {% endfor %}")
    rows = [skyrl_row(i, system=i == 5) for i in range(8)]
    with pytest.raises(ConfigError) as refused:
        _task(tok, write_parquet(tmp_path / "train.parquet", rows))
    line = str(refused.value)
    assert refused.value.key == "data.prompt_key" and "\n" not in line
    assert line.startswith("data.prompt_key: train.parquet row 6: the chat template cannot render the prompt's "
                           "conversation (roles: system, user): TemplateError: System role not supported"), line


def test_grpo_trains_on_a_skyrl_parquet_file(tmp_path):
    """Two GRPO steps on SkyRL-layout train and validation files: the reward reads each row's
    reward_spec.ground_truth (1 when the completion says it), some groups score apart, and the
    policy takes gradient steps on them."""
    import corerl

    train = write_parquet(tmp_path / "train.parquet", [skyrl_row(i, system=i % 4 == 0) for i in range(16)])
    val = write_parquet(tmp_path / "validation.parquet", [skyrl_row(i, "test") for i in range(100, 104)])
    scored: list[tuple[str, float]] = []

    def says_the_ground_truth(completion: str, example: dict) -> float:
        truth = example["reward_spec"]["ground_truth"]
        assert example["env_class"] == "gsm8k" and truth == str(example["extra_info"]["index"] % 10), example
        scored.append((example["extra_info"]["split"], float(truth in completion.split())))
        return scored[-1][1]

    result = corerl.GRPOTrainer({
        "policy": {"model_name": "builtin:tiny-qwen2", "chat_template": TEMPLATE, "max_seq_length": 48,
                   "generation": {"backend": "hf", "max_new_tokens": 16}, "optimizer": {"lr": 3e-3},
                   "train_micro_batch_size": 64},
        "algorithm": {"max_steps": 2, "batch_size": 4, "num_generations_per_prompt": 4},
        "data": {"task": "dataset", "train_files": str(train), "held_out_files": str(val), "prompt_key": "prompt",
                 "answer_key": "reward_spec.ground_truth", "apply_chat_template": True},
        "run": {"output_dir": str(tmp_path), "name": "skyrl"},
    }, reward_fn=says_the_ground_truth).train()
    metrics = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["phase"] for m in metrics] == ["grpo", "grpo"], metrics
    # 2 steps x 16 completions of training rows, the 4 validation rows evaluated before and after
    assert sorted(split for split, _ in scored) == ["test"] * 8 + ["train"] * 32
    trained = [value for split, value in scored if split == "train"]
    assert sum(m["reward/mean"] for m in metrics) * 16 == sum(trained) > 0  # the metrics are those rewards
    assert max(m["grad_norm"] for m in metrics) > 0  # rewards that differ within a group: the policy moves


def test_image_url_parts_are_image_parts():
    """SkyRL's vision-language rows (geometry_3k_dataset.py) give images as OpenAI image_url parts."""
    from corerl.models.vision import IMAGE_PLACEHOLDER
    from corerl.tasks.prompt_images import message_text

    url = "data:image/png;base64,AAAA"
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                             {"type": "text", "text": "w1 ?"}]}]
    assert message_text(messages, "train.parquet row 1") == ([{"role": "user", "content": f"{IMAGE_PLACEHOLDER} w1 ?"}],
                                                               [url])
