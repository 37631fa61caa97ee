"""``math_multi_reward``: one turn scored by three named parts, for the gdpo advantage estimator.

NeMo RL's environment of that name (its GDPO recipe, ``gdpo_math_1B.yaml``) scores a response
written as ``<think>...</think>`` then ``<answer>...</answer>`` by three 0/1 parts:

- ``correctness``: the text inside the last ``<answer>`` tag, stripped, equals the gold answer;
- ``integer``: that text is all digits;
- ``format``: the whole response is a think block, a newline and one answer block.

The parts go out as the turn's ``reward_components``; the scalar ``reward`` is their sum (what
GRPO trains on where GDPO is not asked for, the comparison GDPO's paper makes).
"""

from __future__ import annotations

import re
from typing import Any

from corerl.environments.contract import EnvironmentContext, EpisodeView, Turn
from corerl.tasks import column_value

_FORMAT = re.compile(r"^<think>.*?</think>\n<answer>.*?</answer>$", re.DOTALL)


def answer_text(response: str) -> str:
    """The text after the last ``<answer>`` and before the ``</answer>`` after it, stripped."""
    return response.split("<answer>")[-1].split("</answer>")[0].strip()


def reward_parts(response: str, gold: Any) -> dict[str, float]:
    """The three 0/1 parts of ``response``'s reward against the ``gold`` answer."""
    answer = answer_text(response)
    well_formed = bool(_FORMAT.search(response)) and response.count("<answer>") == 1 \
        and response.count("</answer>") == 1
    return {"correctness": float(answer == str(gold).strip()), "integer": float(answer.isdigit()),
            "format": float(well_formed)}


class MathMultiRewardEnvironment:
    """Scores the model's one answer by :func:`reward_parts` (against the row's ``data.answer_key`` column)."""

    def __init__(self, context: EnvironmentContext) -> None:
        self.answer_key = getattr(context.data, "answer_key", "answer") if context.data is not None else "answer"

    def step(self, episode: EpisodeView) -> Turn:
        parts = reward_parts(episode.response, column_value(episode.row, self.answer_key))
        return Turn(reward=sum(parts.values()), reward_components=parts, done=True)
