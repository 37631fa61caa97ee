"""The environment conformance suite: subclass :class:`EnvironmentConformance`.

Any registered step environment runs the same checks, in this process, with no model: the
suite plays scripted model turns (:attr:`EnvironmentConformance.responses`, or your
:meth:`~EnvironmentConformance.respond`) on your rows through the pool a run uses
(:class:`corerl.environments.pool.InProcessPool`, with the section's ``timeout_s``)::

    import corerl_myenv.plugin
    from corerl.testing.environment_conformance import EnvironmentConformance

    class TestMyEnvironment(EnvironmentConformance):
        environment_id = "myenv"
        plugin = corerl_myenv.plugin           # None: the installed plugins are discovered
        settings = {"hints": False}            # keys of env.myenv
        rows = [{"answer": "3"}, {"answer": "7"}]
        responses = ["5", "3"]                 # the model's turns, in order (the last one repeats)
        failing_rows = [{}]                    # rows the environment must fail on (reported, not hidden)

The checks:

(a) every scripted episode ends: the environment says ``done`` within :attr:`max_turns` turns,
    with no fault on the way;
(b) every reward is a real number (not a bool, not text), finite;
(c) every observation of an episode that goes on is text or chat messages (mappings with a
    ``role`` and a ``content``) and encodes to tokens after a model turn, with and without a
    chat template (:class:`corerl.environments.encoding.ObservationEncoder`);
(d) state is per episode: one environment object answering every episode's turns together gives
    what it gives each episode alone, and every ``Turn.state`` pickles (for ``num_workers`` > 0);
(e) errors are reported: on each of :attr:`failing_rows` the episode ends as an ``env_error`` fault
    with a one-line cause, which the run's stop line names with the row (no silent reward 0);
(f) timeouts are reported: (1) under a timeout shorter than a step (:attr:`short_timeout_s`) each
    answer is the step's ``Turn`` or an ``env_timeout`` fault; (2) a step that cannot end before its
    timeout gets one: the suite holds each of your steps (in its own kind, ``async def`` or plain)
    until the pool has answered, so every answer must be an ``env_timeout`` fault, and a pool that
    does not enforce the timeout fails here instead of passing; (3) an ``async def step`` makes no
    blocking call on the event loop (``time.sleep``, waiting for a process, a blocking socket):
    such a call holds the loop, so no timeout can fire while it lasts. No check here reads a clock.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
import pickle
import sys
import threading
from collections.abc import Callable, Generator, Mapping, Sequence
from concurrent.futures import Future, wait
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, ClassVar

import attrs
import pytest

#: a ChatML template (as Qwen's), set on a copy of the tokenizer for check (c)
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@attrs.define
class Played:
    """One episode as the suite played it: the model's turns, the pool's answers, how it ended."""

    row: Any
    responses: list[str] = attrs.field(factory=list)
    answers: list[Any] = attrs.field(factory=list)
    state: Any = None
    #: ``done``, ``max_turns``, or the fault that ended it (``env_error``, ``env_timeout``, ``env_malformed``)
    ended: str | None = None

    def turns(self) -> list[Any]:
        """The environment's :class:`~corerl.environments.contract.Turn` of each answered turn."""
        return [a.turn for a in self.answers if a.turn is not None]

    def transcript(self) -> list[tuple[Any, ...]]:
        """What the episode saw, turn by turn: reward, done, observation and state (pickled), or the fault."""
        out: list[tuple[Any, ...]] = []
        for answer in self.answers:
            turn = answer.turn
            if turn is None:
                out.append((answer.fault, answer.cause))
            else:
                out.append((turn.reward, turn.done, turn.observation, _pickled(turn.state)))
        return out


def _pickled(state: Any) -> Any:
    try:
        return pickle.dumps(state)
    except Exception as exc:  # reported by check (d)
        return f"unpicklable: {type(exc).__name__}"


def is_real(value: Any) -> bool:
    """A reward a run adds up: a real number (a numpy scalar too), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@attrs.define
class Built:
    """The environment under test as a run builds it, and what it was built from."""

    registration: Any
    context: Any
    environment: Any


def describe(row: Any) -> str:
    """A row, shortened, for failure lines."""
    from corerl.environments.rollout import row_label

    return row_label(row)


class EnvironmentConformance:
    """Base class of an environment's conformance tests; set :attr:`environment_id`, :attr:`rows`
    and the model's turns (:attr:`responses` or :meth:`respond`)."""

    environment_id: ClassVar[str]
    #: a plugin module (or object) to register beside the installed plugins; None: the installed
    #: plugins alone (the environment's plugin among them)
    plugin: ClassVar[Any] = None
    #: keys of the environment's section ``env.<id>`` (validated by its schema, as in a recipe)
    settings: ClassVar[Mapping[str, Any]] = {}
    #: other recipe keys the environment reads (``data.reward``, ``data.answer_key``, ...)
    recipe: ClassVar[Mapping[str, Any]] = {}
    #: the dataset rows episodes are played on (as the task gives them)
    rows: ClassVar[Sequence[Any]] = ({"answer": "3"},)
    #: the model's turns: turn t says ``responses[t - 1]`` (the last one again after that)
    responses: ClassVar[Sequence[str]] = ("3",)
    #: turns an episode may take before check (a) fails it (``algorithm.max_rollout_turns``)
    max_turns: ClassVar[int] = 4
    #: rows the environment cannot answer (a missing field): each must end as an env_error fault
    failing_rows: ClassVar[Sequence[Any]] = ()
    #: the timeout of check (f), seconds (shorter than a step; an answer may still beat it)
    short_timeout_s: ClassVar[float] = 0.05
    #: no longer read (check (f) reads no clock since 2.15); kept so that subclasses setting it still load
    timeout_slack_s: ClassVar[float] = 2.0
    #: seconds check (f) waits for the pool to answer a held step before it lets the step go: a guard
    #: against a hang only (a pool that enforces the timeout answers after :attr:`short_timeout_s`)
    hang_guard_s: ClassVar[float] = 60.0

    @classmethod
    def respond(cls, row: Any, turn: int) -> str:
        """The model's turn ``turn`` (1 first) of the episode on ``row``; override for answers
        that depend on the row."""
        return cls.responses[min(turn, len(cls.responses)) - 1]

    # -- building and playing ----------------------------------------------------------

    @classmethod
    def _build(cls, folder: Path) -> Built:
        """The environment built from its registration with the context a run gives it: its
        section validated, the run's seed, tokenizer, tools, tool parsers, reward and data."""
        from corerl.config.tree import deep_merge
        from corerl.environments.contract import EnvironmentContext
        from corerl.models.tiny import build_tokenizer
        from corerl.testing import host_for_component, select_for, write_recipe

        host, registration = host_for_component("environments", cls.environment_id, cls.plugin, "environment")
        if registration.plays == "agent":
            pytest.skip(f"environment {cls.environment_id!r} is an agent harness (plays='agent'), not a step environment")
        recipe = deep_merge({
            "policy": {"model_name": "builtin:tiny-qwen2"},
            "algorithm": {"name": "grpo", "max_rollout_turns": cls.max_turns},
            "data": {"env_name": cls.environment_id},
            "env": {cls.environment_id: dict(cls.settings)},
        }, cls.recipe)
        config, selection = select_for(host, write_recipe(folder / "environment.yaml", recipe))
        context = EnvironmentContext(config.section(f"env.{cls.environment_id}"), config.core.algorithm.seed,
                                     build_tokenizer(128), tools={t.id: t for t in host.tools},
                                     tool_parsers={p.id: p for p in host.tool_parsers}, reward=selection.reward_fn,
                                     data=config.core.data)
        return Built(registration, context, registration.create(context))

    @classmethod
    def _play(cls, environment: Any, rows: Sequence[Any], timeout_s: float) -> list[Played]:
        """Episodes on ``rows``, every live one's turn answered together by one pool call (as a
        run's rollout does), until each ends: done, :attr:`max_turns`, or a fault."""
        from corerl.environments.contract import EpisodeView
        from corerl.environments.pool import InProcessPool
        from corerl.environments.rollout import clean_row

        pool = InProcessPool(environment, timeout_s)
        episodes = [Played(row) for row in rows]
        live, turn = list(episodes), 1
        try:
            while live:
                for episode in live:
                    episode.responses.append(cls.respond(episode.row, turn))
                views = [EpisodeView(row=clean_row(e.row), turn=turn, responses=tuple(e.responses), state=e.state)
                         for e in live]
                still = []
                for episode, answer in zip(live, pool.answer(views), strict=True):
                    episode.answers.append(answer)
                    if answer.turn is None:
                        episode.ended = answer.fault
                    elif answer.turn.done:
                        episode.state, episode.ended = answer.turn.state, "done"
                    elif turn >= cls.max_turns:
                        episode.state, episode.ended = answer.turn.state, "max_turns"
                    else:
                        episode.state = answer.turn.state
                        still.append(episode)
                live, turn = still, turn + 1
        finally:
            pool.shutdown()
        return episodes

    # -- fixtures ----------------------------------------------------------------------

    @pytest.fixture(scope="class")
    @classmethod
    def built(cls, tmp_path_factory: pytest.TempPathFactory) -> Built:
        return cls._build(tmp_path_factory.mktemp("environment-conformance"))

    @classmethod
    def _play_both_ways(cls, built: Built) -> tuple[list[Played], list[Played]]:
        """Every row's episode played together, then each alone (last row first), all by one
        environment object."""
        timeout = built.context.settings.timeout_s
        together = cls._play(built.environment, cls.rows, timeout)
        alone = [cls._play(built.environment, [row], timeout)[0] for row in reversed(cls.rows)]
        return together, alone[::-1]

    @pytest.fixture(scope="class")
    @classmethod
    def played(cls, built: Built) -> tuple[list[Played], list[Played]]:
        return cls._play_both_ways(built)

    # -- (a) ---------------------------------------------------------------------------

    def test_episodes_end(self, played: tuple[list[Played], list[Played]]) -> None:
        for episode in played[0]:
            where = f"the episode on {describe(episode.row)}"
            if episode.ended not in ("done", "max_turns"):
                answer = episode.answers[-1]
                pytest.fail(f"{where} ended at turn {len(episode.answers)} by {answer.fault}: {answer.cause}",
                            pytrace=False)
            assert episode.ended == "done", (
                f"{where} did not end within {self.max_turns} turns (the model said {episode.responses!r}): return "
                "Turn(done=True) when the episode is over, or give responses that end it")

    # -- (b) ---------------------------------------------------------------------------

    def test_rewards_are_numbers(self, played: tuple[list[Played], list[Played]]) -> None:
        for episode in played[0]:
            for number, turn in enumerate(episode.turns(), start=1):
                assert is_real(turn.reward) and math.isfinite(turn.reward), (
                    f"turn {number} of the episode on {describe(episode.row)} has reward {turn.reward!r} "
                    f"({type(turn.reward).__name__}), not a finite number: return a float (a run takes what float() "
                    "reads, and ends the episode as env_malformed with reward 0 where it fails)")

    # -- (c) ---------------------------------------------------------------------------

    def test_observations_encode(self, built: Built, played: tuple[list[Played], list[Played]]) -> None:
        from corerl.environments.encoding import ObservationEncoder

        plain = built.context.tokenizer
        encoders = {"without a chat template": ObservationEncoder(plain),
                    "with a chat template": ObservationEncoder(_with_template(plain))}
        for episode in played[0]:
            for number, turn in enumerate(episode.turns(), start=1):
                where = f"turn {number} of the episode on {describe(episode.row)}"
                if turn.done:
                    continue
                observation = turn.observation
                assert observation is not None, (f"{where} goes on (done=False) with no observation: a run ends it as "
                                                 "env_malformed; return Turn(observation=...) or done=True")
                if not isinstance(observation, str):
                    wrong = [m for m in observation if not (isinstance(m, Mapping) and isinstance(m.get("role"), str)
                                                            and isinstance(m.get("content"), str))]
                    assert not wrong, (f"{where}: observation {wrong[0]!r} is not a chat message "
                                       "({'role': ..., 'content': ...}, both text)")
                for label, encoder in encoders.items():
                    for ended_with_stop in (True, False):
                        ids = encoder.encode(observation, ended_with_stop=ended_with_stop)
                        assert ids and all(isinstance(i, int) for i in ids), (
                            f"{where}: the observation {observation!r} encodes to no tokens {label}")

    # -- (d) ---------------------------------------------------------------------------

    def test_state_is_kept_per_episode(self, played: tuple[list[Played], list[Played]]) -> None:
        together, alone = played
        for mixed, single in zip(together, alone, strict=True):
            for number, turn in enumerate(mixed.turns(), start=1):
                state = _pickled(turn.state)
                assert not (isinstance(state, str) and state.startswith("unpicklable")), (
                    f"turn {number} of the episode on {describe(mixed.row)} returned a state that does not pickle "
                    f"({state}): an environment with num_workers > 0 sends it between processes")
            ours, theirs = mixed.transcript(), single.transcript()
            assert ours == theirs, (
                f"the episode on {describe(mixed.row)} went otherwise when other episodes' turns were answered in "
                f"between ({len(ours)} turns, then {len(theirs)} alone; first difference at turn "
                f"{_first_difference(ours, theirs)}): keep what an episode remembers in Turn.state, not on the "
                "environment object, which answers every episode in any order")

    # -- (e) ---------------------------------------------------------------------------

    def test_errors_are_reported_as_the_episodes_faults(self, built: Built) -> None:
        from corerl.environments.rollout import PlayedEpisode, check_failures
        from corerl.errors import RunError

        if not self.failing_rows:
            pytest.skip("no failing_rows: name rows the environment cannot answer to check how it fails")
        episodes = self._play(built.environment, self.failing_rows, built.context.settings.timeout_s)
        for episode in episodes:
            where = f"the episode on failing row {describe(episode.row)}"
            assert episode.ended not in ("done", "max_turns"), (
                f"{where} ended by {episode.ended}, with no error: an environment that cannot answer a row raises "
                "(the run counts it in env/failures and names the row), instead of scoring it quietly")
            answer = episode.answers[-1]
            assert answer.fault == "env_error", f"{where} ended by {answer.fault} ({answer.cause}), not env_error"
            assert answer.cause.strip() and "\n" not in answer.cause, f"{where}: the cause {answer.cause!r} is not one line"
        first = episodes[0]
        played = PlayedEpisode([], first.row, describe(first.row), stop="env_error", cause=first.answers[-1].cause)
        with pytest.raises(RunError) as stopped:
            check_failures([played], self.environment_id, max_failure_share=0.0)
        line = str(stopped.value)
        assert "\n" not in line and describe(first.row) in line and f"environment {self.environment_id!r}" in line

    # -- (f) ---------------------------------------------------------------------------

    def test_timeouts_are_reported_without_waiting_for_the_step(self, built: Built) -> None:
        from corerl.environments.contract import EpisodeView
        from corerl.environments.pool import InProcessPool
        from corerl.environments.rollout import clean_row

        views = [EpisodeView(row=clean_row(row), turn=1, responses=(self.respond(row, 1),)) for row in self.rows]
        # (1) the environment's own steps under a short timeout: a Turn, or the timeout's fault
        pool = InProcessPool(built.environment, self.short_timeout_s)
        try:
            answers = pool.answer(views)
        finally:
            pool.shutdown()
        for row, answer in zip(self.rows, answers, strict=True):
            assert answer.turn is not None or answer.fault == "env_timeout", (
                f"the first turn on {describe(row)} ended by {answer.fault} ({answer.cause}) under a short timeout")
        # (2) a real timeout: each step held (in its own kind) until the pool has answered
        gate = _Gate()
        pool = InProcessPool(_Held(built.environment, gate), self.short_timeout_s)
        try:
            futures = [pool.submit(view) for view in views]
            finished, _ = wait(futures, timeout=self.hang_guard_s)  # a guard against a hang only
            gate.open(run=bool(set(futures) - finished))  # a step the pool did not time out runs, and answers
            done = [_answered(future, self.hang_guard_s) for future in futures]
        finally:
            gate.open(run=False)  # (a no-op once open) the held steps end without running
            pool.shutdown()
        kind = "an async def" if inspect.iscoroutinefunction(built.environment.step) else "a plain"
        for row, answer in zip(self.rows, done, strict=True):
            assert answer is not None and answer.fault == "env_timeout", (
                f"{kind} step on {describe(row)} held past the {self.short_timeout_s:g} s timeout was "
                + ("not answered within the hang guard" if answer is None else f"answered {answer!r}")
                + ": the timeout could not fire, so a run would wait for the step however long it takes")
            assert f"{self.short_timeout_s:g}" in answer.cause, answer
        # (3) an async def step gives the event loop back while it waits
        if inspect.iscoroutinefunction(built.environment.step):
            watched = _Watched(built.environment)
            pool = InProcessPool(watched, built.context.settings.timeout_s)
            try:
                pool.answer(views)
            finally:
                pool.shutdown()
            assert not watched.blocking, (
                f"the async def step made blocking calls on the event loop ({', '.join(sorted(watched.blocking))}): "
                "the timeout could not fire while they lasted (await the work, or run it with asyncio.to_thread, "
                "or make step a plain def)")


def _answered(future: Future[Any], guard_s: float) -> Any:
    """The answer of ``future``, None if it has none within ``guard_s`` (a hang guard, not a speed check)."""
    try:
        return future.result(timeout=guard_s)
    except FutureTimeout:
        return None


class _Gate:
    """Where check (f)'s held steps wait: :meth:`open` lets them go, to run the real step or not."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.run = False

    def open(self, run: bool) -> None:
        if not self.opened.is_set():
            self.run = run
            self.opened.set()


class _Held:
    """The environment with each step held until ``gate`` opens, in the step's own kind: an
    ``async def`` step waits without holding the loop (the pool's timeout can cancel it), a plain
    one blocks its thread. Opened with ``run``, the real step runs; else the step ends with None."""

    def __init__(self, environment: Any, gate: _Gate) -> None:
        self.environment, self.gate = environment, gate
        self.step = self._held_coroutine if inspect.iscoroutinefunction(environment.step) else self._held_plain

    async def _held_coroutine(self, view: Any) -> Any:
        while not self.gate.opened.is_set():
            await asyncio.sleep(0.01)
        return await self.environment.step(view) if self.gate.run else None

    def _held_plain(self, view: Any) -> Any:
        self.gate.opened.wait()
        return self.environment.step(view) if self.gate.run else None


#: calls that block the thread they run on: on an event loop's thread they hold the whole loop
_BLOCKING_FUNCTIONS = {"sleep": ("time",), "waitpid": ("posix", "nt"), "wait": ("posix",), "wait3": ("posix",),
                       "wait4": ("posix",), "waitid": ("posix",), "select": ("select",)}
_BLOCKING_METHODS = {"poll": ("poll", "epoll", "devpoll", "kqueue"), "control": ("kqueue",)}
_SOCKET_CALLS = {"recv", "recv_into", "recvfrom", "recvfrom_into", "recvmsg", "send", "sendall", "sendto",
                 "sendmsg", "accept", "connect", "connect_ex"}


def blocking_call(function: Any) -> str | None:
    """The name of ``function`` when calling it blocks its thread (a builtin the profiler reports
    as ``c_call``), else None: ``time.sleep``, waiting for a process, ``select``/``poll``, and the
    I/O calls of a socket in blocking mode (a non-blocking socket's, as asyncio's, never wait)."""
    name = getattr(function, "__name__", "")
    owner = getattr(function, "__self__", None)
    module = getattr(function, "__module__", None) or getattr(owner, "__name__", None)
    if name in _BLOCKING_FUNCTIONS and module in _BLOCKING_FUNCTIONS[name]:
        return f"{'os' if module in ('posix', 'nt') else module}.{name}"
    if owner is None or isinstance(owner, type(sys)):
        return None
    kind = type(owner).__name__
    if name in _BLOCKING_METHODS and kind in _BLOCKING_METHODS[name]:
        return f"select.{kind}.{name}"
    if name in _SOCKET_CALLS and kind in ("socket", "SSLSocket") and hasattr(owner, "gettimeout"):
        try:
            blocking = owner.gettimeout() != 0.0
        except OSError:  # a closed socket: the call fails rather than waits
            return None
        return f"socket.{name}" if blocking else None
    return None


class _Watched:
    """The environment with its ``async def`` step driven one resumption at a time under a profiler
    of this thread that records the blocking calls (:func:`blocking_call`) each resumption makes."""

    def __init__(self, environment: Any) -> None:
        self.environment = environment
        self.blocking: set[str] = set()

    async def step(self, view: Any) -> Any:
        return await _Resumptions(self.environment.step(view), self._profile)

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event == "c_call" and (name := blocking_call(arg)) is not None:
            self.blocking.add(name)


class _Resumptions:
    """Awaits ``coroutine`` with ``profile`` set on this thread while the coroutine runs (between
    the points where it gives the loop back), and only then."""

    def __init__(self, coroutine: Any, profile: Callable[..., None]) -> None:
        self.coroutine, self.profile = coroutine, profile

    def __await__(self) -> Generator[Any, Any, Any]:
        value: Any = None
        error: BaseException | None = None
        while True:
            before = sys.getprofile()
            sys.setprofile(self.profile)  # per thread: the loop's own, for as long as the coroutine runs
            try:
                yielded = self.coroutine.send(value) if error is None else self.coroutine.throw(error)
            except StopIteration as stop:
                return stop.value
            finally:
                sys.setprofile(before)
            try:
                value, error = (yield yielded), None
            except BaseException as exc:  # the timeout's cancellation, thrown in: the coroutine gets it
                value, error = None, exc


def _with_template(tokenizer: Any) -> Any:
    """A copy of ``tokenizer`` with :data:`CHAT_TEMPLATE` (the tokenizer itself is left as it is)."""
    import copy

    chat = copy.deepcopy(tokenizer)
    chat.chat_template = CHAT_TEMPLATE
    return chat


def _first_difference(ours: list[Any], theirs: list[Any]) -> int:
    for number, (a, b) in enumerate(zip(ours, theirs, strict=False), start=1):
        if a != b:
            return number
    return min(len(ours), len(theirs)) + 1
