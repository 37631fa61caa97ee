"""The sections of the core's environments (``env.tools``, ``env.math``, ``env.openai_agent``),
apart from the environments themselves so that registering them imports nothing more than attrs
(the built-in plugin is loaded by ``corerl --help``)."""

from __future__ import annotations

from typing import Literal

import attrs

from corerl.config.fields import setting
from corerl.environments.contract import EnvironmentSettings


@attrs.define(kw_only=True)
class ToolsSettings(EnvironmentSettings):
    """``env.tools``: which registered tools the model may call, and how calls are read."""

    tools: list[str] = setting([], help="ids of registered tools the model may call (corerl plugins lists them)")
    tool_parser: str = setting("hermes", help="id of the tool-call parser: hermes (Qwen/Hermes <tool_call> JSON)")
    max_calls_per_turn: int = setting(4, min=1, help="calls executed per turn; further ones are answered with an error")
    call_latency_s: float = setting(0.0, min=0.0, help="seconds a turn's tool calls take before they answer (a "
                                                       "stand-in for a sandbox's or a web tool's round trip, e.g. "
                                                       "0.3; the episodes' waits overlap): for benchmarks and for "
                                                       "trying a pipeline against slow tools; 0: none")
    check_latency_s: float = setting(0.0, min=0.0, help="seconds checking a final answer takes before the episode's "
                                                        "reward comes back (a stand-in for a sandbox running the "
                                                        "answer's tests, e.g. 0.3; the episodes' waits overlap): "
                                                        "for benchmarks; 0: none")


@attrs.define(kw_only=True)
class MathSettings(EnvironmentSettings):
    """``env.math``: how answers are verified."""

    math_verify_impl: Literal["hf_math_verify", "dapo_math_verify"] = setting(
        "hf_math_verify", help="hf_math_verify: Hugging Face's math-verify finds the answer anywhere in the turn; "
                               "dapo_math_verify: DAPO's rule, the text after the last 'Answer:' compared with the "
                               "gold answer (normalised, then by math-verify)")
    verifier_type: Literal["math", "english_multichoice", "multilingual_multichoice"] = setting(
        "math", help="math: the answer checked as mathematics (math_verify_impl); english_multichoice: the option "
                     "letter after the first 'Answer:' equal to the gold letter (GPQA, MMLU); "
                     "multilingual_multichoice: the same with the marker in other languages too ('Antwort:', "
                     "'答案：', 'الإجابة:') and option letters in other scripts")


@attrs.define(kw_only=True)
class AgentSettings(EnvironmentSettings):
    """``env.openai_agent``: the harness to play episodes with."""

    agent: str | None = setting(None, help="import path pkg.module:fn of play(row, client) -> reward (plain or async)")
    max_concurrent_episodes: int = setting(64, min=1, help="episodes played at once (their calls are batched)")
    max_request_bytes: int | None = setting(None, min=1024, help="the endpoint refuses a larger request body with 413, "
                                            "unread; unset: 64 KiB plus 64 bytes per token of policy.max_seq_length")
