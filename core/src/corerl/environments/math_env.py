"""``math``: one turn, the answer checked by Hugging Face's ``math-verify`` (NeMo RL's
``env.math`` with ``math_verify_impl: hf_math_verify``); with ``env.math.verifier_type``
``english_multichoice`` or ``multilingual_multichoice``, the option letter after an answer marker
(:mod:`corerl.environments.multichoice`).

The gold answer is the row's answer column (``data.answer_key``); the reward is 1 when
``math_verify.verify`` finds the model's answer (a ``\\boxed{}`` expression, LaTeX or a plain
number anywhere in the turn) equal to it, else 0. math-verify's own timeouts use signals, which
work in a process's main thread only; corerl runs steps in threads (and in Ray actors), so they
are off here and ``env.math.timeout_s`` bounds a step instead.
"""

from __future__ import annotations

import re
from typing import Any

from corerl.environments import multichoice
from corerl.environments.contract import EnvironmentContext, EpisodeView, Turn
from corerl.errors import EngineNotAvailable
from corerl.tasks import column_value


class MathEnvironment:
    """Verifies the model's one answer against the row's gold answer."""

    def __init__(self, context: EnvironmentContext) -> None:
        try:
            import math_verify
        except ImportError as exc:
            raise EngineNotAvailable("the math environment needs the math-verify package",
                                     hint="pip install 'math-verify==0.9.0' (scripts/setup.sh installs it)") from exc
        self.parse, self.verify = math_verify.parse, math_verify.verify
        self.answer_key = getattr(context.data, "answer_key", "answer") if context.data is not None else "answer"
        self.dapo = getattr(context.settings, "math_verify_impl", "hf_math_verify") == "dapo_math_verify"
        self.verifier = getattr(context.settings, "verifier_type", "math")

    def correct(self, response: str, gold: Any) -> bool:
        if self.verifier in multichoice.VERIFIERS:
            return multichoice.correct(response, gold, self.verifier)
        if self.dapo:
            answer = dapo_answer(response)
            if answer is None:
                return False
            if normalised(answer) == normalised(str(gold)):
                return True
            response = answer  # then as mathematics: "1/2" against "\\frac{1}{2}"
        target = self.parse(str(gold), parsing_timeout=None)  # type: ignore[arg-type]
        if not target:  # a gold answer math-verify cannot read as math: compare it as text
            target = [str(gold)]
        answer = self.parse(response, parsing_timeout=None)  # type: ignore[arg-type]
        return bool(answer) and bool(self.verify(target, answer, timeout_seconds=None))

    def step(self, episode: EpisodeView) -> Turn:
        gold = column_value(episode.row, self.answer_key)
        return Turn(reward=1.0 if self.correct(episode.response, gold) else 0.0, done=True)


_ANSWER = re.compile(r"answer\s*:", re.IGNORECASE)


def dapo_answer(response: str) -> str | None:
    """DAPO's answer: the rest of the line after the last ``Answer:`` (None when there is none)."""
    found = list(_ANSWER.finditer(response))
    if not found:
        return None
    return response[found[-1].end():].split("\n", 1)[0].strip()


def normalised(text: str) -> str:
    """An answer for exact comparison: ``\\boxed{}``, ``$`` signs, spaces and a final full stop dropped."""
    text = text.strip()
    boxed = re.fullmatch(r"\\boxed\{(.*)\}", text)
    if boxed:
        text = boxed.group(1)
    return text.replace("$", "").replace(" ", "").rstrip(".")
