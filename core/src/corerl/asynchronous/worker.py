"""The generation worker of asynchronous RL: any generation backend, in a Ray actor of its own,
that takes new weights while it generates (imported in the actor's process).

The actor is threaded (``max_concurrency``): a ``generate`` call runs while ``update_weights``
hands over the next version. What happens to the requests in progress is ``in_flight``:

- ``continue``: the weights are loaded between two decoding steps and the requests go on with
  them (the KV cache of the tokens before stays as it was computed);
- ``abort``: the call ends at the next decoding step and returns the tokens so far; the driver
  resumes each request from its tokens under the new weights (partial rollouts);
- ``wait``: the weights are loaded when the call in progress ends.

Each completion token is stamped with the version of the weights that produced it
(``Sample.versions``). ``continue`` and ``abort`` need a backend that calls a hook between
decoding steps (the ``between_tokens`` attribute; the ``hf`` and ``vllm`` backends have it): with
the number of tokens generated so far, or, where requests advance apart (vLLM's scheduler), with
one count per sample of the call.

What a weight update carries (:meth:`GenerationWorker.update_weights`): the policy's weights; with
``policy.lora``, only its adapter (:class:`AdapterRefit`, which the backend takes by its
``load_adapter``, as a synchronous LoRA refit gives it); or, with
``algorithm.async.simulate_training``, nothing but the new version (:class:`SimulatedRefit`:
generation pauses for its seconds as for a real update, the weights stay as they are). An
adapter cannot reach the requests a streaming engine already runs (each request is bound to the
adapter it started with), so there ``continue`` lets an adapter wait for them, as ``wait`` does.

Every call into the backend runs on one thread of the worker's own (:attr:`GenerationWorker.engine`),
whichever of the actor's threads took the request: compiled CUDA graphs (the ``hf`` backend's
static KV cache on a GPU) are kept per thread by torch and assert when another thread replays them.

A backend whose engine can take requests while it runs offers ``stream`` (contract 2.12; the
``vllm`` backend where its engine lives in the worker's process): then the calls do not queue
behind each other. Each call's requests go into the one engine as the call arrives, one loop on
the engine thread steps the engine for all of them, and each call returns as soon as its own
requests are finished (:meth:`GenerationWorker._stream_loop`); weights arriving meanwhile are
loaded between two steps (``continue``), end the running calls (``abort``), or wait until the
running requests are done, new calls held back until then (``wait``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import attrs

from corerl.errors import ConfigError
from corerl.generation.contract import Sample, SamplingSettings, check_reads_images

T = TypeVar("T")
log = logging.getLogger(__name__)


#: where a version starts: one token index for every sample of the call (engines that decode all
#: requests in step), or one per sample, in call order (engines whose requests advance apart)
Position = int | Sequence[int]


def stamp(sample: Sample, switches: list[tuple[Position, int]], index: int = 0) -> Sample:
    """``sample`` (the ``index``-th of its call) with the version of each completion token:
    ``switches`` lists (index of the first token generated with a version, that version), in order."""

    def start(position: Position) -> int:
        return position if isinstance(position, int) else position[index]

    versions = []
    at = 0
    for token in range(len(sample.completion_ids)):
        while at + 1 < len(switches) and start(switches[at + 1][0]) <= token:
            at += 1
        versions.append(switches[at][1])
    return attrs.evolve(sample, versions=tuple(versions))


@attrs.frozen
class AdapterRefit:
    """A LoRA refit for the worker: the adapter's ``config`` (``adapter_config.json``'s content),
    the Hugging Face folder of its ``base`` and its ``tensors`` (PEFT's saved names), as
    :class:`corerl.lora.weights.AdapterWeights` carries them (plain data: it crosses to the actor)."""

    config: dict[str, Any]
    base: str
    tensors: dict[str, Any]

    def adapter(self) -> Any:
        """The refit as the generation contract's :class:`~corerl.lora.weights.AdapterWeights`."""
        from corerl.lora.weights import AdapterWeights

        tensors = self.tensors
        return AdapterWeights(None, self.config, self.base, lambda: tensors)


@attrs.frozen
class SimulatedRefit:
    """A simulated trainer's refit (``algorithm.async.simulate_training``): no weights, only the new
    version; generation stays paused for ``seconds`` where a real update would load."""

    seconds: float = 0.0


def check_in_flight(registration: Any, in_flight: str) -> None:
    """Refuse, in one line, ``continue`` or ``abort`` for a backend without the ``between_tokens`` hook."""
    if in_flight != "wait" and not hasattr(registration.load(), "between_tokens"):
        raise ConfigError(f"generation backend {registration.id!r} cannot take weights while a request runs (it has "
                          f"no between_tokens hook), so algorithm.async.in_flight={in_flight} cannot act",
                          key="algorithm.async.in_flight",
                          hint="use algorithm.async.in_flight=wait, or policy.generation.backend=hf")


def check_in_flight_chosen(config: Any, chosen: Any) -> None:
    """The validation table's row (:mod:`corerl.config.validation`): with ``algorithm.async``
    on, :func:`check_in_flight` for the chosen generation backend."""
    from corerl.config.async_section import async_settings

    settings = async_settings(config)
    registration = chosen.registration("generation_backend")
    if settings.enabled and registration is not None:
        check_in_flight(registration, settings.in_flight)


@attrs.define
class StreamedCall:
    """One ``generate`` call on a streaming engine: its arguments, its requests once started, the
    versions its samples switched at (one position per sample), and the future its caller waits on."""

    prompts: list[list[int]]
    sampling: SamplingSettings
    n: int
    done: Future = attrs.field(factory=Future)
    requests: Any = None
    switches: list[tuple[Position, int]] = attrs.field(factory=list)


class GenerationWorker:
    """One generation backend built from its ``registration`` and ``config`` in this process."""

    def __init__(self, registration: Any, config: Any, threads: int | None, in_flight: str,
                 variables: dict[str, str] | None = None) -> None:
        from corerl import start_up
        from corerl.distributed.run_variables import adopt_run_variables

        adopt_run_variables(variables or {})  # the run's CORERL_* variables; a quiet run's output to run.log
        with start_up.starting():  # torch, the backend's imports and its engine: few garbage collections
            if threads:
                import torch

                torch.set_num_threads(threads)
            check_in_flight(registration, in_flight)
            self.engine = ThreadPoolExecutor(max_workers=1, thread_name_prefix="generation-engine")
            self.backend = self._on_engine(registration.create, config=config)
        self.registration = registration
        self.in_flight = in_flight
        self.version = 0
        self.pending: tuple[int, Any] | None = None  # (version, what update_weights took)
        self.generating = threading.Lock()  # held for a whole generate call
        self.handover = threading.Lock()  # guards pending
        self.switches: list[tuple[Position, int]] = []
        self.aborted = False
        self.stream = getattr(self.backend, "stream", None)  # an engine that takes requests while it runs
        self.incoming: list[StreamedCall] = []
        self.running: list[StreamedCall] = []
        self.loop_lock = threading.Lock()  # guards incoming and looping
        self.looping = False

    def _on_engine(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``call(*args, **kwargs)`` on the engine's thread; its result, or what it raised."""
        return self.engine.submit(call, *args, **kwargs).result()

    def pid(self) -> int:
        return os.getpid()

    def load_hf(self, model_path: str) -> None:
        check_reads_images(self.backend, self.registration, model_path)
        with self.generating:
            self._on_engine(self.backend.load_hf, model_path)

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings, n: int) -> tuple[list[list[Sample]], bool]:
        """The backend's samples, stamped with versions, and whether an update cut the call short."""
        if self.stream is not None:
            return self._generate_streamed(prompts, sampling, n)
        with self.generating:
            self._apply_pending()
            self.switches, self.aborted = [(0, self.version)], False
            if self.in_flight != "wait":
                self.backend.between_tokens = self._between_tokens
            try:
                groups = self._on_engine(self.backend.generate, prompts, sampling, n)
            finally:
                if self.in_flight != "wait":
                    self.backend.between_tokens = None
            stamped = [[stamp(s, self.switches, p * n + j) for j, s in enumerate(group)]
                       for p, group in enumerate(groups)]
            return stamped, self.aborted

    def _between_tokens(self, generated: Position) -> bool:
        with self.handover:
            if self.pending is None:
                return False
            if self.in_flight == "abort":
                self.aborted = True
                return True
            version, update = self.pending
            self.pending = None
        self._load(update)
        self.version = version
        self.switches.append((generated, version))
        return False

    def _generate_streamed(self, prompts: list[list[int]], sampling: SamplingSettings,
                           n: int) -> tuple[list[list[Sample]], bool]:
        """The call's requests handed to the engine loop (started if it is not running); its result."""
        call = StreamedCall(prompts, sampling, n)
        with self.loop_lock:
            self.incoming.append(call)
            start, self.looping = not self.looping, True
        if start:
            self.engine.submit(self._stream_loop)
        return call.done.result()

    def _stream_loop(self) -> None:
        """On the engine thread, while any call is running or waiting: weights first (as ``in_flight``
        says), then the calls that arrived, then one engine step; each call whose requests are all
        finished is answered. Returns when nothing is left; a failure fails every call it holds."""
        try:
            while True:
                with self.loop_lock:
                    if not self.incoming and not self.running:
                        self.looping = False
                        return
                held = self._weights_between_steps()
                with self.loop_lock:
                    arrived, self.incoming = ([], self.incoming) if held else (self.incoming, [])
                for call in arrived:
                    call.requests = self.stream.start(call.prompts, call.sampling, call.n)
                    call.switches = [(0, self.version)]
                    self.running.append(call)
                if self.running:
                    self.stream.step()
                    self._stepped(self.running)
                for call in [c for c in self.running if c.requests.finished]:
                    self.running.remove(call)
                    self._answer(call)
        except BaseException as exc:
            with self.loop_lock:
                failed, self.running, self.incoming, self.looping = self.running + self.incoming, [], [], False
            for call in failed:
                call.done.set_exception(exc)
            log.debug("the generation engine's loop failed", exc_info=True)

    def _stepped(self, running: list[StreamedCall]) -> None:
        """Called after each engine step with the running calls (a test's hook; nothing here)."""

    def _weights_between_steps(self) -> bool:
        """Pending weights loaded now, or the running calls ended first (``abort``); True while they
        must wait for the running requests (``wait``): new calls are held back until then."""
        with self.handover:
            if self.pending is None:
                return False
            # an adapter cannot reach running requests (each is bound to the one it started with)
            waits = self.in_flight == "wait" or (self.in_flight == "continue" and isinstance(self.pending[1],
                                                                                             AdapterRefit))
            if self.running and waits:
                return True
            version, update = self.pending
            self.pending = None
        if self.running and self.in_flight == "abort":
            for call in self.running:
                self.stream.abort(call.requests)
                self._answer(call)
            self.running = []
        self._load(update)
        self.version = version
        for call in self.running:  # continue: each sample goes on from where it stands
            call.switches.append((call.requests.counts(), version))
        return False

    def _answer(self, call: StreamedCall) -> None:
        groups = call.requests.samples()
        stamped = [[stamp(s, call.switches, p * call.n + j) for j, s in enumerate(group)]
                   for p, group in enumerate(groups)]
        call.done.set_result((stamped, bool(call.requests.aborted)))

    def update_weights(self, weights: Any, version: int) -> int:
        """Take weights of ``version`` (a shared-memory manifest, (name, tensor) pairs, an
        :class:`AdapterRefit` or a :class:`SimulatedRefit`): loaded now when nothing is generated,
        else as ``in_flight`` says. Returns the version loaded now."""
        from corerl.generation.shared_weights import WeightManifest, read_shared

        update: Any
        if isinstance(weights, AdapterRefit):
            update = attrs.evolve(weights, tensors={k: t.clone() for k, t in weights.tensors.items()})
        elif isinstance(weights, SimulatedRefit):
            update = weights
        else:
            pairs = read_shared(weights) if isinstance(weights, WeightManifest) else weights
            update = [(name, tensor.clone()) for name, tensor in pairs]  # the file is rewritten by the next update
        with self.handover:
            self.pending = (version, update)
        if self.stream is not None:
            with self.loop_lock:
                if self.looping:
                    return self.version  # the engine loop loads them between two steps
                self.looping = True  # no loop starts while they load
            try:
                self._apply_pending()  # on the engine thread
            finally:
                with self.loop_lock:
                    self.looping = bool(self.incoming)
                    if self.looping:  # calls that arrived meanwhile
                        self.engine.submit(self._stream_loop)
            return self.version
        if self.generating.acquire(blocking=False):
            try:
                self._apply_pending()
            finally:
                self.generating.release()
        return self.version

    def sync(self) -> int:
        """Wait for the call in progress and load any pending weights; the version loaded."""
        with self.generating:
            self._apply_pending()
            return self.version

    def _apply_pending(self) -> None:
        with self.handover:
            pending, self.pending = self.pending, None
        if pending is not None:
            self._on_engine(self._load, pending[1])
            self.version = pending[0]

    def _load(self, update: Any) -> None:
        """One update into the backend, on the engine thread (generation waits meanwhile)."""
        if isinstance(update, AdapterRefit):
            self.backend.load_adapter(update.adapter())
        elif isinstance(update, SimulatedRefit):
            import time

            time.sleep(update.seconds)  # the weights stay; generation pauses as for a real update
        else:
            self.backend.update_weights(update)

    def shutdown(self) -> None:
        self._on_engine(self.backend.shutdown)
        self.engine.shutdown(wait=False)
