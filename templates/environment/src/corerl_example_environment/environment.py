"""The ``digit_guess`` environment: the row holds a digit; the model guesses it, turn after turn.

A right guess ends the episode with reward 1 minus ``turn_penalty`` per wrong guess before it; a
wrong one is answered with a hint (the ``higher`` or ``lower`` setting) and the episode goes on. What an
episode remembers (its wrong guesses) travels in ``Turn.state``, never on this object, which
answers every episode of a run in any order (and, with ``env.digit_guess.num_workers``, in Ray
actors: the state must pickle). A row without a digit raises: the run counts the episode in
``env/failures`` and names the row, instead of scoring it 0 in silence.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corerl.sdk import EnvironmentContext, EpisodeView, Turn


def last_digit(text: str) -> int | None:
    """The model's guess: the last word of its turn that is a digit (None when there is none)."""
    for word in reversed(text.split()):
        word = word.strip(".,!?:")
        if len(word) == 1 and word.isdigit():
            return int(word)
    return None


class DigitGuess:
    """Answers each model turn of a digit-guessing episode (see the module's docstring)."""

    def __init__(self, context: EnvironmentContext) -> None:
        settings = context.settings
        self.hints, self.penalty = settings.hints, settings.turn_penalty
        self.higher, self.lower = settings.higher, settings.lower
        # the dataset task's answer column (data.answer_key); the digit_echo task's rows are the digit itself
        self.answer_key = getattr(context.data, "answer_key", "answer") if context.data is not None else "answer"

    def target(self, row: Any) -> int:
        value = row.get(self.answer_key) if isinstance(row, Mapping) else row
        if isinstance(value, bool) or not str(value).strip().isdigit() or len(str(value).strip()) != 1:
            raise ValueError(f"the row's {self.answer_key!r} is {value!r}, not a digit to guess; use a task whose rows "
                             "carry one (digit_echo, or a dataset with data.answer_key)")
        return int(str(value).strip())

    def step(self, episode: EpisodeView) -> Turn:
        target = self.target(episode.row)
        wrong = (episode.state or {}).get("wrong", 0)
        guess = last_digit(episode.response)
        if guess == target:
            return Turn(reward=max(0.0, 1.0 - self.penalty * wrong), done=True, state={"wrong": wrong})
        state = {"wrong": wrong + 1}
        if guess is None or self.hints == "none":
            return Turn(observation=" ?", state=state)
        hint = self.higher if guess < target else self.lower
        if self.hints == "messages":  # rendered with the chat template, after the model's turn
            return Turn(observation=[{"role": "user", "content": hint}], state=state)
        return Turn(observation=f" {hint}", state=state)
