"""``geometry3k``: the environment of SkyRL's Geometry-3K example (``examples/train/geometry3k``),
which its ``geometry3k_entrypoint.py`` registers with skyrl-gym. Written here from what it does, so
that the example's launch scripts run as they are (the SkyRL dialect's ``geometry3k`` entry point
registers this class: ``env.skyrl_gym.register.geometry3k=corerl_skyrl_gym.geometry3k:Geometry3kEnv``).

The rows are the example's ``geometry_3k_dataset.py``'s: one user message whose content is the
diagram(s) as ``image_url`` parts (JPEG data URLs) and the question as a ``text`` part, and the
answer in ``reward_spec.ground_truth``. corerl's dataset task reads the images with the policy's
image processor (a vision-language policy); this environment sees text only: the model's turns.

Each turn of the model is read for a tool call, the last ``<tool_call>{...}</tool_call>`` whose
JSON names a tool (``name``, or ``function.name``) and its ``arguments`` (a JSON object, or text
holding one):

- **no tool call** (none, or its JSON does not parse): the turn is the final answer, the content of
  its last ``\\boxed{...}``, else its last non-empty line (512 characters at most), and the
  episode ends with 1.0 when that answer is right, else 0.0;
- **a tool other than** ``calc_score``, or ``calc_score`` **without an answer**: 0.0, and before the
  last turn a user message saying how to call ``calc_score``;
- ``calc_score`` **with an answer**: the answer is scored; right, or on the last turn, the episode
  ends with that score (1.0 or 0.0); wrong before the last turn, 0.0 and a user message giving the
  score and the parsed answer and asking for another approach (on the turn before the last, also
  that no tool call is left: the next answer is final).

An answer is right when, boxed (as it is, if it holds ``\\boxed``, else put in a box), its last box
grades equal to the truth: :func:`corerl_skyrl_gym.boxed_math.grade_boxed`. ``max_turns`` is
``extras["max_turns"]`` (the dialect passes ``generator.max_turns``), else 3. corerl adds an
episode's turn rewards up: an episode scores 1.0 or 0.0, as in SkyRL.

Where it differs: the user messages carry the same facts (the score, the answer read, how to call
the tool, that the next answer is the last) in this package's own words; ``arguments`` that are
JSON but not an object (a list, a number) count as a call without an answer (SkyRL's environment
fails on them); a ``max_turns`` of null or 0 is the default 3.
"""

from __future__ import annotations

import json
import re
from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from corerl_skyrl_gym.boxed_math import boxed_content, grade_boxed
from corerl_skyrl_gym.rows import ground_truth

__all__ = ["CALC_SCORE", "DEFAULT_MAX_TURNS", "Geometry3kEnv", "score_answer", "tool_call_of"]

#: a tool call: a JSON object between the tags (the shortest one that closes before the end tag)
_TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)
CALC_SCORE = "calc_score"
DEFAULT_MAX_TURNS = 3
#: how long a final answer read from a turn's last line may be
LAST_LINE_LIMIT = 512
_HOW_TO_CALL = ('To check an answer, call the tool as <tool_call>{"name": "calc_score", "arguments": {"answer": '
                '"<your_answer>"}}</tool_call>.')


def tool_call_of(text: str) -> tuple[str, Any] | None:
    """The last tool call of ``text`` as (name, arguments), or None: no call, JSON that does not
    parse, no name, or text arguments that are not JSON."""
    calls = _TOOL_CALL.findall(text)
    if not calls:
        return None
    try:
        payload = json.loads(calls[-1].strip())
    except json.JSONDecodeError:
        return None
    if not isinstance(payload, dict):
        return None
    function = payload.get("function") if isinstance(payload.get("function"), dict) else {}
    name = payload.get("name") or function.get("name")
    arguments = payload.get("arguments") or function.get("arguments") or {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    return (str(name), arguments) if name else None


def score_answer(answer: str, truth: str) -> float:
    """1.0 when ``answer`` (boxed as it is if it holds ``\\boxed``, else put in a box) grades equal
    to ``truth``, else 0.0."""
    answer = answer.strip()
    candidates = [answer] if "\\boxed" in answer else [answer, f"\\boxed{{{answer}}}"]
    return 1.0 if any(grade_boxed(candidate, truth) for candidate in candidates) else 0.0


def final_answer_of(text: str) -> str | None:
    """A turn without a tool call read as the final answer: its last box's content, else its last
    non-empty line (cut to :data:`LAST_LINE_LIMIT`), else None."""
    boxed = boxed_content(text)
    if boxed:
        return boxed.strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:LAST_LINE_LIMIT] if lines else None


class Geometry3kEnv(BaseTextEnv):
    """One Geometry-3K episode (see the module's docstring); ``extras`` is the dataset row
    (``reward_spec.ground_truth`` required), ``env_config`` is not read."""

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        extras = extras or {}
        self.truth = str(ground_truth(extras, "geometry3k", "the answer"))
        self.max_turns = int(extras.get("max_turns") or DEFAULT_MAX_TURNS)
        self.correct = False

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        last = self.turns >= self.max_turns
        call = tool_call_of(action)
        if call is None:  # the final answer
            answer = final_answer_of(action)
            if answer:
                self.correct = score_answer(answer, self.truth) == 1.0
            return self._out(1.0 if self.correct else 0.0, True, tool_call=False)
        name, arguments = call
        name = name.strip()
        if name != CALC_SCORE:
            return self._retry(f"There is no tool `{name}`. {_HOW_TO_CALL}", last, unsupported_tool=name)
        given = arguments.get("answer") if isinstance(arguments, dict) else None
        answer = str(given).strip() if given else ""
        if not answer:
            return self._retry(f"The tool call gives no `answer`. {_HOW_TO_CALL}", last,
                               answer_missing=True)
        score = score_answer(answer, self.truth)
        self.correct = score == 1.0
        if self.correct or last:
            return self._out(score, True, score=score, answer=answer)
        return self._out(0.0, False, self._feedback(score, answer), score=score, answer=answer)

    def _feedback(self, score: float, answer: str) -> str:
        """What the model is told after a wrong ``calc_score`` before its last turn."""
        said = (f"calc_score result: {score}. The answer read, '{answer}', is not the reference answer: it is "
                "wrong. Try another line of reasoning rather than repeating it.")
        if self.max_turns >= 2 and self.turns >= self.max_turns - 1:  # the next turn is the last
            said += (" You have one answer left: do not call the tool again, and give your final answer as "
                     "Answer: \\boxed{$Answer}")
        return said

    def _retry(self, say: str, last: bool, **metadata: Any) -> BaseTextEnvStepOutput:
        """0.0; before the last turn, ``say`` as a user message and another turn."""
        return self._out(0.0, last, None if last else say, tool_call=True, **metadata)

    def _out(self, reward: float, done: bool, say: str | None = None, **metadata: Any) -> BaseTextEnvStepOutput:
        observations = [] if say is None else [{"role": "user", "content": say}]
        return BaseTextEnvStepOutput(observations=observations, reward=reward, done=done,
                                     metadata={"ground_truth": self.truth, **metadata})

    def get_metrics(self) -> dict[str, Any]:
        return {"turns": self.turns, "acc": 1.0 if self.correct else 0.0}
