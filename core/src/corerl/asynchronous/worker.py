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

Every call into the backend runs on one thread of the worker's own (:attr:`GenerationWorker.engine`),
whichever of the actor's threads took the request: compiled CUDA graphs (the ``hf`` backend's
static KV cache on a GPU) are kept per thread by torch and assert when another thread replays them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import attrs

from corerl.errors import ConfigError
from corerl.generation.contract import Sample, SamplingSettings

T = TypeVar("T")


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


def check_in_flight(registration: Any, in_flight: str) -> None:
    """Refuse, in one line, ``continue`` or ``abort`` for a backend without the ``between_tokens`` hook."""
    if in_flight != "wait" and not hasattr(registration.load(), "between_tokens"):
        raise ConfigError(f"generation backend {registration.id!r} cannot take weights while a request runs (it has "
                          f"no between_tokens hook), so algorithm.async.in_flight={in_flight} cannot act",
                          key="algorithm.async.in_flight",
                          hint="use algorithm.async.in_flight=wait, or policy.generation.backend=hf")


class GenerationWorker:
    """One generation backend built from its ``registration`` and ``config`` in this process."""

    def __init__(self, registration: Any, config: Any, threads: int | None, in_flight: str) -> None:
        from corerl.reporting.quiet import write_output_to_run_log

        write_output_to_run_log()  # a quiet run: this actor's output goes to run.log
        if threads:
            import torch

            torch.set_num_threads(threads)
        check_in_flight(registration, in_flight)
        self.engine = ThreadPoolExecutor(max_workers=1, thread_name_prefix="generation-engine")
        self.backend = self._on_engine(registration.create, config=config)
        self.in_flight = in_flight
        self.version = 0
        self.pending: tuple[int, list[tuple[str, Any]]] | None = None
        self.generating = threading.Lock()  # held for a whole generate call
        self.handover = threading.Lock()  # guards pending
        self.switches: list[tuple[Position, int]] = []
        self.aborted = False

    def _on_engine(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``call(*args, **kwargs)`` on the engine's thread; its result, or what it raised."""
        return self.engine.submit(call, *args, **kwargs).result()

    def pid(self) -> int:
        return os.getpid()

    def load_hf(self, model_path: str) -> None:
        with self.generating:
            self._on_engine(self.backend.load_hf, model_path)

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings, n: int) -> tuple[list[list[Sample]], bool]:
        """The backend's samples, stamped with versions, and whether an update cut the call short."""
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
            version, weights = self.pending
            self.pending = None
        self.backend.update_weights(weights)
        self.version = version
        self.switches.append((generated, version))
        return False

    def update_weights(self, weights: Any, version: int) -> int:
        """Take weights of ``version`` (a shared-memory manifest, or (name, tensor) pairs): loaded now
        when nothing is generated, else as ``in_flight`` says. Returns the version loaded now."""
        from corerl.generation.shared_weights import WeightManifest, read_shared

        pairs = read_shared(weights) if isinstance(weights, WeightManifest) else weights
        copied = [(name, tensor.clone()) for name, tensor in pairs]  # the file is rewritten by the next update
        with self.handover:
            self.pending = (version, copied)
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
            self._on_engine(self.backend.update_weights, pending[1])
            self.version = pending[0]

    def shutdown(self) -> None:
        self._on_engine(self.backend.shutdown)
        self.engine.shutdown(wait=False)
