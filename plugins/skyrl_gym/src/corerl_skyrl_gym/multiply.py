"""``multiply``: the environment of SkyRL's multiply example (``examples/train/multiply``), which
its ``main_multiply.py`` registers with skyrl-gym. Written here from what it does, so that the
example's launch script runs as it is (the SkyRL dialect's ``multiply`` entry point registers this
class: ``env.skyrl_gym.register.multiply=corerl_skyrl_gym.multiply:MultiplyEnv``).

An episode asks for the product in the row's ``reward_spec.ground_truth`` (the example's data:
``"123 * 45"`` as the user's turn, ``"5535"`` the truth). Each model turn is read for its first
``\\boxed{...}`` (braces with at least one character and no ``}`` inside):

- the boxed text, stripped, equals the truth, stripped: reward 1.0, the episode ends;
- otherwise, before the last turn: reward 0.0 and a user message saying the boxed answer was wrong
  (or that none was boxed), and the model tries again;
- on the last turn (``max_turns``, from ``extras["max_turns"]``, else 5): reward 0.5 for a wrong
  boxed answer, 0.0 for none, and the episode ends.

corerl adds an episode's turn rewards up, so an episode scores 1.0, 0.5 or 0.0, as in SkyRL.
"""

from __future__ import annotations

import re
from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from corerl_skyrl_gym.rows import ground_truth

#: the first \boxed{...}: one or more characters, none of them a closing brace
_BOXED = re.compile(r"\\boxed\{([^}]+)\}")
DEFAULT_MAX_TURNS = 5
RIGHT, BOXED_BUT_WRONG, NOTHING_BOXED = 1.0, 0.5, 0.0


def boxed_answer(text: str) -> str | None:
    """The contents of ``text``'s first ``\\boxed{...}``, or None when it has none."""
    found = _BOXED.search(text)
    return found.group(1) if found else None


class MultiplyEnv(BaseTextEnv):
    """One multiplication episode (see the module's docstring); ``extras`` is the dataset row
    (``reward_spec.ground_truth`` required), ``env_config`` is not read."""

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        extras = extras or {}
        self.truth = str(ground_truth(extras, "multiply", "the product")).strip()
        self.max_turns = int(extras.get("max_turns") or DEFAULT_MAX_TURNS)

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        answer = boxed_answer(action)
        right = answer is not None and answer.strip() == self.truth
        metadata = {"parsed_answer": answer}
        if right or self.turns >= self.max_turns:
            reward = RIGHT if right else BOXED_BUT_WRONG if answer is not None else NOTHING_BOXED
            return BaseTextEnvStepOutput(observations=[], reward=reward, done=True, metadata=metadata)
        if answer is None:
            say = "No answer was given in the form \\boxed{...}. Give the product as \\boxed{your answer}."
        else:
            say = f"{answer} is not the product. Try again, with the answer as \\boxed{{...}}."
        return BaseTextEnvStepOutput(observations=[{"role": "user", "content": say}], reward=0.0, done=False,
                                     metadata=metadata)
