"""``llm_as_a_judge``: the environment of SkyRL's LLM-as-a-judge example
(``examples/train/llm_as_a_judge``), which its ``main_llm_judge.py`` registers with skyrl-gym.
Written here from what it does, so that the example's launch script runs as it is (the SkyRL
dialect's ``llm_as_a_judge`` entry point registers this class:
``env.skyrl_gym.register.llm_as_a_judge=corerl_skyrl_gym.llm_judge:LLMJudgeEnv``).

An episode is one turn. The model's answer and the row's ``reward_spec.ground_truth`` go to a
judge model behind an OpenAI-compatible chat-completions endpoint, in one user message; the judge
is asked to end its reply with ``### Final Score: 1`` (the answer ends with ``#### <number>`` and
that number is the truth's) or ``### Final Score: 0``. Its reply is read as SkyRL reads it:

- the first ``### Final Score:`` followed by ``0``, ``1``, ``0.0`` or ``1.0``: that number is the reward;
- else a reply that is just ``1`` or ``0``: that number;
- else (anything else, or a failed request): reward 0.0, and a one-line warning says why.

Settings (``env_config``, from ``env.skyrl_gym.env_config``; SkyRL's
``environment.skyrl_gym.llm_as_a_judge.*`` arrive there): ``model`` (default ``gpt-4o-mini``) and
``base_url`` (default: ``OPENAI_BASE_URL`` if set, else OpenAI's ``https://api.openai.com/v1``); the
API key is ``OPENAI_API_KEY`` from the process's environment. The request goes through the
``openai`` client where it is installed (as SkyRL's does: its retries and timeout), else through
``urllib`` to ``{base_url}/chat/completions``. What the judge needs from this machine (the key set,
the endpoint answering) is checked before a run: :func:`corerl_skyrl_gym.checks.check_skyrl_gym_inputs`.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import urllib.request
from collections.abc import Callable
from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from corerl_skyrl_gym.rows import ground_truth

log = logging.getLogger(__name__)

ENTRY = "corerl_skyrl_gym.llm_judge:LLMJudgeEnv"
API_KEY = "OPENAI_API_KEY"
BASE_URL_VARIABLE = "OPENAI_BASE_URL"
DEFAULT_MODEL = "gpt-4o-mini"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
#: the urllib path's wait for an answer (the openai client's default)
TIMEOUT_S = 600.0
#: the judge's verdict line; the first one counts
_VERDICT = re.compile(r"### Final Score:\s*([01](?:\.0)?)")

JUDGE_INSTRUCTIONS = """\
You grade a model's answer to a grade-school math problem against the reference answer.

Give 1 only when both of these hold, otherwise give 0:
- the answer's last line has the form `#### <number>`;
- that number is exactly the final number of the reference.

You may reason first. Then close your reply with a line of its own, with nothing after it, either
### Final Score: 1
or
### Final Score: 0
"""


def judge_message(truth: Any, answer: str) -> str:
    """The one user message the judge gets."""
    return f"{JUDGE_INSTRUCTIONS}\nREFERENCE ANSWER:\n{truth}\n\nMODEL'S ANSWER:\n{answer}\n\nYour grade:"


def verdict(reply: str) -> float | None:
    """The reward a judge's reply gives (see the module's docstring), or None when it gives none."""
    found = _VERDICT.search(reply)
    if found:
        return float(found.group(1))
    return float(reply.strip()) if reply.strip() in ("0", "1") else None


def judge_settings(env_config: Any) -> tuple[str, str]:
    """The judge's model and endpoint (base URL) from the environment's ``env_config``."""
    model = getattr(env_config, "model", None) or DEFAULT_MODEL
    base_url = getattr(env_config, "base_url", None) or os.environ.get(BASE_URL_VARIABLE) or DEFAULT_BASE_URL
    return str(model), str(base_url)


def asker(base_url: str, api_key: str, use_openai: bool | None = None) -> Callable[[str, str], str]:
    """A function ``(model, message) -> the judge's reply text`` for the endpoint at ``base_url``:
    the ``openai`` client's where it is installed (``use_openai`` None), else urllib's."""
    if use_openai is None:
        use_openai = importlib.util.find_spec("openai") is not None
    if use_openai:
        from openai import OpenAI

        client = OpenAI(base_url=base_url, api_key=api_key)

        def ask(model: str, message: str) -> str:
            answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": message}])
            return _text(answer.choices[0].message.content)

        return ask

    url = base_url.rstrip("/") + "/chat/completions"

    def ask_plain(model: str, message: str) -> str:
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": message}]}).encode()
        request = urllib.request.Request(url, data=body, method="POST", headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {api_key}"})
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            answer = json.load(response)
        return _text(answer["choices"][0]["message"]["content"])

    return ask_plain


def reply_errors() -> tuple[type[BaseException], ...]:
    """What a failed request or a malformed answer raises (the connection, HTTP and the openai
    client's errors, a reply that is not JSON or lacks its fields); anything else is a bug, raised."""
    errors: tuple[type[BaseException], ...] = (OSError, ValueError, KeyError, IndexError)
    if importlib.util.find_spec("openai") is not None:
        from openai import APIError

        errors += (APIError,)
    return errors


def _text(content: Any) -> str:
    if not isinstance(content, str):
        raise ValueError(f"the reply's message content is {type(content).__name__}, not text")
    return content


class LLMJudgeEnv(BaseTextEnv):
    """One judged answer (see the module's docstring); ``extras`` is the dataset row
    (``reward_spec.ground_truth`` required), ``env_config`` has the judge's ``model`` and ``base_url``."""

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        extras = extras or {}
        self.truth = ground_truth(extras, "llm_as_a_judge", "the answer the judge compares with")
        self.model, self.base_url = judge_settings(env_config)
        api_key = os.environ.get(API_KEY)
        if not api_key:
            raise ValueError(f"{API_KEY} is not set: the llm_as_a_judge environment's judge ({self.model} at "
                             f"{self.base_url}) needs its API key in the environment")
        self.ask = asker(self.base_url, api_key)

    def judge(self, answer: str) -> float:
        """The judge's reward for ``answer``: 0.0 where the request fails or the reply gives none."""
        try:
            reply = self.ask(self.model, judge_message(self.truth, answer))
        except reply_errors() as error:  # the request failed or its answer is malformed: SkyRL's reward is 0
            log.warning("llm_as_a_judge: the judge (%s at %s) gave no reply, reward 0: %s: %s", self.model,
                        self.base_url, type(error).__name__, " ".join(str(error).split()))
            return 0.0
        score = verdict(reply)
        if score is None:
            log.warning("llm_as_a_judge: the judge's reply has no '### Final Score: 0|1' line, reward 0: %.200r",
                        reply)
            return 0.0
        return score

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        return BaseTextEnvStepOutput(observations=[], reward=self.judge(action), done=True, metadata={})
