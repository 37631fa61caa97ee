"""Conversation rows for SFT (``data.train_on``): a row's chat messages are the conversation to
learn, its assistant turns the tokens trained, the rest context (SkyRL's SFT rows: a ``messages``
column, optional per-row ``tools`` and ``system`` columns).

A conversation is rendered with the chat template as the model sees it: the row's system column
put first as a system turn where the messages do not start with one, its tool schemas passed as
the template's ``tools`` argument. The prompt is the rendering of the messages before the (first)
trained assistant turn with the generation prompt; each trained turn is the text the template adds
for it after that (its content, tool calls and end-of-turn marker as the template writes them, no
extra end-of-sequence token). With ``all_assistant_messages`` the turns between them (user, tool)
are untrained context in the same sequence: the response carries a 0/1 mask, the loss over it the
loss over exactly those assistant tokens. The text is cut into prompt, context and trained pieces
and each piece encoded on its own (the same pieces SkyRL's rendering-by-prefix gives), so a
tokenizer that merges across the cut (a template putting no special token between a turn's header
and its text) could encode a boundary differently from one encoding of the whole text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from corerl.errors import ConfigError

#: the values of ``data.train_on`` (SkyRL's ``train_on_what``)
TRAIN_ON = ("last_assistant_message", "all_assistant_messages")

_MESSAGE_HINT = "give chat messages as [{'role': 'system' | 'user' | 'assistant', 'content': ...}, ...]"


def assistant_turns(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """The indices of the assistant messages of ``messages``."""
    return [index for index, message in enumerate(messages) if message.get("role") == "assistant"]


def trained_turns(messages: Sequence[Mapping[str, Any]], train_on: str) -> list[int]:
    """The assistant turns ``train_on`` trains: the last one, or every one (none: an empty list)."""
    turns = assistant_turns(messages)
    return turns[-1:] if train_on == "last_assistant_message" else turns


def not_a_conversation(value: Any, where: str, prompt_key: str, train_on: str, response_key: str) -> ConfigError:
    """The refusal of a row ``data.train_on`` cannot learn: its prompt column not a list of chat
    messages, and no response column either (a text prompt's response)."""
    return ConfigError(f"{where}: column {prompt_key!r} (data.prompt_key) holds a {type(value).__name__}, not a list of "
                       f"chat messages, and the row has no {response_key!r} column (data.response_key) to learn after "
                       f"it (data.train_on={train_on})", key="data.prompt_key", hint=_MESSAGE_HINT)


def check_learnable(messages: list[Any], where: str, prompt_key: str, train_on: str) -> None:
    """Refuse, naming the row (``where``), a conversation ``data.train_on`` cannot learn: no
    assistant turn after another message (the messages' layout itself is
    :func:`corerl.tasks.dataset.check_conversation`'s)."""
    column = f"column {prompt_key!r} (data.prompt_key)"
    turns = trained_turns([m for m in messages if isinstance(m, Mapping)], train_on)
    if not turns:
        roles = ", ".join(str(m.get("role")) for m in messages if isinstance(m, Mapping)) or "none"
        raise ConfigError(f"{where}: {column} holds no assistant turn to train on (roles: {roles}; data.train_on="
                          f"{train_on})", key="data.prompt_key",
                          hint="give every row an assistant message to learn, or remove the row")
    if turns[0] == 0:
        raise ConfigError(f"{where}: {column} starts with the assistant turn data.train_on={train_on} trains, which "
                          "answers nothing", key="data.prompt_key",
                          hint="start the conversation with a system or user message")


def with_system(messages: list[dict[str, Any]], system: Any) -> list[dict[str, Any]]:
    """``messages`` after a system turn holding ``system`` (the row's system column), where they
    do not start with one and the row gives one."""
    if system is None or system == "" or (messages and messages[0].get("role") == "system"):
        return messages
    return [{"role": "system", "content": str(system)}, *messages]


def row_tools(value: Any, where: str, tools_key: str) -> list[Any] | None:
    """A row's tool schemas (``data.tools_key``): a list, or a JSON text of a list or of one
    schema; None where the row has none. Null fields (a Parquet struct column's padding) dropped."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ConfigError(f"{where}: column {tools_key!r} (data.tools_key) holds a text that is not JSON ({exc})",
                              key="data.tools_key", hint="give the tool schemas as a list, or as its JSON text") from None
    if isinstance(value, Mapping):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(tool, Mapping) for tool in value):
        raise ConfigError(f"{where}: column {tools_key!r} (data.tools_key) holds a {type(value).__name__}, not a list "
                          "of tool schemas", key="data.tools_key",
                          hint="give [{'type': 'function', 'function': {'name': ..., 'parameters': ...}}, ...]")
    return [_without_nulls(tool) for tool in value] or None


def message_fields(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message's fields other than role and content that the chat template reads (tool calls,
    a tool's name or call id, reasoning), null ones dropped (a Parquet struct column gives every
    message every field) and tool calls given as JSON text parsed."""
    fields = {key: value for key, value in message.items() if key not in ("role", "content") and value is not None}
    calls = fields.get("tool_calls")
    if isinstance(calls, str):
        try:
            calls = json.loads(calls) if calls.strip() else None
        except ValueError:
            pass  # left as the text the row gives: the template renders it, or refuses it naming the row
        if isinstance(calls, Mapping):
            calls = [calls]
    if calls is None:
        fields.pop("tool_calls", None)
    elif isinstance(calls, list):
        fields["tool_calls"] = [_without_nulls(call) for call in calls]
    else:
        fields["tool_calls"] = calls
    return fields


def _without_nulls(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_without_nulls(item) for item in value]
    return value


def trained_pieces(render: Callable[[Sequence[Mapping[str, Any]], bool], str], messages: Sequence[Mapping[str, Any]],
                   turns: Sequence[int], where: str, train_on: str) -> tuple[str, list[tuple[str, bool]]]:
    """The prompt text (``render`` of the messages before the first of ``turns``, with the
    generation prompt) and the text after it up to the end of the last of ``turns``, in pieces
    ``(text, trained)``: each trained turn the text its rendering adds after the generation
    prompt, the turns between them untrained. Refused, naming the row, where the template renders
    the conversation so far differently once a turn follows (one that rewrites earlier turns, as
    templates dropping past reasoning do): no piece of one rendering is that turn."""
    prompt = render(messages[: turns[0]], True)
    done, pieces = prompt, []
    for turn in turns:
        before = render(messages[:turn], True)
        after = render(messages[: turn + 1], False)
        if not before.startswith(done) or not after.startswith(before):
            raise ConfigError(f"{where}: the chat template renders the conversation before assistant turn {turn} "
                              "differently once that turn follows, so its tokens are not a piece of one rendering "
                              f"(data.train_on={train_on})", key="data.train_on",
                              hint="use data.train_on=last_assistant_message, or a template that renders each turn "
                                   "the same whatever follows (policy.chat_template)")
        if len(before) > len(done):
            pieces.append((before[len(done):], False))
        pieces.append((after[len(before):], True))
        done = after
    return prompt, pieces


def encode_pieces(tokenizer: Any, pieces: Sequence[tuple[str, bool]]) -> tuple[list[int], list[int]]:
    """The ids of ``pieces``, each encoded on its own (no special tokens added), and a 0/1 mask
    over them: 1 on the trained pieces' ids."""
    ids: list[int] = []
    mask: list[int] = []
    for text, trained in pieces:
        piece = list(tokenizer.encode(text, add_special_tokens=False))
        ids += piece
        mask += [int(trained)] * len(piece)
    return ids, mask
