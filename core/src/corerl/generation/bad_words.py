"""Banned words at generation (``policy.generation.bad_words``, NeMo RL's key of that name).

A completion never holds a banned word. Each word is banned as the tokenizer writes it on its
own and, where that differs, after a space (mid-text), the rule vLLM's ``SamplingParams.bad_words``
follows: so the hf backend (transformers' ``bad_words_ids``, from :func:`banned_sequences`) and
vllm (its own ``bad_words``) ban the same token sequences. A generation backend takes them by
setting ``accepts_bad_words = True`` (contract 2.18); for another, the recipe is refused at
validation (:func:`check_bad_words_chosen`) rather than the words being sampled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from corerl.errors import ConfigError


def banned_sequences(tokenizer: Any, words: Sequence[str]) -> list[list[int]]:
    """The token sequences that ``words`` ban: each word stripped of leading space, encoded alone,
    and with one space before it where that gives another first token and as many tokens. A word
    the tokenizer writes as no token is refused in one line (vLLM refuses it too)."""
    banned: list[list[int]] = []
    for word in words:
        alone = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        if not alone:
            raise ConfigError(f"{word!r} is no token of the policy's tokenizer, so there is nothing to ban",
                              key="policy.generation.bad_words", hint="remove it")
        banned.append(alone)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        if spaced and spaced[0] != alone[0] and len(spaced) == len(alone):
            banned.append(spaced)
    return banned


def check_bad_words_chosen(config: Any, chosen: Any) -> None:
    """The validation table's row: banned words need a generation backend that bans them."""
    words = config.core.policy.generation.bad_words
    registration = chosen.generation_backend
    if not words or registration is None or getattr(registration.load(), "accepts_bad_words", False):
        return
    raise ConfigError(f"generation backend {registration.id!r} does not ban words at generation",
                      key="policy.generation.bad_words",
                      hint="sample with a backend that bans words (policy.generation.backend=hf does), or remove "
                           "the key")
