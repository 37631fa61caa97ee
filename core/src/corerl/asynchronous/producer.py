"""The generation side of an asynchronous run: threads that draw prompt batches from the task
and play them through the rollout stage (single turn, or episodes against an environment) on
the dedicated generation engine, as long as the trainer lets them run ahead.

Batch ``b`` is the batch a synchronous run would train at step ``b``: the same prompts (the
task is drawn in the same order) and the same sampling seed (:func:`corerl.generation.seeds.step_seed`).
A batch starts generating only once the worker holds the weights of the step that will train
it, less ``max_staleness`` versions (counting the groups drawn, less those the buffer dropped as
too old), so with ``max_staleness=0`` and the in-order sampler every step trains exactly what a
synchronous step would. Several batches are in flight at once when ``max_inflight_prompts`` allows
(each a rollout of its own: the episodes of one batch never wait for another batch's turns).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from corerl.asynchronous.buffer import Key, RolloutBuffer, RolloutGroup

log = logging.getLogger(__name__)

#: seconds between two looks at the version while a batch waits to start, besides :meth:`RolloutProducer.wake`
#: (which the trainer calls after each push: the batch then starts as soon as the worker holds the weights)
POLL_S = 0.1


class RolloutProducer:
    """Fills ``buffer`` from ``task`` through ``rollout``; ``version()`` is the newest pushed
    policy version. ``first_batch`` and ``skip`` resume a run: batches before it, and groups in
    ``skip`` (trained on or dropped before the checkpoint), are not generated again."""

    def __init__(self, rollout: Any, task: Any, config: Any, settings: Any, buffer: RolloutBuffer,
                 version: Callable[[], int], first_batch: int = 0, skip: set[Key] | None = None) -> None:
        self.rollout, self.task, self.config, self.settings = rollout, task, config, settings
        self.buffer, self.version = buffer, version
        self.next_batch = first_batch
        self.first_version = version()
        self.drawn = 0  # groups drawn by this producer (a resumed run's skipped ones left out)
        self.skip = set(skip or ())
        self.task_states: dict[int, Any] = {}  # batch -> the task's state before it was drawn
        self.open: dict[int, int] = {}  # batch -> its groups not yet trained on or dropped
        self.lock = threading.Condition()
        self.stopping = False
        algorithm = config.core.algorithm
        inflight = settings.max_inflight_prompts or algorithm.batch_size
        self.threads = [threading.Thread(target=self._loop, name=f"corerl-rollout-{i}", daemon=True)
                        for i in range(max(1, inflight // algorithm.batch_size))]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        """Stop drawing batches; the rollouts in progress end on their own (their groups are
        left in the buffer, never trained)."""
        with self.lock:
            self.stopping = True
            self.lock.notify_all()
        self.buffer.close()
        for thread in self.threads:
            thread.join(timeout=600)

    def wake(self) -> None:
        """A new version was pushed, or groups left the buffer: a batch waiting to start looks again
        at once (the trainer calls it; without it the wait would notice within ``POLL_S``)."""
        with self.lock:
            self.lock.notify_all()

    def _may_start(self) -> bool:
        # the step that will train the next group, counted from this producer's start
        step = (self.drawn - self.buffer.dropped_total) // self.config.core.algorithm.batch_size
        if self.version() - self.first_version < step - self.settings.max_staleness:
            return False
        limit = self.settings.max_buffered_rollouts
        return limit is None or self.buffer.waiting() < limit

    def _draw(self) -> tuple[int, list[Any], list[Any], list[Key]] | None:
        with self.lock:
            while not self.stopping and not self._may_start():
                self.lock.wait(POLL_S)
            if self.stopping:
                return None
            batch, self.next_batch = self.next_batch, self.next_batch + 1
            self.task_states[batch] = self.task.state()
            prompts, items = self.task.sample(self.config.core.algorithm.batch_size)
            keys = [(batch, i) for i in range(len(prompts)) if (batch, i) not in self.skip]
            self.drawn += len(keys)
            if keys:
                self.open[batch] = len(keys)
                self.buffer.expect(keys)
            else:
                del self.task_states[batch]
            return batch, prompts, items, keys

    def _loop(self) -> None:
        from corerl.generation.contract import SamplingSettings
        from corerl.generation.seeds import step_seed

        algorithm, policy = self.config.core.algorithm, self.config.core.policy
        try:
            while (drawn := self._draw()) is not None:
                batch, prompts, items, keys = drawn
                sampling = SamplingSettings.from_config(self.config, seed=step_seed(algorithm.seed, batch))
                start, cpu = time.perf_counter(), time.process_time()
                rollout = self.rollout.run(prompts, items, sampling, algorithm.num_generations_per_prompt,
                                           policy.max_seq_length)
                metrics = {**rollout.metrics, "time/generation": time.perf_counter() - start,
                           "time/generation_driver_cpu": time.process_time() - cpu}
                for (b, i) in keys:
                    self.buffer.put(RolloutGroup.of((b, i), rollout.groups[i], rollout.rewards[i], metrics))
        except BaseException as exc:  # the trainer raises it at its next take
            if not self.stopping:
                self.buffer.fail(exc)

    def settle(self, keys: list[Key]) -> None:
        """Groups the trainer took (or the buffer dropped): their batches close when all have."""
        with self.lock:
            for batch, _ in keys:
                self.open[batch] -= 1
                if not self.open[batch]:
                    del self.open[batch]
                    self.task_states.pop(batch, None)

    def resume_point(self, settled: set[Key]) -> tuple[Any, int, list[Key]]:
        """For a checkpoint: the task state before the oldest batch with groups still to train,
        that batch, and the groups of it and later batches already settled (not to generate again)."""
        with self.lock:
            if not self.open:
                return self.task.state(), self.next_batch, []
            oldest = min(self.open)
            return self.task_states[oldest], oldest, sorted(k for k in settled if k[0] >= oldest)
