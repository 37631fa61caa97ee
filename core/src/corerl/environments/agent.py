"""Agent harnesses as environments: episodes played by the user's own agent loop over the
OpenAI-compatible endpoint (:mod:`corerl.environments.endpoint`).

An environment registered with ``plays="agent"`` builds an object with
``play(row, client) -> float`` (plain or ``async def``): it runs one episode on the dataset row,
talking to the policy through an OpenAI client made from ``client`` (an
:class:`~corerl.environments.endpoint.AgentClient`: ``base_url``, ``api_key``, ``model``), and
returns the episode's reward. corerl knows nothing of the harness's code: the trajectory trained
on is what the endpoint recorded, in the exact token ids sampled. The built-in ``openai_agent``
environment plays the function ``env.openai_agent.agent`` names (``pkg.module:fn``).
"""

from __future__ import annotations

import asyncio
import math
import numbers
from collections.abc import Sequence
from typing import Any

from corerl.environments.contract import EnvironmentContext
from corerl.environments.daemon_threads import DaemonThreadExecutor
from corerl.environments.endpoint import AgentClient, ChatEndpoint
from corerl.environments.pool import bounded_call
from corerl.environments.rollout import (
    PlayedEpisode,
    Rollout,
    check_failures,
    clean_row,
    episode_metrics,
    row_label,
)
from corerl.errors import ConfigError
from corerl.failures import first_line
from corerl.generation.contract import SamplingSettings


class OpenAIAgent:
    """The ``openai_agent`` environment: the function ``env.openai_agent.agent`` names."""

    def __init__(self, context: EnvironmentContext) -> None:
        self.play = load_agent(context.settings.agent)


def load_agent(path: str | None) -> Any:
    """The harness at import path ``path`` (``pkg.module:fn``), refused in one line naming
    ``env.openai_agent.agent`` when it is unset, malformed, not importable, not callable, or a
    code-running function (docs/security.md)."""
    from corerl.import_paths import import_function
    from corerl.tasks.rewards import IMPORT_PATH

    key = "env.openai_agent.agent"
    if path is None or not IMPORT_PATH.match(path):
        raise ConfigError(f"the openai_agent environment plays the harness {key} names, as pkg.module:fn; got {path!r}",
                          key=key, hint="e.g. env.openai_agent.agent=my_agents.loop:play, play(row, client) -> reward")
    return import_function(path, key, "agent", hint="point it at play(row, client) -> reward")


def check_agent(config: Any) -> None:
    """Refuse, in one line, an ``openai_agent`` recipe whose harness cannot be loaded, or that
    asks for actors (a harness runs as threads of the driver, next to the endpoint it calls)."""
    settings = config.section("env.openai_agent")
    if settings.num_workers:
        raise ConfigError("the openai_agent environment's episodes run in the driver, next to the endpoint they call",
                          key="env.openai_agent.num_workers", hint="set it to 0; max_concurrent_episodes sets how many "
                                                                   "run at once")
    load_agent(settings.agent)


class AgentRollout:
    """Episodes played by ``agent.play`` over a :class:`ChatEndpoint` started on first use."""

    def __init__(self, generation: Any, agent: Any, tokenizer: Any, env_name: str, settings: Any) -> None:
        self.generation, self.agent, self.tokenizer, self.env_name = generation, agent, tokenizer, env_name
        self.settings = settings
        self.endpoint: ChatEndpoint | None = None
        self.executor = DaemonThreadExecutor(settings.max_concurrent_episodes, "corerl-agent")  # a hung harness cannot keep the process alive

    def run(self, prompts: Sequence[Sequence[int]], items: Sequence[Any], sampling: SamplingSettings,
            n: int, max_seq_length: int) -> Rollout:
        """``n`` episodes per row (the task's prompt ids are the harness's business, not used here)."""
        import time

        if self.endpoint is None:
            self.endpoint = ChatEndpoint(self.generation, self.tokenizer, sampling, max_seq_length,
                                         max_request_bytes=self.settings.max_request_bytes,
                                         name=f"environment {self.env_name!r}")
        endpoint = self.endpoint
        endpoint.sampling, endpoint.max_seq_length = sampling, max_seq_length
        start = time.perf_counter()
        rows = [clean_row(item) for item in items for _ in range(n)]
        labels = [row_label(item) for item in items for _ in range(n)]
        episodes = [endpoint.open_episode() for _ in rows]
        outcomes = asyncio.run(self._play_all(rows, episodes))
        played = []
        for prompt, row_index, episode, (reward, fault, cause) in zip(
                [p for p in prompts for _ in range(n)], range(len(rows)), episodes, outcomes, strict=True):
            record = endpoint.close_episode(episode)
            chain = record.chains[-1] if record.chains else None
            state = PlayedEpisode(list(chain.prompt) if chain else list(prompt), rows[row_index], labels[row_index])
            if chain is not None:
                state.ids, state.mask, state.logprobs = list(chain.ids), list(chain.mask), list(chain.logprobs)
                state.finish = chain.finish
            state.responses = ["call"] * record.calls
            state.lost_text = record.lost_text
            if fault is None and chain is None:
                fault, cause = "env_malformed", "the agent made no call to the endpoint"
            if fault is not None:
                state.stop, state.cause, state.reward = fault, cause, 0.0
            else:
                state.stop = "max_tokens" if record.hit_length_limit else "done"
                state.reward = reward
            played.append(state)
        check_failures(played, self.env_name, self.settings.max_failure_share)
        samples = [e.sample() for e in played]
        groups = [samples[i * n:(i + 1) * n] for i in range(len(prompts))]
        rewards = [[e.reward for e in played[i * n:(i + 1) * n]] for i in range(len(prompts))]
        return Rollout(groups, rewards, episode_metrics(played, time.perf_counter() - start))

    async def _play_all(self, rows: list[Any], episodes: list[str]) -> list[tuple[float, str | None, str]]:
        return list(await asyncio.gather(*(self._play(row, episode) for row, episode in zip(rows, episodes, strict=True))))

    async def _play(self, row: Any, episode: str) -> tuple[float, str | None, str]:
        assert self.endpoint is not None
        client = AgentClient(base_url=self.endpoint.base_url(episode), api_key=self.endpoint.token)
        try:
            result = await bounded_call(self.agent.play, row, client, executor=self.executor,
                                        timeout_s=self.settings.timeout_s)
        except TimeoutError:
            return 0.0, "env_timeout", f"the agent took longer than {self.settings.timeout_s:g} s"
        except Exception as exc:  # the harness's own failure: its episode's
            return 0.0, "env_error", first_line(exc)
        if isinstance(result, bool) or not isinstance(result, numbers.Real) or not math.isfinite(result):
            return 0.0, "env_malformed", f"the agent returned {result!r}, not a finite reward"
        return float(result), None, ""

    def shutdown(self) -> None:
        if self.endpoint is not None:
            self.endpoint.shutdown()
        self.executor.shutdown(wait=False)
