"""Prompt token ids together with the text they encode, so that a task can tell whether the
tokenizer lost any of it (:func:`corerl.reporting.lost_text.check_prompts`).

:func:`encode_prompt` gives the ids the ``dataset`` task's ``render_prompt`` gives (a chat
template is rendered to text, then encoded without special tokens, as
``apply_chat_template(tokenize=True)`` does) and the text they came from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from corerl.errors import ConfigError


def chat_text(tokenizer: Any, messages: Sequence[Any], prompt: bool, tools: list[Any] | None = None) -> str:
    """``messages`` rendered with the tokenizer's chat template (the assistant's prompt after
    them when ``prompt``), ``tools`` its tools argument where given."""
    extra = {} if tools is None else {"tools": tools}
    return str(tokenizer.apply_chat_template(list(messages), add_generation_prompt=prompt, tokenize=False, **extra))


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """The ids of ``text``, no special tokens added."""
    return list(tokenizer.encode(text, add_special_tokens=False))


def encode_prompt(tokenizer: Any, text: str, chat_template: bool, system_prompt: str | None) -> tuple[list[int], str]:
    """Prompt token ids and the text they encode: ``text`` as the user's message of the chat
    template (after the system prompt, when set), or without one ``<bos>``, the system prompt as
    the first paragraph and ``text``."""
    if chat_template:
        system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        rendered = chat_text(tokenizer, [*system, {"role": "user", "content": text}], prompt=True)
        return encode_text(tokenizer, rendered), rendered
    if system_prompt:  # no chat template: the system prompt is the text's first paragraph
        text = f"{system_prompt}\n\n{text}"
    ids = encode_text(tokenizer, text)
    bos = tokenizer.bos_token_id
    return ([bos, *ids] if bos is not None else ids), text


def check_prompt_fits(ids: Sequence[int], limit: int | None, where: str, hint_tail: str = "") -> None:
    """Refuse, naming ``where`` (the row), a prompt of more than ``limit`` tokens (those that leave
    room for a completion within ``policy.max_seq_length``): refused, not truncated, since a cut
    prompt asks another question. ``hint_tail`` adds to the hint what else the user can do."""
    if limit is not None and len(ids) > limit:
        raise ConfigError(f"{where}: the prompt is {len(ids)} tokens, more than the {limit} that leave room for a "
                          "completion within policy.max_seq_length", key="policy.max_seq_length",
                          hint=f"prompts are not truncated: raise policy.max_seq_length by at least "
                               f"{len(ids) - limit}{hint_tail}")
