"""The ``dataset`` task: prompts and answers from local JSONL or Parquet files (read with
``datasets``), the held-out split taken from ``data.held_out_files`` or cut off the end of
the shuffled training rows.

A prompt is a text or a conversation (a list of ``{"role", "content"}`` messages, as SkyRL's and
NeMo RL's data files hold it), rendered with the chat template; the answer column may be a dotted
path into a struct column (``reward_spec.ground_truth``). Rewards and environments see every
column of the row as read, nested dicts included.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping
from itertools import islice
from pathlib import Path
from typing import Any

from corerl.errors import ConfigError
from corerl.failures import first_line
from corerl.generation.contract import Sample, with_images
from corerl.models.vision import IMAGE_TOKEN, check_placeholders, image_pixel_limit
from corerl.reporting.lost_text import check_prompts
from corerl.tasks import (
    Epochs,
    TaskContext,
    column_value,
    decode_completion,
    restore_rng,
    rng_state,
    score,
)
from corerl.tasks.conversations import (
    check_learnable,
    encode_pieces,
    message_fields,
    not_a_conversation,
    row_tools,
    trained_pieces,
    trained_turns,
    with_system,
)
from corerl.tasks.prompt_images import (
    as_images,
    check_all,
    decode_all,
    message_text,
    place_images,
    place_messages,
)
from corerl.tasks.prompts import chat_text, check_prompt_fits, encode_prompt, encode_text
from corerl.tasks.rewards import exact_answer

_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
ORIGIN = "_corerl_origin"  # where a row came from: a key the rows carry, dropped before a reward sees them
PROMPT_IDS = "_corerl_prompt_ids"  # the row's prompt, encoded and checked once when the task is made
FOLDER = "_corerl_folder"  # the folder of the row's data file: image paths are relative to it
IMAGES = "_corerl_images"  # the row's images, encoded with its prompt (a vision-language policy's)
SOURCE = "_corerl_source"  # the index in data.train_files of the row's file (read where files are mixed by weight)
DEMONSTRATION = "_corerl_demonstration"  # data.train_on: the row's (prompt ids or None, response ids, mask or None)
_INTERNAL = (ORIGIN, PROMPT_IDS, FOLDER, IMAGES, SOURCE, DEMONSTRATION)


def render_prompt(tokenizer: Any, text: str, chat_template: bool, system_prompt: str | None) -> list[int]:
    """Prompt token ids: ``text`` as the user's message of the tokenizer's chat template (after
    the system prompt, when set), or without one ``<bos>``, the system prompt as the first
    paragraph and ``text`` (:func:`corerl.tasks.prompts.encode_prompt`, which also gives the text)."""
    return encode_prompt(tokenizer, text, chat_template, system_prompt)[0]


def as_list(value: str | list[str] | None) -> list[str]:
    """Data file names (``data.train_files``, ``data.held_out_files``): one or a list, a folder
    (a dataset written to a folder, as SkyRL's data scripts write theirs) replaced by the one data
    file it holds, or by its train split's one (the file named with the word train) where it holds
    several; a folder without one such file stays, for :func:`check_data_files` to refuse."""
    if value is None:
        return []
    return [_folder_file(str(name)) for name in ([value] if isinstance(value, str) else value)]


_TRAIN_SPLIT = re.compile(r"(^|[-_./])train([-_.]|$)")  # train.parquet, data/train-00000-of-00001.parquet
_NOT_DATA = ("dataset_info.json", "state.json", "dataset_dict.json")  # a datasets save_to_disk folder's bookkeeping


def _folder_data(path: Path) -> list[Path]:
    """The JSONL/Parquet/CSV files in folder ``path`` (and below it): the train split's where some are
    named so, else all of them."""
    files = sorted(found for found in path.rglob("*") if found.is_file() and found.suffix.lower() in _BUILDERS
                   and found.name not in _NOT_DATA
                   and not any(part.startswith(".") for part in found.relative_to(path).parts))
    train = [found for found in files if _TRAIN_SPLIT.search(found.relative_to(path).as_posix())]
    return train or files


def _folder_file(name: str) -> str:
    path = Path(name)
    if not path.is_dir():
        return name
    found = _folder_data(path)
    return str(found[0]) if len(found) == 1 else name


def _get(row: Mapping[str, Any], key: str) -> Any:
    """:func:`column_value`, None where the column or path is missing."""
    try:
        return column_value(row, key)
    except KeyError:
        return None


def _top_column(row: Mapping[str, Any], key: str) -> str:
    """The column ``key`` starts from: itself where the row has it, else its first dotted part."""
    return key if key in row or "." not in key else key.split(".", 1)[0]


def _path_gap(row: Mapping[str, Any], key: str) -> str | None:
    """Where the dotted path ``key`` stops in ``row``, e.g. ``column 'reward_spec' has no field
    'ground_truth' (it holds: method)``; None where it reaches a value (None included) or the row
    lacks its first column (a missing value, as a missing column is)."""
    if key in row or "." not in key:
        return None
    first, *rest = key.split(".")
    value, done = row.get(first), [first]
    for part in rest:
        if value is None:
            return None  # a null struct: the value is missing
        where = f"column {first!r}" if len(done) == 1 else f"{'.'.join(done)!r}"
        if not isinstance(value, Mapping):
            return f"{where} holds a {type(value).__name__}, not a struct with a field {part!r}"
        if part not in value:
            return f"{where} has no field {part!r} (it holds: {', '.join(map(str, value)) or 'nothing'})"
        value, done = value[part], [*done, part]
    return None


def _read_jsonl(path: Path, key: str) -> list[dict[str, Any]]:
    """The objects of a JSONL file; a line that is not a JSON object is refused with its number."""
    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise ConfigError(f"{path} line {number} is not valid JSON ({exc})", key=key,
                                  hint="each line must hold one JSON object") from None
            if not isinstance(row, dict):
                raise ConfigError(f"{path} line {number} holds a {type(row).__name__}, not a JSON object", key=key,
                                  hint='each line must hold one object, e.g. {"prompt": "...", "answer": "..."}')
            row[ORIGIN] = f"{path.name} line {number}"
            row[FOLDER] = str(path.parent)
            rows.append(row)
    return rows


def _read_csv(path: Path, key: str) -> list[dict[str, Any]]:
    """The rows of a CSV file with a header line, every value as the text it holds (a CSV has no
    types: an answer column of numbers stays the numbers' text); a row with more fields than the
    header is refused with its line number. Read with the standard library's ``csv``: no
    ``datasets`` builder guessing column types from the first rows."""
    import csv

    rows = []
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        if not reader.fieldnames:
            raise ConfigError(f"{path} has no header line", key=key,
                              hint="the first line of a CSV data file names its columns, e.g. prompt,answer")
        for row in reader:
            if None in row:  # fields past the header's
                raise ConfigError(f"{path} line {reader.line_num} has {len(reader.fieldnames) + len(row[None])} "
                                  f"fields for a header of {len(reader.fieldnames)}", key=key,
                                  hint="quote fields that hold commas")
            rows.append({**row, ORIGIN: f"{path.name} line {reader.line_num}", FOLDER: str(path.parent)})
    return rows


def _holds_json_lines(path: Path) -> bool:
    """A ``.jsonl`` file, or a ``.json`` file of JSON lines (not one JSON array or object)."""
    suffix = path.suffix.lower()
    if suffix != ".json":
        return suffix == ".jsonl"
    with path.open(encoding="utf-8", errors="replace") as handle:
        start = handle.read(4096).lstrip()
    if not start.startswith("{"):
        return False
    first = start.split("\n", 1)[0]
    try:
        json.loads(first)
    except ValueError:
        return False  # one object over several lines: a JSON document, for datasets to read
    return True


def read_rows(files: list[str], key: str, limit: int | None = None) -> list[dict[str, Any]]:
    """Every row of ``files`` (all JSONL/JSON lines, all Parquet or all CSV), in file order, or the
    first ``limit``; each row remembers where it came from under :data:`ORIGIN` (file and line or
    row number)."""
    builders = check_data_files(files, key)
    if builders == {"csv"}:
        return list(islice((row for name in files for row in _read_csv(Path(name), key)), limit))
    if all(_holds_json_lines(Path(name)) for name in files):  # read here: errors name the line
        return list(islice((row for name in files for row in _read_jsonl(Path(name), key)), limit))
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    rows = []
    for name in files:
        if Path(name).stat().st_size == 0:
            raise ConfigError(f"{name} is empty", key=key, hint="give a file with at least one example")
        try:
            table = datasets.load_dataset(builders.copy().pop(), data_files=[name], split="train")
        except Exception as exc:  # a malformed file: say which key and file, keep the cause
            raise ConfigError(f"cannot read {name}: {first_line(exc)}", key=key, hint="check the file is valid JSONL (one object per line) or Parquet") from exc
        rows += [{**row, ORIGIN: f"{Path(name).name} row {index + 1}", FOLDER: str(Path(name).parent)}
                 for index, row in enumerate(table.to_list())]
        if limit is not None and len(rows) >= limit:
            break
    return rows[:limit]


def row_slices(value: str | list[str] | None, files: list[str], key: str) -> list[slice] | None:
    """``data.train_rows`` / ``data.held_out_rows``: one slice per file of ``files`` (one text for
    every file, or one per file), each ``start:stop`` as Python writes a slice; None when unset."""
    if value is None:
        return None
    texts = [value] * len(files) if isinstance(value, str) else [str(text) for text in value]
    if len(texts) != len(files):
        raise ConfigError(f"{key} gives {len(texts)} slices for {len(files)} files", key=key,
                          hint="give one slice for every file (e.g. -500:), or one per file")
    slices = []
    for text in texts:
        found = re.fullmatch(r"\s*([+-]?\d+)?\s*:\s*([+-]?\d+)?\s*", text)
        if found is None:
            raise ConfigError(f"{text!r} is not a slice of rows", key=key,
                              hint="write start:stop as Python slices a list: :1000, -500:, 100:200")
        slices.append(slice(*(None if part is None else int(part) for part in found.groups())))
    return slices


def read_sliced(files: list[str], key: str, slices: list[slice] | None, limit: int | None = None,
                sources: bool = False) -> list[dict[str, Any]]:
    """:func:`read_rows` of ``files``, each file's rows cut by its slice (``slices``, one per file:
    :func:`row_slices`), then the first ``limit``; ``sources``: each row remembers its file's index
    in ``files`` under :data:`SOURCE`."""
    if slices is None and not sources:
        return read_rows(files, key, limit)
    rows = []
    for index, name in enumerate(files):
        part = read_rows([name], key)
        if slices is not None:
            part = part[slices[index]]
            if not part:
                raise ConfigError(f"the slice {_slice_text(slices[index])} of {name} holds no rows ({key})", key=key,
                                  hint="give a slice that keeps rows of the file")
        for row in part:
            row[SOURCE] = index
        rows += part
    return rows[:limit]


def _slice_text(part: slice) -> str:
    return f"{'' if part.start is None else part.start}:{'' if part.stop is None else part.stop}"


def read_train_rows(data: Any) -> list[dict[str, Any]]:
    """The training rows ``data`` names: each file of ``data.train_files`` cut by ``data.train_rows``,
    then the first ``data.max_train_rows`` (each row with its file's index where files are mixed by
    ``data.train_file_weights``)."""
    files = as_list(data.train_files)
    slices = row_slices(getattr(data, "train_rows", None), files, "data.train_rows")
    weights = file_weights(data)
    return read_sliced(files, "data.train_files", slices, data.max_train_rows, sources=weights is not None)


def read_held_rows(data: Any) -> list[dict[str, Any]]:
    """The rows of ``data.held_out_files``, each file cut by ``data.held_out_rows``."""
    files = as_list(data.held_out_files)
    return read_sliced(files, "data.held_out_files", row_slices(getattr(data, "held_out_rows", None), files,
                                                                "data.held_out_rows"))


def file_weights(data: Any) -> list[float] | None:
    """``data.train_file_weights`` checked against ``data.train_files`` (one positive weight per
    file), summing to 1; None when unset."""
    weights = getattr(data, "train_file_weights", None)
    if weights is None:
        return None
    files = as_list(data.train_files)
    if len(weights) != len(files):
        raise ConfigError(f"data.train_file_weights gives {len(weights)} weights for {len(files)} train files",
                          key="data.train_file_weights", hint="give one weight per file of data.train_files")
    if any(not isinstance(w, (int, float)) or w <= 0 for w in weights):
        raise ConfigError(f"data.train_file_weights {list(weights)} holds a weight that is not above 0",
                          key="data.train_file_weights", hint="give every file a weight above 0, or leave the file out")
    total = float(sum(weights))
    return [float(w) / total for w in weights]


def check_data_files(files: list[str], key: str) -> set[str]:
    """Refuse, reading nothing, data files that do not exist or are not all JSONL, all Parquet or
    all CSV; returns the ``datasets`` builder that reads them (``csv``: read by :func:`_read_csv`)."""
    builders = set()
    for name in files:
        path = Path(name)
        if path.is_dir():  # as_list left it: not one data file
            found = [str(file.relative_to(path)) for file in _folder_data(path)]
            held = f"{len(found)} data files ({', '.join(found[:4])}{', ...' if len(found) > 4 else ''})" if found \
                else "no .jsonl, .parquet or .csv file"
            raise ConfigError(f"data folder {name} holds {held}, and corerl reads one data file per folder", key=key,
                              hint="give the data files themselves (a list)" if found
                                   else "give the path of a .jsonl, .parquet or .csv file")
        if not path.is_file():
            raise ConfigError(f"data file {name} does not exist", key=key,
                              hint="give the path of a .jsonl, .parquet or .csv file")
        builder = _BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise ConfigError(f"data file {name} is not JSONL, Parquet or CSV", key=key,
                              hint=f"use one of the extensions {', '.join(_BUILDERS)}")
        builders.add(builder)
    if len(builders) > 1:
        raise ConfigError(f"data files mix formats ({', '.join(sorted(builders))})", key=key,
                          hint="convert them to one format")
    return builders


#: the core's tasks that read their rows from ``data.train_files`` (and ``data.held_out_files``)
FILE_TASKS = ("dataset", "preferences")


def check_data_inputs(data: Any, task_id: str | None) -> list[ConfigError]:
    """What :class:`DatasetTask` (and the preferences task) refuse before reading a row, checked
    without reading one, for any task: ``data.train_files`` given (for :data:`FILE_TASKS`, not
    replaced by a Hub dataset), every data file that is set present and JSONL or Parquet, the
    prompt and system prompt files readable (and the prompt file a template). One error per key."""
    errors: list[ConfigError] = []
    train_files = as_list(data.train_files)
    if task_id in FILE_TASKS and not train_files:
        if data.hub_dataset:
            errors.append(ConfigError(f"{data.hub_dataset!r} is a Hugging Face Hub dataset, and nothing is downloaded",
                                      key="data.hub_dataset", hint="give a local JSONL/Parquet file: "
                                      "data.train_files=train.jsonl (in a NeMo RL recipe: data.train.data_path=train.jsonl)"))
        else:
            errors.append(ConfigError(f"the {task_id} task needs data.train_files", key="data.train_files",
                                      hint="set data.train_files=path/to/train.jsonl (or .parquet)"))
    checks = [(lambda: check_data_files(train_files, "data.train_files")),
              (lambda: check_data_files(as_list(data.held_out_files), "data.held_out_files")),
              (lambda: read_template(data.prompt_file)), (lambda: read_system_prompt(data.system_prompt_file)),
              (lambda: row_slices(data.train_rows if train_files else None, train_files, "data.train_rows")),
              (lambda: _check_held_out_rows(data)), (lambda: _check_weights(data, task_id)),
              (lambda: _check_full_context(data))]
    for check in checks:
        try:
            check()
        except ConfigError as exc:
            errors.append(exc)
    return errors


def _check_held_out_rows(data: Any) -> None:
    files = as_list(data.held_out_files)
    if data.held_out_rows is not None and not files:
        raise ConfigError("data.held_out_rows is set and data.held_out_files is not: there are no held-out files to "
                          "cut", key="data.held_out_rows", hint="set data.held_out_files (they may be the training "
                          "files), or data.held_out_size for rows cut from the training rows")
    row_slices(data.held_out_rows, files, "data.held_out_rows")


def _check_full_context(data: Any) -> None:
    if getattr(data, "full_context", False) and data.env_name:
        raise ConfigError(f"data.full_context makes up one-turn prompts, and data.env_name {data.env_name!r} would play "
                          "them as its episodes", key="data.full_context",
                          hint="unset data.env_name for the memory check, or set data.full_context=false")


def _check_weights(data: Any, task_id: str | None) -> None:
    if data.train_file_weights is not None and task_id == "preferences":
        raise ConfigError("the preferences task does not mix its files by weight (data.train_file_weights)",
                          key="data.train_file_weights", hint="remove data.train_file_weights (the files' pairs "
                          "are drawn as one pool)")
    if data.train_files is not None:
        file_weights(data)


def check_rows(data: Any, task_id: str | None, reads_images: bool | None, processor_pixels: int | None) -> None:
    """Refuse what :class:`DatasetTask` refuses of its rows, reading them but encoding nothing
    (``corerl validate``, and ``corerl run`` before it writes anything): a line that is not a
    JSON object, a row without the prompt or answer column, and the rows' images: images for a
    text-only policy (``reads_images`` False), an image file that is missing, not an image,
    corrupt or past ``data.max_image_pixels`` (its pixels are not decoded), image placeholders
    that do not match the images. ``reads_images`` None (a GGUF policy, known once converted):
    the images are left to the task. The preferences task's rows are checked for JSON objects
    and their prompt, chosen and rejected columns; other tasks' rows are left to them."""
    train_files = as_list(data.train_files)
    if task_id not in FILE_TASKS or not train_files:
        return
    if task_id == "preferences":
        columns = {"prompt_key": data.prompt_key, "chosen_key": data.chosen_key, "rejected_key": data.rejected_key}
    else:
        columns = _columns(data)
    rows = read_train_rows(data)
    check_columns(rows, columns, "data.train_files", train_files)
    files = [("data.train_files", rows)]
    held_files = as_list(data.held_out_files)
    if held_files:
        held = read_held_rows(data)
        check_columns(held, columns, "data.held_out_files", held_files)
        files.append(("data.held_out_files", held))
    if task_id == "dataset":
        for _, file_rows in files:
            for row in file_rows:
                _check_conversation_row(row, data)
    if reads_images is None or task_id != "dataset":
        return
    template, system = read_template(data.prompt_file), read_system_prompt(data.system_prompt_file)
    limit = image_pixel_limit(data.max_image_pixels, processor_pixels)
    for key, file_rows in files:
        for row in file_rows:
            where = row[ORIGIN]
            placed, images = placed_prompt(row, data.prompt_key, data.image_key)
            if images and not reads_images:
                raise text_only_policy(where, len(images), data.image_key)
            if not reads_images:
                continue
            check_all(images, Path(row.get(FOLDER, ".")), where, limit)
            if isinstance(placed, list):
                body = "\n\n".join(m["content"] for m in placed)
                text = body if data.apply_chat_template else (template.format(body) if template else body)
            else:
                text = template.format(placed) if template else placed
            check_placeholders((text + (system or "")).count(IMAGE_TOKEN), len(images), where, key)


def _columns(data: Any) -> dict[str, str]:
    """The columns every row of the dataset task must hold: the prompt and the answer, or with
    ``data.train_on`` the prompt only (a conversation's last assistant turn is its answer where
    the row has no answer column; a text prompt needs the answer and response columns:
    :func:`_check_conversation_row`)."""
    if getattr(data, "train_on", None) is not None:
        return {"prompt_key": data.prompt_key}
    return {"prompt_key": data.prompt_key, "answer_key": data.answer_key}


def _check_conversation_row(row: dict[str, Any], data: Any) -> list[Any]:
    """What the dataset task refuses of a conversation row, checked without a tokenizer: its chat
    messages' layout, its tool schemas (``data.tools_key``), and with ``data.train_on`` an
    assistant turn to train (with ``all_assistant_messages``, no images: only the last turn is
    trained on rows with images). Returns the row's images."""
    train_on, where = getattr(data, "train_on", None), row[ORIGIN]
    prompt = row.get(data.prompt_key)
    if not isinstance(prompt, list):
        if train_on is not None:  # a text prompt: learned from the row's response column, as without train_on
            for column in dict.fromkeys((data.response_key or data.answer_key, data.answer_key)):
                if _get(row, column) is None:
                    raise not_a_conversation(prompt, where, data.prompt_key, train_on, column)
        return []
    placed, images = placed_prompt(row, data.prompt_key, data.image_key)
    tools_key = getattr(data, "tools_key", None)
    if tools_key:
        row_tools(_get(row, tools_key), where, tools_key)
    if train_on is not None:
        check_learnable(prompt, where, data.prompt_key, train_on)
        if images and train_on == "all_assistant_messages":
            raise ConfigError(f"{where}: the row has {len(images)} image(s), and data.train_on=all_assistant_messages "
                              "trains every assistant turn of text-only conversations only", key="data.train_on",
                              hint="set data.train_on=last_assistant_message for rows with images (as SkyRL's "
                                   "vision-language SFT requires)")
    return images


def placed_prompt(row: dict[str, Any], prompt_key: str, image_key: str) -> tuple[str | list[dict[str, Any]], list[Any]]:
    """A row's prompt with one image placeholder per image (a text, or chat messages, each keeping
    the fields a chat template reads beside role and content: tool calls, a tool's name) and its
    images (the image column's, then the messages' image parts)."""
    where, prompt = row[ORIGIN], row[prompt_key]
    images = as_images(row.get(image_key))
    if isinstance(prompt, Mapping):
        raise ConfigError(f"{where}: column {prompt_key!r} (data.prompt_key) holds a struct, not a text or a list "
                          "of chat messages", key="data.prompt_key",
                          hint="give the prompt as text or as [{'role': 'user', 'content': ...}, ...]")
    if isinstance(prompt, list):  # chat messages, perhaps with image parts
        check_conversation(prompt, where, prompt_key)
        messages, parts = message_text(prompt, where)
        messages = [{**message_fields(given), **flat} for given, flat in zip(prompt, messages, strict=True)]
        images += parts
        return place_messages(messages, len(images)), images
    return place_images(str(prompt), len(images)), images


def check_conversation(messages: list[Any], where: str, prompt_key: str) -> None:
    """Refuse, naming the row (``where``: file and row), a chat-message prompt in the wrong
    layout: no messages, a message that is not a ``{"role", "content"}`` object, a role that is
    not a text."""
    column = f"column {prompt_key!r} (data.prompt_key)"
    hint = "give chat messages as [{'role': 'system' | 'user' | 'assistant', 'content': ...}, ...]"
    if not messages:
        raise ConfigError(f"{where}: {column} holds no messages", key="data.prompt_key", hint=hint)
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ConfigError(f"{where}: message {index} of {column} is a {type(message).__name__}, not a "
                              "{'role', 'content'} object", key="data.prompt_key", hint=hint)
        missing = [k for k in ("role", "content") if message.get(k) is None
                   and not (k == "content" and message.get("tool_calls"))]  # a tool call's content may be null
        if missing:
            raise ConfigError(f"{where}: message {index} of {column} has no {' or '.join(map(repr, missing))} "
                              f"(it holds: {', '.join(k for k, v in message.items() if v is not None) or 'nothing'})",
                              key="data.prompt_key", hint=hint)
        if not isinstance(message["role"], str):
            raise ConfigError(f"{where}: message {index} of {column} has the role {message['role']!r}, not a text",
                              key="data.prompt_key", hint=hint)


def text_only_policy(where: str, count: int, image_key: str) -> ConfigError:
    """The refusal of a row with images for a text-only policy."""
    return ConfigError(f"{where}: the row has {count} image(s) and the policy is a text-only model",
                       key="policy.model_name",
                       hint=f"use a vision-language model (builtin:tiny-vl, a Qwen2.5-VL or Qwen3-VL "
                            f"checkpoint), or drop the {image_key!r} column (data.image_key)")


def _exact_answer_in(column: str) -> Any:
    """The built-in ``exact_answer`` reward reading the answer from ``column`` (``data.answer_key``:
    a column, or a dotted path into a struct column)."""

    def exact_answer_in_column(completion: str, example: Any) -> float:
        return exact_answer(completion, {"answer": column_value(example, column)})

    return exact_answer_in_column


def read_system_prompt(path: str | None) -> str | None:
    """The system prompt ``data.system_prompt_file`` holds (None when unset)."""
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the system prompt file {path}: {exc.strerror}", key="data.system_prompt_file",
                          hint="give an existing text file") from None


def read_template(path: str | None) -> str | None:
    """The prompt template ``data.prompt_file`` names (``{}`` is where each prompt goes)."""
    if path is None:
        return None
    try:
        template = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the prompt file {path}: {exc.strerror}", key="data.prompt_file",
                          hint="give an existing text file with one {} where the prompt goes") from None
    try:
        template.format("")
    except (IndexError, KeyError, ValueError) as exc:
        raise ConfigError(f"the prompt file {path} is not a str.format template with one {{}} ({exc})",
                          key="data.prompt_file", hint="write {{ and }} for literal braces") from None
    return template


def check_columns(rows: list[dict[str, Any]], columns: dict[str, str], key: str, files: list[str]) -> None:
    if not rows:
        raise ConfigError(f"{', '.join(files)} holds no rows", key=key, hint="give a file with at least one example")
    present = sorted(c for c in rows[0] if c not in _INTERNAL)
    for setting, column in columns.items():
        top = _top_column(rows[0], column)
        if top not in rows[0]:
            named = f"column {column!r} (data.{setting})" if top == column else f"column {top!r} (data.{setting}={column})"
            raise ConfigError(f"{named} is not in {', '.join(files)}; columns: {', '.join(present)}",
                              key=f"data.{setting}", hint=f"set data.{setting} to one of: {', '.join(present)}"
                                                          + (" (a struct column's field as column.field)" if setting == "answer_key" else ""))
        for row in rows:
            gap = _path_gap(row, column)
            if gap is not None:
                raise ConfigError(f"{row[ORIGIN]}: {gap}, which data.{setting}={column} reads", key=f"data.{setting}",
                                  hint=f"give every row of {', '.join(files)} that field, or set data.{setting} to the "
                                       "path of the row's answer")
            if _get(row, column) is None:
                raise ConfigError(f"{row[ORIGIN]} has no {column!r} (data.{setting})", key=key,
                                  hint="give every row that column, or remove the row")


def split_rows(rows: list[dict[str, Any]], data: Any, columns: dict[str, str],
               rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Training and held-out rows: ``data.held_out_files`` (checked for ``columns``), else
    ``data.held_out_size`` rows (unset: a quarter, at most 32; at most half) cut off the shuffled
    training rows."""
    held_files = as_list(data.held_out_files)
    if held_files:
        held = read_held_rows(data)
        check_columns(held, columns, "data.held_out_files", held_files)
        return rows, held
    count = data.held_out_size if data.held_out_size is not None else max(1, min(32, len(rows) // 4))
    if count > len(rows) // 2:
        train_files = ", ".join(map(str, as_list(data.train_files)))
        raise ConfigError(
            f"{count} held-out rows would leave {max(len(rows) - count, 0)} of the "
            f"{len(rows)} rows of {train_files} for training (at most half are held out)",
            key="data.held_out_size",
            hint=f"give data.held_out_files, or data.held_out_size={max(len(rows) // 2, 1)} or less "
                 "(NeMo RL recipes: data.validation.data_path, or a smaller grpo.max_val_samples)")
    rows = rows[:]
    rng.shuffle(rows)
    if not rows[count:]:
        raise ConfigError("no training rows are left after the held-out split", key="data.held_out_size",
                          hint="add rows or lower data.held_out_size")
    return rows[count:], rows[:count]


class DatasetTask:
    """Rows with a prompt and an answer column; training prompts are drawn in shuffled epochs."""

    mixture: _Mixture | None = None  # several files drawn by data.train_file_weights

    def __init__(self, context: TaskContext) -> None:
        data = context.data
        self.tokenizer = context.tokenizer
        self.prompt_key, self.answer_key = data.prompt_key, data.answer_key
        self.reward_fn = context.reward or exact_answer
        if self.reward_fn is exact_answer and self.answer_key != "answer":
            self.reward_fn = _exact_answer_in(self.answer_key)
        self.response_key = data.response_key or data.answer_key
        self.train_on = getattr(data, "train_on", None)
        self.tools_key, self.system_key = getattr(data, "tools_key", None), getattr(data, "system_key", None)
        self.chat_template = data.apply_chat_template
        self.max_prompt_tokens = context.max_prompt_tokens
        self.image_key, self.images = data.image_key, context.images
        self.pixel_limit = image_pixel_limit(data.max_image_pixels, getattr(context.images, "processor_pixels", None))
        train_files = as_list(data.train_files)
        if data.hub_dataset and not train_files:
            raise ConfigError(f"{data.hub_dataset!r} is a Hugging Face Hub dataset, and nothing is downloaded",
                              key="data.hub_dataset", hint="give a local JSONL/Parquet file: data.train_files=train.jsonl "
                              "(in a NeMo RL recipe: data.train.data_path=train.jsonl)")
        self.template = read_template(data.prompt_file)
        self.system_prompt = read_system_prompt(data.system_prompt_file)
        if not train_files:
            raise ConfigError("the dataset task needs data.train_files", key="data.train_files",
                              hint="set data.train_files=path/to/train.jsonl (or .parquet)")
        if self.chat_template and not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError("data.apply_chat_template is set and the tokenizer has no chat template",
                              key="data.apply_chat_template",
                              hint="give one with policy.chat_template, or set data.apply_chat_template=false")
        if self.train_on == "all_assistant_messages" and not self.chat_template:
            raise ConfigError("data.train_on=all_assistant_messages cuts each assistant turn out of the chat template's "
                              "rendering, and data.apply_chat_template is false", key="data.train_on",
                              hint="set data.apply_chat_template=true (a tokenizer with a chat template, or "
                                   "policy.chat_template), or data.train_on=last_assistant_message")
        self.data = data
        columns = _columns(data)
        rows = read_train_rows(data)
        check_columns(rows, columns, "data.train_files", train_files)
        texts = {}  # what each prompt's ids encode, for the lost-text check
        for row in rows:  # every prompt encoded and checked, in file order, before training starts
            row[PROMPT_IDS], texts[id(row)] = self._encode_checked(row)
        self.rng = random.Random(context.seed)
        self.shuffle = data.shuffle
        self.train, self.held = split_rows(rows, data, columns, self.rng)
        for row in self.held:  # rows of data.held_out_files
            if PROMPT_IDS not in row:
                row[PROMPT_IDS], texts[id(row)] = self._encode_checked(row, "data.held_out_files")
        check_prompts(self.tokenizer, f"task {data.task!r}",
                      [(texts[id(row)], row[PROMPT_IDS], row[ORIGIN]) for row in [*self.train, *self.held]])
        self.order: list[int] = []
        self.position = 0
        weights = file_weights(data)
        self.mixture = None if weights is None else _Mixture(self.train, weights, self.rng, self.shuffle, train_files)

    def encode_prompt(self, text: str) -> list[int]:
        return self._encode(text)[0]

    def _encode(self, text: str) -> tuple[list[int], str]:
        if self.template is not None:
            text = self.template.format(text)
        return encode_prompt(self.tokenizer, text, self.chat_template, self.system_prompt)

    def _draw(self, count: int) -> list[dict[str, Any]]:
        if self.mixture is not None:
            return self.mixture.draw(count)
        drawn = []
        for _ in range(count):
            if self.position >= len(self.order):
                self.order = list(range(len(self.train)))
                if self.shuffle:
                    self.rng.shuffle(self.order)
                self.position = 0
            drawn.append(self.train[self.order[self.position]])
            self.position += 1
        return drawn

    def _prompt_of(self, row: dict[str, Any]) -> list[int]:
        return with_images(row[PROMPT_IDS], row.get(IMAGES))

    def _encode_checked(self, row: dict[str, Any], key: str = "data.train_files") -> tuple[list[int], str]:
        """The row's prompt ids (its images' placeholders expanded, the images kept in the row)
        and the text they encode, refused where it does not fit (naming ``key``, the setting of
        the file the row is in). A chat-message prompt comes after the row's system column's turn
        and with its tool schemas (``data.system_key``, ``data.tools_key``); with ``data.train_on``
        the prompt is the messages before the last assistant turn, and the row's demonstration is
        made here too."""
        where = row[ORIGIN]
        _check_conversation_row(row, self.data)
        placed, images = placed_prompt(row, self.prompt_key, self.image_key)
        tools = None
        if isinstance(placed, list):
            placed = with_system(placed, _get(row, self.system_key) if self.system_key else None)
            tools = row_tools(_get(row, self.tools_key), where, self.tools_key) if self.tools_key else None
        if self.train_on is not None and isinstance(placed, list):  # a text prompt: the response column's
            self._demonstrate(row, placed, tools)
            placed = placed[: trained_turns(placed, "last_assistant_message")[0]]
        ids, text = self._encode_messages(placed, where, tools) if isinstance(placed, list) else self._encode(placed)
        if images:
            if self.images is None:
                raise text_only_policy(where, len(images), self.image_key)
            decoded = decode_all(images, Path(row.get(FOLDER, ".")), where, self.pixel_limit)
            pixels = self.images.encode(decoded, where)
            ids, text = self.images.expand(ids, pixels, where, key), self.images.expand_text(text, pixels)
            row[IMAGES] = pixels
        elif self.images is not None:  # placeholders without images are refused too
            self.images.expand(ids, None, where, key)
        check_prompt_fits(ids, self.max_prompt_tokens, where, ", or shorten or remove that row")
        return ids, text

    def _demonstrate(self, row: dict[str, Any], messages: list[dict[str, Any]], tools: list[Any] | None) -> None:
        """``data.train_on``: the row's demonstration under :data:`DEMONSTRATION` (its prompt ids
        where they are not the row's prompt, the trained turns' ids, their 0/1 mask where some
        are context), and its last assistant turn's content as its answer where the row has no
        answer column (the held-out reward's)."""
        where, last = row[ORIGIN], messages[trained_turns(messages, "last_assistant_message")[0]]
        if _get(row, self.answer_key) is None:
            row[self.answer_key] = last["content"]
        if not self.chat_template:  # last_assistant_message: the turn's text after the prompt's paragraphs
            response = list(self.tokenizer.encode(" " + last["content"], add_special_tokens=False))
            row[DEMONSTRATION] = (None, [*response, self.tokenizer.eos_token_id], None)
            return
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []

        def render(part: Any, prompt: bool) -> str:
            return chat_text(self.tokenizer, [*system, *part], prompt, tools)

        turns = trained_turns(messages, self.train_on)
        try:
            prompt, pieces = trained_pieces(render, messages, turns, where, self.train_on)
        except ConfigError:
            raise
        except Exception as exc:  # the template's own refusal (jinja's raise_exception), kept as the cause
            raise _template_refusal(where, "the row's", [*system, *messages], exc) from exc
        response, mask = encode_pieces(self.tokenizer, pieces)
        if not any(mask):
            raise ConfigError(f"{where}: the chat template renders nothing for the assistant turn(s) data.train_on="
                              f"{self.train_on} trains", key="data.train_on",
                              hint="give the assistant turns content (or tool calls the template writes)")
        first_prompt = None if len(turns) == 1 else encode_text(self.tokenizer, prompt)
        row[DEMONSTRATION] = (first_prompt, response, None if all(mask) else mask)

    def _encode_messages(self, messages: list[dict[str, Any]], where: str,
                         tools: list[Any] | None = None) -> tuple[list[int], str]:
        """A chat-format prompt's ids: the conversation (after the system prompt, when set) through
        the chat template where the task uses one, the model's turn starting after it; else the
        messages' contents, one paragraph each. A conversation the template refuses to render
        (roles out of order, a role it does not know) is refused naming the row (``where``)."""
        if self.chat_template:
            system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
            try:
                text = chat_text(self.tokenizer, [*system, *messages], True, tools)
            except Exception as exc:  # the template's own refusal (jinja's raise_exception), kept as the cause
                raise _template_refusal(where, "the prompt's", [*system, *messages], exc) from exc
            return encode_text(self.tokenizer, text), text
        return self._encode("\n\n".join(m["content"] for m in messages))

    @property
    def train_rows(self) -> int:
        """The training rows one epoch draws (``algorithm.max_epochs`` counts by them; with
        ``data.train_file_weights``, as many draws as the files hold rows)."""
        return len(self.train)

    def sample(self, count: int) -> tuple[list[list[int]], list[Any]]:
        rows = self._draw(count)
        return [self._prompt_of(row) for row in rows], [_public(row) for row in rows]

    def held_out(self) -> tuple[list[list[int]], list[Any]]:
        return [self._prompt_of(row) for row in self.held], [_public(row) for row in self.held]

    def demonstrations(self, count: int) -> list[tuple[list[int], list[int]]]:
        """``count`` training rows' (prompt ids, response ids) pairs: the prompt and the response
        column (``data.response_key``), or with ``data.train_on`` the conversation's: the messages
        before the trained turn and that turn, or (``all_assistant_messages``) the messages before
        the first assistant turn and the rest of the conversation, with a third element, a 0/1
        mask over the response, 1 on its assistant turns' ids (as
        :func:`corerl.algorithms.batches.pairs_to_batch` reads it), cut at the end of
        ``policy.max_seq_length`` tokens; a text prompt's, with ``data.train_on`` too, the response
        column's."""
        demonstrations: list[Any] = []
        for row in self._draw(count):
            if DEMONSTRATION not in row:  # the response column's (a text prompt with data.train_on too)
                demonstrations += self._responses([row])
                continue
            prompt, response, mask = row[DEMONSTRATION]
            prompt = self._prompt_of(row) if prompt is None else prompt
            if self.max_prompt_tokens is not None:  # cut at policy.max_seq_length, as SkyRL's max_length cuts
                room = self.max_prompt_tokens + 1 - len(prompt)  # the prompt fits: at least one token
                response, mask = response[:room], None if mask is None else mask[:room]
            demonstrations.append((prompt, response) if mask is None else (prompt, response, mask))
        return demonstrations

    def _responses(self, rows: list[dict[str, Any]]) -> list[tuple[list[int], list[int]]]:
        """Each row's prompt and its response column's text (after a space), then end-of-sequence."""
        pairs = []
        for row in rows:
            response_text = _get(row, self.response_key)
            if response_text is None:
                raise ConfigError(f"SFT needs column {self.response_key!r} (data.response_key)", key="data.response_key",
                                  hint=f"set data.response_key to one of: {', '.join(sorted(set(row) - set(_INTERNAL)))}")
            response = list(self.tokenizer.encode(" " + str(response_text), add_special_tokens=False))
            pairs.append((self._prompt_of(row), [*response, self.tokenizer.eos_token_id]))
        return pairs

    def reward(self, sample: Sample, example: Any) -> float:
        row = example.origin if isinstance(example, _Example) else None
        return score(self.reward_fn, decode_completion(self.tokenizer, sample), example, "data.reward", row)

    def state(self) -> Any:
        state = {"rng": rng_state(self.rng), "order": self.order, "position": self.position}
        if self.mixture is not None:
            state["mixture"] = self.mixture.state()
        return state

    def set_state(self, state: Any) -> None:
        restore_rng(self.rng, state["rng"])
        self.order, self.position = list(state["order"]), int(state["position"])
        if self.mixture is not None and "mixture" in state:
            self.mixture.set_state(state["mixture"])


def _template_refusal(where: str, whose: str, messages: list[dict[str, Any]], exc: Exception) -> ConfigError:
    """The one line for a conversation the chat template refuses to render (roles out of order, a
    role it does not know), naming the row (``where``) and the roles it was given."""
    roles = ", ".join(m["role"] for m in messages)
    return ConfigError(f"{where}: the chat template cannot render {whose} conversation (roles: {roles}): "
                       f"{first_line(exc)}", key="data.prompt_key",
                       hint="give messages with the roles, in the order, the model's chat template takes, or "
                            "another template with policy.chat_template")


class _Mixture:
    """Training rows drawn from several files in proportion to ``data.train_file_weights``,
    whatever the files' sizes: each row goes to the file furthest behind its share of the rows
    drawn so far (smooth weighted round robin: in every run of draws each file's count is within
    one of its share), and each file's rows are drawn in epochs of their own (a small file is
    repeated sooner)."""

    def __init__(self, rows: list[dict[str, Any]], weights: list[float], rng: random.Random, shuffle: bool,
                 files: list[str]) -> None:
        self.pools: list[list[dict[str, Any]]] = [[] for _ in weights]
        for row in rows:
            self.pools[row[SOURCE]].append(row)
        for name, pool in zip(files, self.pools, strict=True):
            if not pool:
                raise ConfigError(f"{name} has no training rows left (after data.train_rows, data.max_train_rows "
                                  "and the held-out cut), and data.train_file_weights draws from it",
                                  key="data.train_file_weights", hint="give that file rows to train on, or leave it "
                                  "out of data.train_files and data.train_file_weights")
        self.weights = weights
        self.credit = [0.0] * len(weights)
        self.epochs = [Epochs(len(pool), rng, shuffle) for pool in self.pools]

    def draw(self, count: int) -> list[dict[str, Any]]:
        drawn = []
        for _ in range(count):
            self.credit = [credit + weight for credit, weight in zip(self.credit, self.weights, strict=True)]
            source = max(range(len(self.credit)), key=self.credit.__getitem__)
            self.credit[source] -= 1.0
            drawn.append(self.pools[source][self.epochs[source].draw(1)[0]])
        return drawn

    def state(self) -> Any:
        return {"credit": self.credit, "epochs": [epochs.state() for epochs in self.epochs]}

    def set_state(self, state: Any) -> None:
        self.credit = [float(credit) for credit in state["credit"]]
        for epochs, saved in zip(self.epochs, state["epochs"], strict=True):
            epochs.set_state(saved)


class _Example(dict):  # type: ignore[type-arg]
    """A row as reward functions see it (its columns), remembering where it came from."""

    origin: str | None = None


def _public(row: dict[str, Any]) -> _Example:
    example = _Example((k, v) for k, v in row.items() if k not in _INTERNAL)
    example.origin = row.get(ORIGIN)
    return example
