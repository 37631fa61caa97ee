"""Where an environment's steps run: in the driver process, or in a pool of Ray actors.

Both answer a list of :class:`~corerl.environments.contract.EpisodeView` with one
:class:`Answer` each, in order. A step that raises, takes longer than ``timeout_s`` or returns
something other than a :class:`~corerl.environments.contract.Turn` becomes a fault of that
episode (its reason and a one-line cause), never an exception of the run: the rollout ends the
episode with zero reward and counts it.

In-process, every episode's step runs concurrently on one asyncio loop: ``async def`` steps as
coroutines, plain ones in a thread pool. A plain step that hangs cannot be stopped in-process
(its daemon thread is abandoned after the timeout and cannot keep the process from exiting);
environments that may hang belong in actors
(``env.<id>.num_workers``), where a timed-out actor is killed and restarted by Ray.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from typing import Any

import attrs

from corerl.environments.contract import EpisodeView, Turn
from corerl.environments.daemon_threads import DaemonThreadExecutor
from corerl.failures import first_line

log = logging.getLogger(__name__)


@attrs.frozen
class Answer:
    """An environment's answer to one episode's turn: the :class:`Turn`, or the fault that ended
    the episode (``fault`` one of ``env_error``, ``env_timeout``, ``env_malformed``, with ``cause``)."""

    turn: Turn | None = None
    fault: str | None = None
    cause: str = ""


def malformed_turn(turn: Turn) -> str | None:
    """What is wrong with a :class:`Turn`'s fields, in a few words (None: nothing): the rollout
    reads them, so a wrong type is the environment's fault, not an error of the run."""
    observation = turn.observation
    if observation is not None and not isinstance(observation, str):
        if isinstance(observation, (bytes, Mapping)) or not isinstance(observation, Sequence) or not all(
                isinstance(m, Mapping) for m in observation):
            return (f"Turn.observation is a {type(observation).__name__}; it must be text or a list of chat "
                    "messages (dicts)")
    for name in ("tool_calls", "tool_failures"):
        value = getattr(turn, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return f"Turn.{name} is {value!r}; it must be a count (an int, 0 or more)"
    return None


async def bounded_call(function: Any, *args: Any, executor: Executor, timeout_s: float) -> Any:
    """``function(*args)`` awaited within ``timeout_s`` (``TimeoutError`` past it): a coroutine
    function on the running loop, a plain one in ``executor`` (whose thread, if it hangs, is
    abandoned)."""
    if inspect.iscoroutinefunction(function):
        return await asyncio.wait_for(function(*args), timeout_s)
    loop = asyncio.get_running_loop()
    return await asyncio.wait_for(loop.run_in_executor(executor, function, *args), timeout_s)


class InProcessPool:
    """Runs ``environment.step`` in this process, every episode of a call concurrently."""

    def __init__(self, environment: Any, timeout_s: float, max_threads: int = 32) -> None:
        self.environment = environment
        self.timeout_s = timeout_s
        self.executor = DaemonThreadExecutor(max_threads, "corerl-env")  # a hung step cannot keep the process alive
        self.seconds = 0.0  # time spent answering, all calls

    async def _one(self, view: EpisodeView) -> Answer:
        try:
            result = await bounded_call(self.environment.step, view, executor=self.executor, timeout_s=self.timeout_s)
        except TimeoutError:
            return Answer(fault="env_timeout", cause=f"no answer within {self.timeout_s:g} s")
        except Exception as exc:  # the environment's own failure: the episode's, counted and reported
            log.debug("environment step raised", exc_info=True)
            return Answer(fault="env_error", cause=first_line(exc))
        if not isinstance(result, Turn):
            return Answer(fault="env_malformed", cause=f"step returned {type(result).__name__}, not a Turn")
        if (wrong := malformed_turn(result)) is not None:
            return Answer(fault="env_malformed", cause=wrong)
        return Answer(turn=result)

    async def _all(self, views: Sequence[EpisodeView]) -> list[Answer]:
        return list(await asyncio.gather(*(self._one(view) for view in views)))

    def answer(self, views: Sequence[EpisodeView]) -> list[Answer]:
        """One answer per view, in order."""
        start = time.perf_counter()
        try:
            return asyncio.run(self._all(views)) if views else []
        finally:
            self.seconds += time.perf_counter() - start

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False)  # a hung step's thread is not waited for


class EnvironmentActor:
    """The body of one Ray actor of a pool: builds the environment from its registration and
    answers chunks of episodes with an :class:`InProcessPool` of its own."""

    def __init__(self, registration: Any, context: Any) -> None:
        from corerl.reporting.quiet import write_output_to_run_log

        write_output_to_run_log()  # a quiet run: this actor's output goes to run.log
        self.pool = InProcessPool(registration.create(context), context.settings.timeout_s)

    def answer(self, views: Sequence[EpisodeView]) -> list[Answer]:
        return self.pool.answer(views)


class RayPool:
    """``num_workers`` Ray actors (restarted by Ray when one dies); each call's episodes are
    dealt to them in turn. An actor that dies mid-call fails its episodes (``env_error``); one
    that overruns the call's deadline is killed (Ray restarts it) and its episodes time out."""

    def __init__(self, registration: Any, context: Any, num_workers: int, ray_address: str | None = None) -> None:
        import ray

        from corerl.distributed.worker_group import ensure_ray

        ensure_ray(ray_address)
        self.timeout_s = context.settings.timeout_s
        remote = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(EnvironmentActor)
        self.actors = [remote.remote(registration, context) for _ in range(num_workers)]
        self.seconds = 0.0

    def answer(self, views: Sequence[EpisodeView]) -> list[Answer]:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        start = time.perf_counter()
        chunks: list[list[int]] = [list(range(i, len(views), len(self.actors))) for i in range(len(self.actors))]
        refs = {a: self.actors[a].answer.remote([views[i] for i in chunk]) for a, chunk in enumerate(chunks) if chunk}
        answers: list[Answer | None] = [None] * len(views)
        deadline = start + self.timeout_s + 5.0  # the actor's own per-episode timeouts fire first
        for a, ref in refs.items():
            try:
                results = ray.get(ref, timeout=max(0.1, deadline - time.perf_counter()))
            except GetTimeoutError:
                ray.kill(self.actors[a], no_restart=False)
                results = [Answer(fault="env_timeout", cause=f"actor {a} overran {self.timeout_s:g} s; restarted")] * len(chunks[a])
            except RayActorError as exc:
                results = [Answer(fault="env_error", cause=f"environment actor {a} died ({first_line(exc)}); "
                                                         "Ray restarts it")] * len(chunks[a])
            for index, result in zip(chunks[a], results, strict=True):
                answers[index] = result
        self.seconds += time.perf_counter() - start
        return [a if a is not None else Answer(fault="env_error", cause="no answer") for a in answers]

    def shutdown(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
