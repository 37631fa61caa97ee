"""``tools``: the built-in tool-calling environment.

Each model turn is read with the configured tool-call parser (``env.tools.tool_parser``, default
``hermes``). A turn with calls is answered with one ``{"role": "tool"}`` message per call, the
tool's result (or what went wrong: an unknown tool, bad arguments, a tool that raised); a turn
without calls is the final answer, scored by the run's reward (``data.reward``, else
``exact_answer`` against the row's ``answer``). The tools offered are those ``env.tools.tools``
names among the registered ones.

A tool function that has a keyword-only parameter ``row`` receives the episode's dataset row
there (not shown to the model): that is how a tool answers per episode (the ``lookup`` tool of
the ``tool_lookup`` task reads the episode's table).

``env.tools.call_latency_s`` makes a turn's calls answer that many seconds late, as a sandbox's or
a web tool's round trip does, and ``env.tools.check_latency_s`` the final answer's reward, as a
sandbox running the answer's tests does (``bench/async_vs_sync.py --workload slow_tools``: every
episode then waits, however few of them the policy makes call a tool). The wait is an
``asyncio`` sleep (the step is then a coroutine, run on the environment pool's event loop), so
every episode's wait overlaps the others' as real network waits do, however many episodes a step
plays (the pool's threads do not bound it); the tools themselves then run on a worker thread.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

from corerl.environments.contract import EnvironmentContext, EpisodeView, Turn
from corerl.environments.tools import ToolCall, execute
from corerl.tasks.rewards import exact_answer


def _row_signature(function: Callable[..., Any]) -> inspect.Signature | None:
    """The signature the model calls ``function`` with when it takes the episode's row as the
    keyword-only ``row`` (that parameter left out); None when it does not take the row."""
    signature = inspect.signature(function)
    parameter = signature.parameters.get("row")
    if parameter is None or parameter.kind is not inspect.Parameter.KEYWORD_ONLY:
        return None
    return signature.replace(parameters=[p for p in signature.parameters.values() if p.name != "row"])


def _with_row(function: Callable[..., Any], row: Any, signature: inspect.Signature) -> Callable[..., Any]:
    def call(**arguments: Any) -> Any:
        return function(**arguments, row=row)

    call.__signature__ = signature  # type: ignore[attr-defined]
    return call


class ToolsEnvironment:
    """Executes the model's tool calls; the first turn without one is scored as the answer."""

    def __init__(self, context: EnvironmentContext) -> None:
        settings = context.settings
        self.tools = {name: context.tools[name].load() for name in settings.tools}
        self.row_signatures = {name: _row_signature(function) for name, function in self.tools.items()}
        self.parse = context.tool_parsers[settings.tool_parser].load()
        self.max_calls = settings.max_calls_per_turn
        self.reward = context.reward or exact_answer
        self.latency = settings.call_latency_s
        self.check_latency = settings.check_latency_s
        if self.latency > 0 or self.check_latency > 0:  # a coroutine step: the pool awaits it on its loop,
            self.step = self.step_after_latency  # type: ignore[method-assign]  # every episode's wait at once

    def step(self, episode: EpisodeView) -> Turn:
        calls: list[ToolCall] = self.parse(episode.response)
        if not calls:
            return Turn(reward=float(self.reward(episode.response, episode.row)), done=True)
        return self._executed(episode, calls)

    async def step_after_latency(self, episode: EpisodeView) -> Turn:
        """:meth:`step` with ``call_latency_s`` (a turn with calls answers that many seconds late) and
        ``check_latency_s`` (a final answer's reward that late)."""
        calls: list[ToolCall] = self.parse(episode.response)
        if not calls:
            if self.check_latency > 0:
                await asyncio.sleep(self.check_latency)
            return Turn(reward=float(self.reward(episode.response, episode.row)), done=True)
        if self.latency > 0:
            await asyncio.sleep(self.latency)
        return await asyncio.to_thread(self._executed, episode, calls)

    def _executed(self, episode: EpisodeView, calls: list[ToolCall]) -> Turn:
        tools = {name: function if (signature := self.row_signatures[name]) is None
                 else _with_row(function, episode.row, signature) for name, function in self.tools.items()}
        results = [execute(call, tools) for call in calls[: self.max_calls]]
        messages = [{"role": "tool", "content": r.content} for r in results]
        messages += [{"role": "tool", "content": f"error: at most {self.max_calls} tool calls per turn"}
                     for _ in calls[self.max_calls:]]
        failures = sum(r.failed for r in results) + max(0, len(calls) - self.max_calls)
        return Turn(observation=messages, tool_calls=len(calls), tool_failures=failures)
