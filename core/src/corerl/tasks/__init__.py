"""Tasks and rewards: where prompts, held-out prompts and SFT demonstrations come from, and
how completions are scored.

A task is registered through ``corerl_register_tasks`` and named by ``data.task``; a reward
through ``corerl_register_rewards`` (or given by import path) and named by ``data.reward``.
The core registers ``digit_echo`` (made in code), ``dataset`` (JSONL/Parquet/CSV files) and the
``exact_answer`` reward.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import attrs

from corerl.generation.contract import Sample

TextReward = Callable[[str, Mapping[str, Any]], float]
"""A reward function: ``fn(completion_text, example) -> float``; ``example`` is the dataset row."""


@attrs.frozen
class TaskContext:
    """What a task factory receives: the tokenizer, the run's seed, the ``data`` config
    section, the reward ``data.reward`` names (None when unset: the task's own default), the
    longest prompt, in tokens, that leaves room for the completion (a task refuses longer ones)
    and, for a vision-language policy, its :class:`~corerl.models.vision.ImageEncoder` (None for a
    text-only model: a task with images refuses it). A task's prompt with images is an
    :class:`~corerl.generation.contract.ImagePrompt` (contract 2.13)."""

    tokenizer: Any
    seed: int
    data: Any
    reward: TextReward | None = None
    max_prompt_tokens: int | None = None  # the longest prompt that leaves room for a completion
    images: Any = None  # the policy's ImageEncoder when it is a vision-language model


@runtime_checkable
class TaskSource(Protocol):
    """The methods a task object provides to the algorithms (prompts are token ids)."""

    def sample(self, count: int) -> tuple[list[list[int]], list[Any]]:
        """``count`` training prompts and the example each came from."""

    def held_out(self) -> tuple[list[list[int]], list[Any]]:
        """The held-out prompts (evaluated greedily before and after training) and their examples."""

    def demonstrations(self, count: int) -> list[tuple[list[int], list[int]]]:
        """``count`` (prompt ids, response ids) pairs for SFT; the response ends with end-of-sequence.
        A multi-turn demonstration adds a third element, a 0/1 mask over the response: 0 marks
        an environment's tokens, which SFT does not train on."""

    def reward(self, sample: Sample, example: Any) -> float:
        """The reward of one completion."""

    def state(self) -> Any:
        """The sampler's position, JSON-serialisable (saved with checkpoints)."""

    def set_state(self, state: Any) -> None:
        """Restore what :meth:`state` returned."""

    # Optional: ``train_rows`` (int), the training rows one pass over the training set draws, which
    # ``algorithm.max_epochs`` counts epochs by (:mod:`corerl.run.epochs`); a task without it
    # (one that makes up its prompts) has no epochs, and max_epochs is refused for it.


def rng_state(rng: random.Random) -> list[Any]:
    """A ``random.Random``'s state as JSON (for :meth:`TaskSource.state`)."""
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def restore_rng(rng: random.Random, state: list[Any]) -> None:
    """Undo :func:`rng_state`."""
    version, internal, gauss = state
    rng.setstate((version, tuple(internal), gauss))


class Epochs:
    """Draws the indices ``0 .. size - 1`` epoch after epoch, each epoch in an order ``rng``
    shuffles (in index order when ``shuffle`` is off); its position and ``rng`` are the state a
    task saves with checkpoints (:meth:`TaskSource.state`)."""

    def __init__(self, size: int, rng: random.Random, shuffle: bool = True) -> None:
        self.size, self.rng, self.shuffle = size, rng, shuffle
        self.order: list[int] = []
        self.position = 0

    def draw(self, count: int) -> list[int]:
        """The next ``count`` indices."""
        drawn = []
        for _ in range(count):
            if self.position >= len(self.order):
                self.order = list(range(self.size))
                if self.shuffle:
                    self.rng.shuffle(self.order)
                self.position = 0
            drawn.append(self.order[self.position])
            self.position += 1
        return drawn

    def state(self) -> Any:
        """The position and the generator's state, as JSON."""
        return {"rng": rng_state(self.rng), "order": self.order, "position": self.position}

    def set_state(self, state: Any) -> None:
        """Restore :meth:`state`."""
        restore_rng(self.rng, state["rng"])
        self.order, self.position = list(state["order"]), int(state["position"])


def column_value(row: Mapping[str, Any], key: str) -> Any:
    """Column ``key`` of ``row``; where no column has that name and ``key`` is a dotted path
    (``reward_spec.ground_truth``), the value at that path in the row's nested dicts (a struct
    column). A missing column or step raises ``KeyError(key)``. What ``data.answer_key``
    names is read with it (the dataset task's rewards and SFT responses)."""
    if key in row or "." not in key:
        return row[key]
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise KeyError(key)
        value = value[part]
    return value


def decode_completion(tokenizer: Any, sample: Sample) -> str:
    """The completion's text, special tokens (the final end-of-sequence) left out."""
    return tokenizer.decode(list(sample.completion_ids), skip_special_tokens=True)


def score(reward: TextReward, text: str, example: Mapping[str, Any], where: str, row: str | None = None) -> float:
    """Call a user reward function; what it raises, or a value that is not a finite number, stops
    the run in one line naming the function and, where known, the example's row (``row``)."""
    import math
    import numbers

    from corerl.errors import RunError

    name = getattr(reward, "__qualname__", None) or type(reward).__name__
    at = f" on {row}" if row else ""
    try:
        value = reward(text, example)
    except Exception as exc:  # the user's code: reported where it happened, the cause kept for CORERL_DEBUG=1
        raise RunError(f"reward function {name} raised {type(exc).__name__}: {exc}{at}", key=where,
                       hint="fix the function (CORERL_DEBUG=1 shows the traceback)") from exc
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise RunError(f"reward function {name} returned {value!r} ({type(value).__name__}){at}; it must return a number",
                       key=where, hint="return a float for every completion")
    if not math.isfinite(value):
        raise RunError(f"reward function {name} returned {value}{at}; rewards must be finite", key=where,
                       hint="return a finite float for every completion")
    return float(value)
