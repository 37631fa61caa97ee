"""Text a tokenizer lost in encoding, said once and counted: a prompt or observation whose words
the tokenizer does not know (the built-in tiny models know only their own few words: " higher"
becomes ``<unk>``) reaches the model as something else, and nothing else would say so.

A task checks its prompts with :func:`check_prompts` when it encodes them (one warning naming
the task, with how many and the first); a rollout checks each observation with
:func:`check_observation` (one warning per environment) and counts, per step, the prompts
(:func:`prompts_lost`) and observations that lost text in the ``encoding/lost_text`` metric.
What was seen is kept per tokenizer object, which is one run's: a task and the rollouts of a
run share it, and another run starts afresh. The warnings go through the ``corerl`` logger, so
a quiet run shows them on the terminal and writes them to ``run.log``.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

from corerl.models.tokenizer import lost_text

log = logging.getLogger(__name__)

#: the metric: a step's prompts and observations whose encoding lost text
METRIC = "encoding/lost_text"


class LostText:
    """What one tokenizer lost: the prompts (by their ids) and who was warned about already."""

    def __init__(self) -> None:
        self.prompts: set[tuple[int, ...]] = set()
        self.warned: set[str] = set()
        self.lock = threading.Lock()  # observations are checked from an endpoint's threads too

    def first_time(self, where: str) -> bool:
        """True once per ``where``."""
        with self.lock:
            if where in self.warned:
                return False
            self.warned.add(where)
            return True


_SEEN: weakref.WeakKeyDictionary[Any, LostText] = weakref.WeakKeyDictionary()
_SEEN_LOCK = threading.Lock()


def seen_by(tokenizer: Any) -> LostText:
    """The record of ``tokenizer`` (made on first use)."""
    with _SEEN_LOCK:
        record = _SEEN.get(tokenizer)
        if record is None:
            record = _SEEN[tokenizer] = LostText()
        return record


def check_prompts(tokenizer: Any, task: str, prompts: Iterable[tuple[str, Sequence[int], str]],
                  what: str = "prompts") -> int:
    """How many of ``prompts`` (text, its ids, where it came from) lost text in encoding; when
    any did, one warning naming ``task`` (e.g. ``"task 'dataset'"``), how many and the first,
    and they count in :data:`METRIC` whenever a step draws them. ``what`` names them in the
    warning (a preference task's ``"prompts and responses"``)."""
    record = seen_by(tokenizer)
    total, lost = 0, []
    for text, ids, label in prompts:
        total += 1
        if lost_text(tokenizer, text, ids):
            lost.append((text, ids, label))
            with record.lock:
                record.prompts.add(tuple(ids))
    if lost and record.first_time(task):
        text, ids, label = lost[0]
        log.warning("%s: %d of %d %s lost text in encoding (the first, %s: %s); the model never sees that text, "
                    "and %s counts such prompts each step; %s", task, len(lost), total, what, label,
                    difference(tokenizer, text, ids), METRIC, advice(tokenizer))
    return len(lost)


def check_observation(tokenizer: Any, environment: str, text: str, ids: Sequence[int]) -> bool:
    """Whether an observation of ``environment`` (e.g. ``"environment 'guess'"``) lost text in
    encoding; the first time it does, one warning naming the environment."""
    if not lost_text(tokenizer, text, ids):
        return False
    if seen_by(tokenizer).first_time(environment):
        log.warning("%s: an observation lost text in encoding (%s); the model never sees that text, and %s counts "
                    "such observations each step; %s", environment, difference(tokenizer, text, ids), METRIC,
                    advice(tokenizer))
    return True


def prompts_lost(tokenizer: Any, prompts: Sequence[Sequence[int]]) -> int:
    """How many of a step's ``prompts`` are ones a task found had lost text."""
    record = seen_by(tokenizer)
    if not record.prompts:
        return 0
    return sum(tuple(p) in record.prompts for p in prompts)


def advice(tokenizer: Any) -> str:
    """How to fix it: a tokenizer that knows the text (a built-in tiny model's knows only its own words)."""
    text = "use a model whose tokenizer knows the text"
    if (getattr(tokenizer, "vocab_size", None) or 1 << 20) <= 256:
        text += " (a built-in tiny model's tokenizer knows only digits, a few signs and the words w0, w1, ...)"
    return text


def difference(tokenizer: Any, text: str, ids: Sequence[int], words: int = 4) -> str:
    """Where ``text`` and the decoding of its ``ids`` part, a few words of each: ``'higher'
    reads back as '<unk>'``."""
    given = text.split()
    read = tokenizer.decode(list(ids), skip_special_tokens=False).split()
    if read and read[0] == getattr(tokenizer, "bos_token", None) and given[:1] != read[:1]:
        read = read[1:]  # the <bos> a prompt's ids begin with
    start = next((i for i, (a, b) in enumerate(zip(given, read, strict=False)) if a != b), min(len(given), len(read)))
    return f"{_shown(given[start:start + words])!r} reads back as {_shown(read[start:start + words])!r}"


def _shown(words: list[str], limit: int = 60) -> str:
    text = " ".join(words)
    return text if len(text) <= limit else text[: limit - 3] + "..."
