"""SFT on conversation rows (``data.train_on``; SkyRL's SFT rows: ``messages``, ``tools`` and
``system`` columns, ``train_on_what``): the demonstrations are the conversation before the trained
assistant turn and that turn as the chat template renders it, tool schemas reach the template,
every assistant turn is trained with ``all_assistant_messages`` and nothing else is, and rows that
cannot be learned are refused in one line naming the file and row (issue 75)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import attrs
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corerl import cli
from corerl.config import load_config
from corerl.config.schema import DataConfig
from corerl.errors import ConfigError, ConfigErrors
from corerl.models.tiny import build_tokenizer
from corerl.plugin_manager import PluginHost
from corerl.tasks import TaskContext
from corerl.tasks.dataset import DatasetTask, check_rows
from tests.refusals import refused_in_one_line

#: a chat template over the tiny vocabulary writing each role as a word (system w20, user w21,
#: assistant w22, tool w23), the tools' names after w24 first, an assistant's tool calls in
#: <tool_call> markers: a rendering shows where each token came from
TEMPLATE = ("{% set names = {'system': 'w20', 'user': 'w21', 'assistant': 'w22', 'tool': 'w23'} %}"
            "{% if tools %}<bos> w24 :{% for t in tools %} {{ t['function']['name'] }}{% endfor %} <eos> {% endif %}"
            "{% for m in messages %}<bos> {{ names[m['role']] }} : {{ m['content'] }}"
            "{% if m.tool_calls is defined %}{% for c in m.tool_calls %} <tool_call> {{ c['name'] }} </tool_call>"
            "{% endfor %}{% endif %} <eos> {% endfor %}"
            "{% if add_generation_prompt %}<bos> w22 :{% endif %}")
TOOLS = [{"type": "function", "function": {"name": "w40", "description": "w41", "parameters": {}}}]


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str, calls: str | None = None) -> dict[str, Any]:
    return {"role": "assistant", "content": text, "tool_calls": calls}


def rows() -> list[dict[str, Any]]:
    """SkyRL's layout (its prepare_apigen_mt.py writes it): a messages column, the tools as a JSON
    text, a system column; a row's tool call as the JSON text the ShareGPT data gives."""
    call = json.dumps([{"name": "w40", "arguments": {}}])
    return [
        {"messages": [user("w1 3 ?"), assistant("3")], "tools": None, "system": "w9 w9"},
        {"messages": [{"role": "system", "content": "w8"}, user("w1 4"), assistant("4")], "tools": None,
         "system": "w9 w9"},  # starts with a system turn: the system column is not put first
        {"messages": [user("w1 5"), assistant("", call), {"role": "tool", "content": "w41"}, assistant("5")],
         "tools": json.dumps(TOOLS), "system": None},
        {"messages": [user("w1 6"), assistant("w6"), user("w1 7"), assistant("7")], "tools": None, "system": ""},
    ]


def write_parquet(path: Path, table: list[dict[str, Any]]) -> Path:
    pq.write_table(pa.Table.from_pylist(table), path)
    return path


@pytest.fixture
def tokenizer():
    tok = build_tokenizer(128)
    tok.chat_template = TEMPLATE
    return tok


def _data(train: Path, **settings: Any) -> DataConfig:
    base = {"task": "dataset", "train_files": str(train), "held_out_files": str(train), "prompt_key": "messages",
            "train_on": "last_assistant_message", "tools_key": "tools", "system_key": "system",
            "apply_chat_template": True, "shuffle": False}
    return DataConfig(**{**base, **settings})


def _task(tokenizer, train: Path, **settings: Any) -> DatasetTask:
    return DatasetTask(TaskContext(tokenizer, 0, _data(train, **settings)))


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _words(tokenizer, ids: list[int]) -> str:
    return " ".join(tokenizer.convert_ids_to_tokens(list(ids)))


def _rendered(tokenizer, row: dict[str, Any], upto: int) -> list[int]:
    """An independent rendering: the conversation's messages through ``upto`` (the system column
    first where it applies, null fields and the JSON texts as a user of transformers writes them)
    encoded by the template in one call."""
    messages = [{k: (json.loads(v) if k == "tool_calls" else v) for k, v in m.items() if v is not None}
                for m in row["messages"][: upto + 1]]
    if row["system"] and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": row["system"]}, *messages]
    tools = json.loads(row["tools"]) if row["tools"] else None
    return _ids(tokenizer, tokenizer.apply_chat_template(messages, tools=tools, tokenize=False))


def test_the_last_assistant_turn_is_learned_after_the_conversation_before_it(tokenizer, tmp_path):
    task = _task(tokenizer, write_parquet(tmp_path / "train.parquet", rows()))
    demonstrations = task.demonstrations(4)  # in file order (shuffle off), every row once
    assert [len(d) for d in demonstrations] == [2] * 4  # no mask: the whole response is the turn
    # written out by hand: the system column first, the generation prompt ending the prompt, the
    # turn as the template writes it (its end-of-turn token the last trained one, no other added)
    prompt, response = demonstrations[0]
    assert _words(tokenizer, prompt) == "<bos> w20 : w9 w9 <eos> <bos> w21 : w1 3 ? <eos> <bos> w22 :"
    assert _words(tokenizer, response) == "3 <eos>"
    assert _words(tokenizer, demonstrations[1][0]).startswith("<bos> w20 : w8 <eos> <bos> w21")  # its own system
    # the tool schemas and the earlier tool call reach the template
    assert _words(tokenizer, demonstrations[2][0]) == (
        "<bos> w24 : w40 <eos> <bos> w21 : w1 5 <eos> <bos> w22 : <tool_call> w40 </tool_call> <eos> "
        "<bos> w23 : w41 <eos> <bos> w22 :")
    assert _words(tokenizer, demonstrations[3][1]) == "7 <eos>"
    # against one rendering of the whole conversation: prompt + response are its tokens
    for row, (prompt, response) in zip(rows(), demonstrations, strict=True):
        assert [*prompt, *response] == _rendered(tokenizer, row, len(row["messages"]) - 1)
    # held-out prompts are the same conversations before the last turn; its content is the answer
    prompts, examples = task.held_out()
    assert prompts == [d[0] for d in demonstrations]
    assert [e["answer"] for e in examples] == ["3", "4", "5", "7"]


def test_every_assistant_turn_is_learned_and_nothing_else(tokenizer, tmp_path):
    table = rows()
    task = _task(tokenizer, write_parquet(tmp_path / "train.parquet", table), train_on="all_assistant_messages")
    demonstrations = task.demonstrations(4)
    tool_row = demonstrations[2]
    prompt, response, mask = tool_row
    assert _words(tokenizer, prompt) == "<bos> w24 : w40 <eos> <bos> w21 : w1 5 <eos> <bos> w22 :"
    trained = [t for t, m in zip(response, mask, strict=True) if m]
    context = [t for t, m in zip(response, mask, strict=True) if not m]
    assert _words(tokenizer, trained) == "<tool_call> w40 </tool_call> <eos> 5 <eos>"  # both assistant turns
    assert _words(tokenizer, context) == "<bos> w23 : w41 <eos> <bos> w22 :"  # the tool's turn, the next header
    two_turns = demonstrations[3]
    assert _words(tokenizer, [t for t, m in zip(two_turns[1], two_turns[2], strict=True) if m]) == "w6 <eos> 7 <eos>"
    # a conversation of one assistant turn is trained as with last_assistant_message
    assert len(demonstrations[0]) == 2 and _words(tokenizer, demonstrations[0][1]) == "3 <eos>"
    for row, demonstration in zip(table, demonstrations, strict=True):  # one rendering of the whole conversation
        assert [*demonstration[0], *demonstration[1]] == _rendered(tokenizer, row, len(row["messages"]) - 1)


class _Recorder:
    """A training engine that keeps the batch it is given and scores each token at probability
    1/2 (the batch and its loss mask are under test, not the model)."""

    def __init__(self) -> None:
        self.batches: list[Any] = []

    def train_step(self, batch, loss):
        import torch

        from corerl.training.contract import StepResult

        self.batches.append(batch)
        mask = batch["loss_mask"]
        logprobs = torch.full(mask.shape, math.log(0.5), dtype=torch.float64)
        value, metrics = loss(logprobs, batch, float(mask.sum()))
        return StepResult(loss=float(value), grad_norm=0.0, lr=0.1, tokens=int(mask.sum()), step=1, metrics=metrics)


def test_an_sft_step_trains_exactly_the_assistant_tokens(tokenizer, tmp_path):
    from corerl.algorithms.sft import SFT

    task = _task(tokenizer, write_parquet(tmp_path / "train.parquet", rows()), train_on="all_assistant_messages")
    engine = _Recorder()
    metrics = SFT(engine).step(task.demonstrations(4))
    (batch,) = engine.batches
    trained = [_words(tokenizer, [t for t, m in zip(ids.tolist(), mask.tolist(), strict=True) if m])
               for ids, mask in zip(batch["input_ids"], batch["loss_mask"], strict=True)]
    assert trained == ["3 <eos>", "4 <eos>", "<tool_call> w40 </tool_call> <eos> 5 <eos>", "w6 <eos> 7 <eos>"]
    assert metrics["tokens"] == 14 and metrics["loss"] == pytest.approx(math.log(2))


def test_sft_trains_on_a_skyrl_conversation_file_end_to_end(tmp_path):
    """One SFT step of the tiny model on SkyRL-layout rows, every assistant turn trained: a finite
    loss over exactly the assistant tokens (14, as counted above), held-out answers scored."""
    import corerl

    train = write_parquet(tmp_path / "train.parquet", rows())
    result = corerl.SFTTrainer({
        "policy": {"model_name": "builtin:tiny-qwen2", "chat_template": TEMPLATE, "max_seq_length": 64,
                   "generation": {"backend": "hf", "max_new_tokens": 4}},
        "algorithm": {"max_steps": 1, "batch_size": 4},
        "data": {"task": "dataset", "train_files": str(train), "held_out_files": str(train),
                 "prompt_key": "messages", "train_on": "all_assistant_messages", "tools_key": "tools",
                 "system_key": "system", "apply_chat_template": True},
        "run": {"output_dir": str(tmp_path), "name": "conversations"},
    }).train()
    (step,) = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert step["phase"] == "sft" and step["tokens"] == 14 and math.isfinite(step["loss"]) and step["loss"] > 0


def _skyrl(tmp_path: Path, *keys: str) -> Any:
    script = tmp_path / "run_sft.sh"
    script.write_text("python -m skyrl.train.main_sft \\\n  " + " \\\n  ".join(
        ["model.path=builtin:tiny", "num_steps=2", "batch_size=4", "placement.num_gpus_per_node=1", *keys]) + "\n")
    return load_config(str(script), [], PluginHost(), [], "skyrl", environ={})


def test_skyrls_sft_keys_choose_what_is_learned(tokenizer, tmp_path):
    train = write_parquet(tmp_path / "train.parquet", rows())
    # SkyRL's defaults: the messages, tools and system columns, the last assistant message
    data = _skyrl(tmp_path, f"train_datasets=\"['{train}']\"").core.data
    assert (data.prompt_key, data.tools_key, data.system_key, data.train_on) == (
        "messages", "tools", "system", "last_assistant_message")
    last = DatasetTask(TaskContext(tokenizer, 0, _runnable(data)))
    assert [len(d) for d in last.demonstrations(4)] == [2, 2, 2, 2]
    # train_on_what=all_assistant_messages, as the tulu3 and APIGen-MT scripts give it
    every = _skyrl(tmp_path, f"train_datasets=\"['{train}']\"", "train_on_what=all_assistant_messages",
                   "tools_key=tools", "system_key=system", "messages_key=messages").core.data
    assert every.train_on == "all_assistant_messages"
    task = DatasetTask(TaskContext(tokenizer, 0, _runnable(every)))
    assert sorted(len(d) for d in task.demonstrations(4)) == [2, 2, 3, 3]  # the two-turn rows carry masks
    # tools_key names the column the schemas come from: another name, no tools reach the template
    renamed = _skyrl(tmp_path, f"train_datasets=\"['{train}']\"", "tools_key=schemas").core.data
    assert renamed.tools_key == "schemas"
    no_tools = DatasetTask(TaskContext(tokenizer, 0, _runnable(renamed)))
    assert "w24" not in _words(tokenizer, no_tools.demonstrations(4)[2][0])


def _runnable(data: DataConfig) -> DataConfig:
    """``data`` with the chat template on (a run decides it from the tokenizer), every row both
    trained and held out, drawn in file order."""
    return attrs.evolve(data, apply_chat_template=True, held_out_files=data.train_files, shuffle=False)


def _row2(**changes: Any) -> list[dict[str, Any]]:
    made = rows()
    made[1] = {**made[1], **changes}
    return made


# (id, the rows, data settings, the key, what the one line says)
BAD = [
    ("text-without-a-response", _row2(messages="w1 4"), {}, "data.prompt_key",
     ["train.jsonl line 2: column 'messages' (data.prompt_key) holds a str, not a list of chat messages, and the "
      "row has no 'answer' column (data.response_key)"]),
    ("no-assistant-turn", _row2(messages=[user("w1 4")]), {}, "data.prompt_key",
     ["train.jsonl line 2: column 'messages' (data.prompt_key) holds no assistant turn to train on (roles: user; "
      "data.train_on=last_assistant_message)"]),
    ("message-without-role", _row2(messages=[{"content": "w1 4"}, assistant("4")]), {}, "data.prompt_key",
     ["train.jsonl line 2: message 0 of column 'messages' (data.prompt_key) has no 'role'"]),
    ("tools-not-json", _row2(tools="[{"), {}, "data.tools_key",
     ["train.jsonl line 2: column 'tools' (data.tools_key) holds a text that is not JSON"]),
    ("tools-not-schemas", _row2(tools="[1, 2]"), {}, "data.tools_key",
     ["train.jsonl line 2: column 'tools' (data.tools_key) holds a list, not a list of tool schemas"]),
]


@pytest.fixture
def corerl(capfd, monkeypatch, tmp_path):
    import corerl.reporting.quiet as quiet

    monkeypatch.chdir(tmp_path)

    def command(*argv: str) -> tuple[int, str]:
        monkeypatch.setattr(quiet, "_last_log", None)
        return cli.main(list(argv)), capfd.readouterr().err

    return command


@pytest.mark.parametrize(("table", "data", "key", "says"), [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_a_row_that_cannot_be_learned_is_refused_in_one_line(corerl, tokenizer, tmp_path, table, data, key, says):
    from corerl.testing import write_recipe

    train = tmp_path / "train.jsonl"  # JSON lines: a row may hold what a Parquet column could not
    train.write_text("".join(json.dumps(row) + "\n" for row in table))
    recipe = write_recipe(tmp_path / "sft.yaml", {
        "policy": {"model_name": "builtin:tiny-qwen2", "chat_template": TEMPLATE, "generation": {"backend": "hf"}},
        "algorithm": {"name": "sft"},
        "data": {"task": "dataset", "train_files": str(train), "prompt_key": "messages",
                 "train_on": "last_assistant_message", "tools_key": "tools", "system_key": "system",
                 "apply_chat_template": True, **data},
    })
    refused_in_one_line(corerl("validate", str(recipe)), *says, key=key)  # at validate, before anything runs
    with pytest.raises(ConfigError) as refused:
        check_rows(_data(train, **data), "dataset", None, None)
    assert refused.value.key == key and all(text in str(refused.value) for text in says), str(refused.value)
    with pytest.raises(ConfigError) as refused:  # the task itself, as a run makes it
        _task(tokenizer, train, **data)
    assert refused.value.key == key and all(text in str(refused.value) for text in says), str(refused.value)


def test_every_turn_needs_the_chat_template_and_one_rendering(tokenizer, tmp_path):
    train = write_parquet(tmp_path / "train.parquet", rows())
    with pytest.raises(ConfigError) as refused:
        _task(tokenizer, train, train_on="all_assistant_messages", apply_chat_template=False)
    assert refused.value.key == "data.train_on" and "data.apply_chat_template is false" in str(refused.value)
    # a template that rewrites earlier turns once another follows (as ones dropping past reasoning do)
    rewriting = build_tokenizer(128)
    rewriting.chat_template = ("{% for m in messages %}<bos> {% if m['role'] == 'assistant' and not loop.last %}w30"
                               "{% else %}{{ m['content'] }}{% endif %} <eos> {% endfor %}"
                               "{% if add_generation_prompt %}<bos>{% endif %}")
    with pytest.raises(ConfigError) as refused:
        _task(rewriting, train, train_on="all_assistant_messages")
    line = str(refused.value)
    assert refused.value.key == "data.train_on" and "\n" not in line
    assert "train.parquet row 3: the chat template renders the conversation before assistant turn 3 differently" in line
    # the last turn alone is one rendering's piece with that template
    assert _words(rewriting, _task(rewriting, train).demonstrations(4)[2][1]) == "5 <eos>"
    # without the chat template the last turn is learned as a response column's text is
    plain = _task(tokenizer, train, apply_chat_template=False).demonstrations(1)[0]
    assert _words(tokenizer, plain[1]) == "3 <eos>"


def test_a_dataset_folder_is_read_as_its_train_file(tokenizer, tmp_path):
    """SkyRL's data scripts write a folder (prepare_apigen_mt.py: <dir>/train.parquet) and its SFT
    scripts name the folder: corerl reads its one data file, or its train split's where it holds
    several; a folder it cannot read as one file is refused naming what it holds."""
    folder = tmp_path / "apigen"
    folder.mkdir()
    write_parquet(folder / "train.parquet", rows())
    write_parquet(folder / "validation.parquet", rows()[:1])
    data = _skyrl(tmp_path, f"train_datasets=\"['{folder}']\"", f"eval_datasets=\"['{folder}']\"",
                  "train_on_what=all_assistant_messages").core.data
    task = DatasetTask(TaskContext(tokenizer, 0, attrs.evolve(data, apply_chat_template=True, shuffle=False)))
    assert len(task.train) == 4 and len(task.demonstrations(4)) == 4
    write_parquet(folder / "train-extra.parquet", rows())
    with pytest.raises(ConfigError) as refused:
        check_rows(data, "dataset", None, None)
    assert str(refused.value).startswith(f"data.train_files: data folder {folder} holds 2 data files (train-extra."
                                         "parquet, train.parquet), and corerl reads one data file per folder")


def test_sfts_token_budget_is_the_packed_micro_batchs(tmp_path):
    """SkyRL's SFT reads max_tokens_per_microbatch as the bin capacity of its sequence packing
    (the RL trainer's key of that name is dynamic batching's budget): corerl's packer budget."""
    packed = _skyrl(tmp_path, "strategy=fsdp", "max_length=512", "use_sequence_packing=true",
                    "max_tokens_per_microbatch=2048").core.policy
    assert packed.sequence_packing.enabled and packed.sequence_packing.train_mb_tokens == 2048
    assert not packed.dynamic_batching.enabled
    default = _skyrl(tmp_path, "strategy=fsdp", "max_length=512", "use_sequence_packing=true",
                     "max_tokens_per_microbatch=null").core.policy
    assert default.sequence_packing.train_mb_tokens == 512  # SkyRL's null: max_length
    unpacked = _skyrl(tmp_path, "strategy=fsdp", "max_length=512", "max_tokens_per_microbatch=2048").core.policy
    assert not unpacked.sequence_packing.enabled and unpacked.sequence_packing.train_mb_tokens is None
    assert not unpacked.dynamic_batching.enabled
    with pytest.raises(ConfigErrors) as refused:
        _skyrl(tmp_path, "strategy=fsdp", "max_length=512", "use_sequence_packing=true", "max_tokens_per_microbatch=256")
    (error,) = refused.value.errors
    assert error.one_line().startswith("max_tokens_per_microbatch: 256 is not a packed micro-batch's token budget: a "
                                       "count of at least max_length (512), as SkyRL requires"), error.one_line()


def test_a_conversation_is_cut_at_the_sequence_length(tokenizer, tmp_path):
    """As SkyRL's max_length truncates a tokenized conversation: prompt and trained turns together
    are at most policy.max_seq_length tokens (a run's tasks get max_seq_length - 1 prompt tokens)."""
    train = write_parquet(tmp_path / "train.parquet", rows())
    task = DatasetTask(TaskContext(tokenizer, 0, _data(train, train_on="all_assistant_messages"),
                                   max_prompt_tokens=26))  # the tool row's last turn's prompt: 26 tokens
    prompt, response, mask = task.demonstrations(4)[2]  # the tool row: 14 prompt tokens, 14 after them
    assert len(prompt) + len(response) == 27 and len(mask) == len(response)
    assert _words(tokenizer, [t for t, m in zip(response, mask, strict=True) if m]) == (
        "<tool_call> w40 </tool_call> <eos> 5")  # its last token cut
    assert _words(tokenizer, task.demonstrations(4)[3][1]).endswith("7 <eos>")  # a row that fits is whole
