"""What an environment is to corerl: it takes a dataset row and answers each model turn.

An :class:`corerl.registry.Environment` registration's factory is called as
``factory(context)`` with an :class:`EnvironmentContext` and returns an object with the methods
of :class:`Environment`. Its ``step`` may be a plain function or a coroutine function
(``async def``); corerl awaits the latter. One object answers every episode, in any order and
from any worker: what an episode must remember between turns lives in the :class:`Turn`'s
``state``, which corerl hands back in the next :class:`EpisodeView` (so it must pickle, for an
environment that runs as a pool of Ray actors).

Nothing here imports torch: environments are plain Python.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import attrs

from corerl.config.fields import setting

#: why an episode ended: the environment said done; the turn limit; the token limit
#: (``policy.max_seq_length``); the environment raised, hung past its timeout or answered
#: something that is not a :class:`Turn`
StopReason = Literal["done", "max_turns", "max_tokens", "env_error", "env_timeout", "env_malformed"]
STOP_REASONS: tuple[str, ...] = ("done", "max_turns", "max_tokens", "env_error", "env_timeout", "env_malformed")

Message = Mapping[str, Any]
"""A chat message: ``{"role": "tool" | "user" | ..., "content": str}``."""


@attrs.frozen(kw_only=True)
class EpisodeView:
    """What an environment sees of one episode when it answers a turn.

    ``row`` is the dataset row (the task's example); ``turn`` counts the model's turns so far,
    this one included (1 on the first answer); ``responses`` holds the text of each of the
    model's turns, the last one being the turn to answer; ``state`` is what the environment
    returned with its previous :class:`Turn` (None on the first turn)."""

    row: Any
    turn: int
    responses: tuple[str, ...]
    state: Any = None

    @property
    def response(self) -> str:
        """The model turn to answer."""
        return self.responses[-1]


@attrs.frozen(kw_only=True)
class Turn:
    """An environment's answer to one model turn.

    ``observation`` goes back to the model when the episode goes on: text (appended as it is,
    tokenized on its own) or chat messages (rendered with the chat template's own markers, e.g.
    ``{"role": "tool", "content": ...}``). ``reward`` is this turn's reward (an episode's reward
    is the sum over its turns: give it per turn or only at the end). ``done`` ends the episode.
    ``state`` is kept for the next turn. ``tool_calls`` and ``tool_failures`` count the tool
    calls this turn made and how many of them failed (for the metrics). ``reward_components``
    (optional, contract 2.18) names the reward's parts, e.g. ``{"correctness": 1.0, "format": 0.0}``
    (summed over an episode's turns like ``reward``): the ``gdpo`` advantage estimator normalises each
    part within its group; the other estimators read ``reward`` alone."""

    observation: str | Sequence[Message] | None = None
    reward: float = 0.0
    reward_components: Mapping[str, float] | None = None
    done: bool = False
    state: Any = None
    tool_calls: int = 0
    tool_failures: int = 0


@attrs.frozen
class EnvironmentContext:
    """What an environment factory receives: its own validated section (``env.<id>``, an
    :class:`EnvironmentSettings` or the registration's subclass of it), the run's seed, the
    tokenizer (to read a chat template or count tokens), the tools and tool-call parsers
    registered by the installed plugins (registrations by id: ``.load()`` gives the function),
    the ``data.reward`` function and the ``data`` section."""

    settings: Any
    seed: int
    tokenizer: Any = None
    tools: Mapping[str, Any] = attrs.field(factory=dict)
    tool_parsers: Mapping[str, Any] = attrs.field(factory=dict)
    #: the run's ``data.reward`` function, ``fn(text, row) -> float`` (None: unset)
    reward: Any = None
    #: the run's ``data`` section (``answer_key`` says which column holds the gold answer)
    data: Any = None


@runtime_checkable
class Environment(Protocol):
    """The method every environment provides (``step`` may be ``async def``)."""

    def step(self, episode: EpisodeView) -> Turn:
        """Answer the model's latest turn (``episode.response``) of the episode on ``episode.row``."""


@attrs.define(kw_only=True)
class EnvironmentSettings:
    """The keys every ``env.<id>`` section has; an environment's own schema subclasses this."""

    num_workers: int = setting(0, min=0, help="Ray actors that run the environment's steps; 0: in the driver process")
    timeout_s: float = setting(60.0, min=0.0, min_exclusive=True,
                               help="an answer that takes longer ends its episode (reward 0, counted in env/timeouts)")
    max_failure_share: float = setting(0.5, min=0.0, max=1.0,
                                       help="the run stops when more than this share of a step's episodes end by an "
                                            "environment failure (error, timeout, malformed answer)")
