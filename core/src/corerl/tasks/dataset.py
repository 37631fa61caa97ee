"""The ``dataset`` task: prompts and answers from local JSONL or Parquet files (read with
``datasets``), the held-out split taken from ``data.held_out_files`` or cut off the end of
the shuffled training rows.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from corerl.errors import ConfigError
from corerl.generation.contract import Sample
from corerl.tasks import TaskContext, decode_completion, restore_rng, rng_state, score
from corerl.tasks.rewards import exact_answer

_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def _as_list(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def read_rows(files: list[str], key: str) -> list[dict[str, Any]]:
    """Every row of ``files`` (all JSONL/JSON lines or all Parquet), in file order."""
    builders = set()
    for name in files:
        path = Path(name)
        if not path.is_file():
            raise ConfigError(f"data file {name} does not exist", key=key, hint="give the path of a .jsonl or .parquet file")
        builder = _BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise ConfigError(f"data file {name} is neither JSONL nor Parquet", key=key,
                              hint=f"use one of the extensions {', '.join(_BUILDERS)}")
        builders.add(builder)
    if len(builders) > 1:
        raise ConfigError("data files mix JSONL and Parquet", key=key, hint="convert them to one format")
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    try:
        table = datasets.load_dataset(builders.pop(), data_files=files, split="train")
    except Exception as exc:  # a malformed file: say which key and files, keep the cause
        raise ConfigError(f"cannot read {', '.join(files)}: {type(exc).__name__}: {str(exc).splitlines()[0]}",
                          key=key, hint="check the file is valid JSONL (one object per line) or Parquet") from exc
    return table.to_list()


def _check_columns(rows: list[dict[str, Any]], columns: dict[str, str], key: str, files: list[str]) -> None:
    if not rows:
        raise ConfigError(f"{', '.join(files)} holds no rows", key=key, hint="give a file with at least one example")
    present = sorted(rows[0])
    for setting, column in columns.items():
        if column not in rows[0]:
            raise ConfigError(f"column {column!r} (data.{setting}) is not in {', '.join(files)}; columns: {', '.join(present)}",
                              key=f"data.{setting}", hint=f"set data.{setting} to one of: {', '.join(present)}")


class DatasetTask:
    """Rows with a prompt and an answer column; training prompts are drawn in shuffled epochs."""

    def __init__(self, context: TaskContext) -> None:
        data = context.data
        self.tokenizer = context.tokenizer
        self.reward_fn = context.reward or exact_answer
        self.prompt_key, self.answer_key = data.prompt_key, data.answer_key
        self.response_key = data.response_key or data.answer_key
        self.chat_template = data.apply_chat_template
        train_files = _as_list(data.train_files)
        if not train_files:
            raise ConfigError("the dataset task needs data.train_files", key="data.train_files",
                              hint="set data.train_files=path/to/train.jsonl (or .parquet)")
        columns = {"prompt_key": self.prompt_key, "answer_key": self.answer_key}
        rows = read_rows(train_files, "data.train_files")
        _check_columns(rows, columns, "data.train_files", train_files)
        rng = random.Random(context.seed)
        held_files = _as_list(data.held_out_files)
        if held_files:
            self.held = read_rows(held_files, "data.held_out_files")
            _check_columns(self.held, columns, "data.held_out_files", held_files)
            self.train = rows
        else:
            rows = rows[:]
            rng.shuffle(rows)
            count = min(data.held_out_size, len(rows) - 1)
            self.held, self.train = rows[:count], rows[count:]
        if not self.train:
            raise ConfigError("no training rows are left after the held-out split", key="data.held_out_size",
                              hint="add rows or lower data.held_out_size")
        self.rng = rng
        self.order: list[int] = []
        self.position = 0

    def encode_prompt(self, text: str) -> list[int]:
        if self.chat_template:
            return list(self.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                           add_generation_prompt=True, tokenize=True))
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        bos = self.tokenizer.bos_token_id
        return [bos, *ids] if bos is not None else ids

    def _draw(self, count: int) -> list[dict[str, Any]]:
        drawn = []
        for _ in range(count):
            if self.position >= len(self.order):
                self.order = list(range(len(self.train)))
                self.rng.shuffle(self.order)
                self.position = 0
            drawn.append(self.train[self.order[self.position]])
            self.position += 1
        return drawn

    def _prompt_of(self, row: dict[str, Any]) -> list[int]:
        return self.encode_prompt(str(row[self.prompt_key]))

    def sample(self, count: int) -> tuple[list[list[int]], list[Any]]:
        rows = self._draw(count)
        return [self._prompt_of(row) for row in rows], rows

    def held_out(self) -> tuple[list[list[int]], list[Any]]:
        return [self._prompt_of(row) for row in self.held], list(self.held)

    def demonstrations(self, count: int) -> list[tuple[list[int], list[int]]]:
        pairs = []
        for row in self._draw(count):
            if self.response_key not in row:
                raise ConfigError(f"SFT needs column {self.response_key!r} (data.response_key)", key="data.response_key",
                                  hint=f"set data.response_key to one of: {', '.join(sorted(row))}")
            response = list(self.tokenizer.encode(" " + str(row[self.response_key]), add_special_tokens=False))
            pairs.append((self._prompt_of(row), [*response, self.tokenizer.eos_token_id]))
        return pairs

    def reward(self, sample: Sample, example: Any) -> float:
        return score(self.reward_fn, decode_completion(self.tokenizer, sample), example, "data.reward")

    def state(self) -> Any:
        return {"rng": rng_state(self.rng), "order": self.order, "position": self.position}

    def set_state(self, state: Any) -> None:
        restore_rng(self.rng, state["rng"])
        self.order, self.position = list(state["order"]), int(state["position"])
