"""The driver's side of dedicated generation: a generation engine (the
:class:`~corerl.generation.contract.GenerationEngine` methods) over a
:class:`~corerl.asynchronous.worker.GenerationWorker` in a Ray actor, plus :meth:`push`, which
hands the worker a new policy version without waiting for what it is generating.

The worker runs in the ``generation`` pool (:mod:`corerl.distributed.placement`): GPUs of its
own (``policy.generation.colocated.resources``) on a cluster with GPUs, else a process of its
own with ``algorithm.async.generation_threads`` CPU threads. A worker that dies is started
again with the newest weights and the call it was serving is repeated (its prompts requeued),
up to ``algorithm.async.max_generation_failures`` times.

A push returns once the weights are written for the worker (to shared memory on the same node);
the worker takes them on a thread of this engine's own (:attr:`DedicatedGeneration.sender`), so
the trainer's next step does not wait for the round trip or for the worker copying them while it
generates. The next push, a refit by the contract (:meth:`DedicatedGeneration.update_weights`) and
:meth:`DedicatedGeneration.settle` wait for the hand-over before (the shared-memory file is
rewritten by the next push); a hand-over that failed for good raises there.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import attrs

from corerl.errors import RunError
from corerl.generation.contract import Sample, SamplingSettings

log = logging.getLogger(__name__)


def resume_seed(seed: int | None, part: int) -> int | None:
    """The seed of the ``part``-th resumption of an aborted call (part 0: the call's own seed)."""
    if seed is None or part == 0:
        return seed
    import hashlib

    digest = hashlib.blake2b(f"{seed}:resume:{part}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF


def joined(head: Sample, tail: Sample) -> Sample:
    """A request cut by an abort (``head``) and its resumption from its tokens (``tail``) as one sample."""
    return attrs.evolve(head, completion_ids=head.completion_ids + tail.completion_ids,
                        logprobs=head.logprobs + tail.logprobs, finish_reason=tail.finish_reason,
                        versions=(head.versions or ()) + (tail.versions or ()),
                        # the resumption ran the head's tokens again (its prompt holds them): its routes cover both
                        routed_experts=tail.routed_experts if tail.routed_experts is not None else head.routed_experts)


class DedicatedGeneration:
    """A generation backend's ``registration`` run by a worker of its own (see the module doc)."""

    def __init__(self, registration: Any, config: Any, settings: Any) -> None:
        self.registration, self.config, self.settings = registration, config, settings
        self.version = 0  # the newest version the worker holds
        self.pushing = 0  # the newest version handed over (what a restarted worker loads)
        self.restarts = 0
        self.model_path: str | None = None
        self.manifest: Any = None  # the newest weights (shared-memory manifest), for a restarted worker
        self.writer: Any = None
        self.pool: Any = None
        self.actor: Any = None
        self.pid = 0
        self.closed = False
        self.failure: RunError | None = None  # set once the restarts are spent
        self.handle = threading.RLock()  # one restart at a time; a push never lands on a dead worker's handle
        self.sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="corerl-weights-hand-over")
        self.handing: Future | None = None  # the hand-over in progress (update_weights on the worker)
        self.on_version: Callable[[], None] | None = None  # told when the worker holds a new version
        from .worker import check_in_flight

        check_in_flight(registration, settings.in_flight)  # here, before any process starts
        self._start()

    # -- the worker's life ----------------------------------------------------------------------

    @property
    def threads(self) -> int:
        """CPU threads of the worker (on CPU; half the cores unless algorithm.async.generation_threads says)."""
        cores = os.cpu_count() or 1
        return self.settings.generation_threads or max(1, cores // 2)

    def _start(self) -> None:
        import ray

        from corerl.distributed.placement import POOLS, async_generation_layout
        from corerl.distributed.run_variables import run_variables
        from corerl.distributed.worker_group import ensure_ray
        from corerl.generation.shared_weights import SharedWeightWriter

        from .worker import GenerationWorker

        core = self.config.core
        ensure_ray(core.cluster.ray_address, 2)
        self.pool = POOLS.acquire(async_generation_layout(core.policy.generation.colocated.resources), 1,
                                  "generation worker")
        actor = ray.remote(GenerationWorker).options(max_concurrency=4, max_restarts=0, **self.pool.actor_options(0))
        self.actor = actor.remote(self.registration, self.config, self.threads, self.settings.in_flight, run_variables())
        self.pid = self._get(self.actor.pid.remote())
        if self.writer is None and self.pool.node_of(0) == ray.get_runtime_context().get_node_id():
            self.writer = SharedWeightWriter()

    def _get(self, ref: Any) -> Any:
        import ray
        from ray.exceptions import RayTaskError

        from corerl.distributed.remote_errors import unwrap_remote

        try:
            return ray.get(ref)
        except RayTaskError as exc:  # an error raised in the worker: its own type where it pickled back,
            cause = unwrap_remote(exc)  # with the worker's traceback chained to it
            raise cause from cause.__cause__

    def _restart(self, cause: BaseException) -> None:
        with self.handle:
            self.restarts += 1
            limit = self.settings.max_generation_failures
            if self.restarts > limit:
                times = "once" if self.restarts == 1 else f"{self.restarts} times"
                self.failure = RunError(f"the generation worker died {times}, more than "
                                        f"algorithm.async.max_generation_failures={limit} allows ({type(cause).__name__})",
                                        key="algorithm.async.max_generation_failures",
                                        hint="see the Ray log for why it died, or raise max_generation_failures")
                raise self.failure from cause
            log.warning("generation worker (pid %s) died; starting it again (%d of %d restarts)", self.pid,
                        self.restarts, limit)
            self._shutdown_actor()
            self._start()
            if self.model_path is not None:
                self._get(self.actor.load_hf.remote(self.model_path))
            if self.manifest is not None:
                self._get(self.actor.update_weights.remote(self.manifest, self.pushing))

    def _call(self, method: str, *args: Any) -> Any:
        """``method(*args)`` on the worker; a worker that died is restarted and the call repeated."""
        from ray.exceptions import RayActorError

        while True:
            actor = self.actor
            try:
                return self._get(getattr(actor, method).remote(*args))
            except RayActorError as exc:
                if self.closed:  # shut down with the run: nothing to restart
                    raise RunError("the generation worker was shut down") from exc
                with self.handle:
                    if self.failure is not None:  # another thread already gave up on it
                        raise self.failure from exc
                    if self.actor is actor:  # not yet restarted by another thread
                        self._restart(exc)

    # -- the generation engine --------------------------------------------------------------

    def load_hf(self, model_path: str) -> None:
        self.model_path = model_path
        self._call("load_hf", model_path)

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings, n: int = 1) -> list[list[Sample]]:
        """Samples stamped with versions; requests an update aborted are resumed from their tokens."""
        groups, aborted = self._call("generate", prompts, sampling, n)
        part = 0
        while aborted:
            cut = [(g, i) for g, group in enumerate(groups) for i, s in enumerate(group)
                   if s.finish_reason == "length" and len(s.completion_ids) < sampling.max_new_tokens]
            if not cut:
                break
            part += 1
            # the longest room left bounds the call; each tail is cut to its own room after
            room = max(sampling.max_new_tokens - len(groups[g][i].completion_ids) for g, i in cut)
            tails, aborted = self._call(
                "generate", [list(groups[g][i].prompt_ids + groups[g][i].completion_ids) for g, i in cut],
                attrs.evolve(sampling, max_new_tokens=room, seed=resume_seed(sampling.seed, part)), 1)
            for (g, i), (tail,) in zip(cut, tails, strict=True):
                head = groups[g][i]
                left = sampling.max_new_tokens - len(head.completion_ids)
                if len(tail.completion_ids) > left:
                    tail = attrs.evolve(tail, completion_ids=tail.completion_ids[:left], logprobs=tail.logprobs[:left],
                                        versions=(tail.versions or ())[:left], finish_reason="length")
                groups[g][i] = joined(head, attrs.evolve(tail, prompt_ids=head.prompt_ids))
        return groups

    def push(self, weights: Iterable[tuple[str, Any]], version: int) -> None:
        """Hand the worker ``version``'s weights without waiting for what it generates, nor for
        the worker to take them (see the module doc); the version counts as pushed
        (:attr:`version`, then :attr:`on_version` called) once the worker holds them, so that no
        request started after it is stamped older. ``weights``: the policy's (name, tensor)
        pairs, or with ``policy.lora`` its adapter (:class:`corerl.lora.weights.AdapterWeights`:
        only the adapter crosses, as in a synchronous LoRA refit)."""
        from corerl.lora.weights import AdapterWeights

        from .worker import AdapterRefit

        self.settle()  # the previous hand-over read its file before this one rewrites it
        payload: Any
        with self.handle:
            if isinstance(weights, AdapterWeights):  # the adapter alone: small, through Ray
                # copies: the hand-over runs on after push returns, while the next step trains in place
                tensors = {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights.tensors().items()}
                payload = self.manifest = AdapterRefit(dict(weights.config), weights.base, tensors)
            elif self.writer is not None:
                self.manifest = self.writer.write(weights)
                payload = self.manifest
            else:  # another node: the tensors themselves, through Ray
                payload = self.manifest = [(name, tensor.detach().to("cpu", copy=True)) for name, tensor in weights]
            self.pushing = version
        self.handing = self.sender.submit(self._hand_over, payload, version)

    def _hand_over(self, payload: Any, version: int) -> None:
        """On :attr:`sender`: the worker takes ``payload`` as ``version`` (restarted if it died)."""
        self._call("update_weights", payload, version)
        self._took(version)

    def _took(self, version: int) -> None:
        self.version = version
        if self.on_version is not None:
            self.on_version()

    def settle(self) -> None:
        """Wait until the worker holds the last version pushed; raises what failed the hand-over."""
        handing, self.handing = self.handing, None
        if handing is not None:
            handing.result()

    def push_version(self, version: int, seconds: float) -> None:
        """A simulated trainer's refit (``algorithm.async.simulate_training``): the worker takes
        ``version`` with its weights unchanged, generation paused ``seconds`` as ``in_flight`` says
        (a restarted worker loads the newest real weights, which these are)."""
        from .worker import SimulatedRefit

        self.settle()
        with self.handle:
            self.pushing = version
        self._call("update_weights", SimulatedRefit(seconds), version)
        self._took(version)

    def update_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """The generation contract's refit: the weights are in use when this returns."""
        self.settle()  # the version the worker holds is the newest pushed
        self.push(weights, self.version)
        self.settle()  # the update is on the worker before sync asks for it (the actor's calls are not ordered)
        self._call("sync")

    def load_adapter(self, adapter: Any) -> None:
        """The generation contract's LoRA refit (:class:`corerl.lora.weights.AdapterWeights`): the
        adapter is in use when this returns."""
        self.update_weights(adapter)

    def sleep(self) -> None:
        return None  # generation has devices of its own: nothing to give back to training

    def wake(self) -> None:
        return None

    def _shutdown_actor(self) -> None:
        import ray

        if self.actor is not None:
            try:
                ray.kill(self.actor, no_restart=True)
            except Exception as exc:  # already gone
                log.debug("ray.kill: %s", exc)
            self.actor = None
        if self.pool is not None:
            from corerl.distributed.placement import POOLS

            pool, self.pool = self.pool, None
            POOLS.release(pool)

    def shutdown(self) -> None:
        self.closed = True
        self.sender.shutdown(wait=False)  # a hand-over in flight ends with the worker
        self._shutdown_actor()
        if self.writer is not None:
            self.writer.close()
            self.writer = None
