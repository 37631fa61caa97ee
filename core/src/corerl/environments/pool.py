"""Where an environment's steps run: in the driver process, or in a pool of Ray actors.

Both take one :class:`~corerl.environments.contract.EpisodeView` at a time (``submit``, a
future of its :class:`Answer`), so that the rollout hands each episode on as soon as its own
step returns, or a list of them (``answer``, the answers in order). A step that raises, takes
longer than ``timeout_s`` or returns something other than a
:class:`~corerl.environments.contract.Turn` becomes a fault of that episode (its reason and a
one-line cause), never an exception of the run: the rollout ends the episode with zero reward
and counts it. ``seconds`` is the time during which at least one step was running.

In-process, every step runs concurrently on one asyncio loop of the pool's own thread:
``async def`` steps as coroutines, plain ones in a thread pool. A plain step that hangs cannot be stopped in-process
(its daemon thread is abandoned after the timeout and cannot keep the process from exiting);
environments that may hang belong in actors
(``env.<id>.num_workers``), where a timed-out actor is killed and restarted by Ray.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor, Future, InvalidStateError
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


class BusyClock:
    """Seconds during which at least one of the calls it was told of was running."""

    def __init__(self) -> None:
        self.seconds, self.running, self.since = 0.0, 0, 0.0
        self.lock = threading.Lock()

    def started(self) -> None:
        with self.lock:
            if self.running == 0:
                self.since = time.perf_counter()
            self.running += 1

    def ended(self, _: Any = None) -> None:
        with self.lock:
            self.running -= 1
            if self.running == 0:
                self.seconds += time.perf_counter() - self.since


class InProcessPool:
    """Runs ``environment.step`` in this process, every submitted episode concurrently."""

    def __init__(self, environment: Any, timeout_s: float, max_threads: int = 32) -> None:
        self.environment = environment
        self.timeout_s = timeout_s
        self.executor = DaemonThreadExecutor(max_threads, "corerl-env")  # a hung step cannot keep the process alive
        self.clock = BusyClock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_lock = threading.Lock()

    @property
    def seconds(self) -> float:
        return self.clock.seconds

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

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The pool's event loop, on a daemon thread of its own (started by the first call)."""
        with self.loop_lock:
            if self.loop is None:
                self.loop = asyncio.new_event_loop()
                threading.Thread(target=self.loop.run_forever, name="corerl-env-loop", daemon=True).start()
            return self.loop

    def submit(self, view: EpisodeView) -> Future[Answer]:
        """The answer to one episode's turn, as a future (it never raises: faults are answers)."""
        self.clock.started()
        future = asyncio.run_coroutine_threadsafe(self._one(view), self._running_loop())
        future.add_done_callback(self.clock.ended)
        return future

    def answer(self, views: Sequence[EpisodeView]) -> list[Answer]:
        """One answer per view, in order."""
        return [future.result() for future in [self.submit(view) for view in views]]

    def shutdown(self) -> None:
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.executor.shutdown(wait=False)  # a hung step's thread is not waited for


class EnvironmentActor:
    """The body of one Ray actor of a pool: builds the environment from its registration and
    answers chunks of episodes with an :class:`InProcessPool` of its own."""

    def __init__(self, registration: Any, context: Any, variables: dict[str, str] | None = None) -> None:
        from corerl.distributed.run_variables import adopt_run_variables

        adopt_run_variables(variables or {})  # the run's CORERL_* variables; a quiet run's output to run.log
        self.pool = InProcessPool(registration.create(context), context.settings.timeout_s)

    def answer(self, views: Sequence[EpisodeView]) -> list[Answer]:
        return self.pool.answer(views)


#: seconds before a call to a restarting actor is sent again
RESEND_S = 0.5

#: calls one environment actor runs at once (each on a thread of the actor, all on its pool's loop)
ACTOR_CONCURRENCY = 64


class RayPool:
    """``num_workers`` Ray actors (restarted by Ray when one dies); episodes are dealt to them in
    turn, each a call of its own, answered as soon as its step returns. An actor that dies
    mid-call fails its episodes (``env_error``); a call that finds its actor restarting (Ray cannot
    tell whether it ran) is sent once more; one that overruns a call's deadline is killed (Ray
    restarts it) and that episode times out."""

    def __init__(self, registration: Any, context: Any, num_workers: int, ray_address: str | None = None) -> None:
        import ray

        from corerl.distributed.run_variables import run_variables
        from corerl.distributed.worker_group import ensure_ray

        ensure_ray(ray_address)
        self.timeout_s = context.settings.timeout_s
        remote = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0,
                            max_concurrency=ACTOR_CONCURRENCY)(EnvironmentActor)
        variables = run_variables()
        self.actors = [remote.remote(registration, context, variables) for _ in range(num_workers)]
        self.clock = BusyClock()
        self.dealt = 0

    @property
    def seconds(self) -> float:
        return self.clock.seconds

    def submit(self, view: EpisodeView) -> Future[Answer]:
        """The answer to one episode's turn from the next actor, as a future (it never raises)."""
        from ray.exceptions import ActorUnavailableError, RayActorError

        index = self.dealt % len(self.actors)
        self.dealt += 1
        actor = self.actors[index]
        answer: Future[Answer] = Future()
        self.clock.started()
        answer.add_done_callback(self.clock.ended)

        def settle(result: Answer) -> None:
            try:
                answer.set_result(result)
            except InvalidStateError:  # the deadline's timer or the actor's answer came first
                pass

        def died(exc: Exception) -> Answer:
            return Answer(fault="env_error", cause=f"environment actor {index} died ({first_line(exc)}); Ray restarts it")

        sent = [0]

        def send() -> None:
            if not answer.done():
                sent[0] += 1
                actor.answer.remote([view]).future().add_done_callback(arrived)

        def arrived(done: Future) -> None:
            try:
                settle(done.result()[0])
            except ActorUnavailableError as exc:
                if sent[0] > 1:  # it died again under this very step: the step's fault
                    settle(died(exc))
                    return
                # the actor was restarting (after this step or an earlier one killed it): Ray cannot say
                # whether the step ran, so it is sent once more
                retry = threading.Timer(RESEND_S, send)
                retry.daemon = True
                retry.start()
            except RayActorError as exc:
                settle(died(exc))
            except Exception as exc:  # noqa: BLE001 - the actor's pool never raises: a bug, for the caller to see
                if not answer.done():
                    answer.set_exception(exc)

        def overran() -> None:  # the actor's own per-episode timeout fires first; past it the actor hangs
            if not answer.done():
                import ray

                ray.kill(actor, no_restart=False)
                settle(Answer(fault="env_timeout", cause=f"actor {index} overran {self.timeout_s:g} s; restarted"))

        timer = threading.Timer(self.timeout_s + 5.0, overran)
        timer.daemon = True
        timer.start()
        answer.add_done_callback(lambda _: timer.cancel())
        send()
        return answer

    def answer(self, views: Sequence[EpisodeView]) -> list[Answer]:
        """One answer per view, in order."""
        return [future.result() for future in [self.submit(view) for view in views]]

    def shutdown(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
