"""GRPO's step over the rollout buffer: take a batch, train on it, push the new weights to the
generation group without waiting for it (:meth:`corerl.algorithms.grpo.GRPO.learn` does the
arithmetic, exactly as in a synchronous step).

Metrics added to each step: ``async/staleness/mean`` and ``/max`` (policy versions between the
weights trained and the oldest token of each group), ``async/staleness`` (every group's, a
histogram in TensorBoard), ``async/dropped`` (groups past ``max_staleness``, never trained),
``async/buffered`` (finished groups waiting), ``async/generation_restarts`` and
``time/wait_for_rollouts`` (how long training waited for the buffer).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from corerl.asynchronous.buffer import Key, RolloutBuffer
from corerl.asynchronous.producer import RolloutProducer
from corerl.environments.rollout import Rollout
from corerl.training.weights import counted

STATE_FILE = "async_state.json"


def merged_metrics(groups: list[Any]) -> dict[str, float]:
    """The rollout metrics of the batches a step's groups came from, averaged over those batches."""
    batches: dict[int, dict[str, float]] = {}
    for group in groups:
        batches.setdefault(group.key[0], group.metrics)
    keys = {k for metrics in batches.values() for k in metrics}
    return {k: sum(m.get(k, 0.0) for m in batches.values()) / len(batches) for k in keys}


class AsyncTrainer:
    """Drives :class:`~corerl.algorithms.grpo.GRPO` asynchronously over ``context.generation`` (a
    :class:`~corerl.asynchronous.engine.DedicatedGeneration`)."""

    def __init__(self, context: Any, settings: Any) -> None:
        self.context, self.settings = context, settings
        self.grpo: Any = None
        self.generation = context.generation
        self.buffer = RolloutBuffer(settings.sampler, settings.max_staleness)
        self.settled: set[Key] = set()
        self.first_batch = 0
        self.producer: RolloutProducer | None = None
        self.resume_point: tuple[Any, int, list[Key]] | None = None

    def begin(self, grpo: Any) -> None:
        """Train ``grpo`` from the buffer: after each step the weights are handed over without
        waiting for the generation group (generation starts with the first step, after the
        held-out evaluations that come before training)."""
        self.grpo = grpo
        grpo.hand_over = self.push

    def load(self, folder: Path) -> None:
        import json

        path = folder / STATE_FILE
        if path.exists():
            state = json.loads(path.read_text())
            self.first_batch = int(state["first_batch"])
            self.settled = {(int(b), int(i)) for b, i in state["settled"]}

    def task_state(self) -> Any:
        """The task's state before the oldest prompt batch not wholly trained on (a checkpoint's)."""
        if self.producer is None:
            self.resume_point = (self.context.task.state(), self.first_batch, sorted(self.settled))
        else:
            self.resume_point = self.producer.resume_point(self.settled)
        return self.resume_point[0]

    def save(self, folder: Path) -> None:
        """The first batch a resumed run draws and the groups of it and later batches that were
        already trained on (or dropped): they are not generated again."""
        import json

        if self.resume_point is None:
            self.task_state()
        assert self.resume_point is not None
        _, first, settled = self.resume_point
        (folder / STATE_FILE).write_text(json.dumps({"first_batch": first, "settled": settled}))
        self.resume_point = None

    def push(self) -> None:
        self.generation.push(counted(self.grpo.training.weight_stream()), self.grpo.steps_done + 1)

    def step(self) -> dict[str, float]:
        if self.producer is None:
            # the worker's weights are the policy's (a warm start's, a resumed run's) as version steps_done
            self.generation.push(counted(self.grpo.training.weight_stream()), self.grpo.steps_done)
            self.producer = RolloutProducer(self.context.rollout(), self.context.task, self.context.config,
                                            self.settings, self.buffer, lambda: self.generation.version,
                                            self.first_batch, self.settled)
            self.producer.start()
        version = self.grpo.steps_done
        start = time.perf_counter()
        groups = self.buffer.take(self.context.config.core.algorithm.batch_size, version)
        waited = time.perf_counter() - start
        dropped = self.buffer.drain_dropped()
        taken = [g.key for g in groups]
        self.producer.settle(taken + dropped)
        self.settled.update(taken + dropped)
        rollout = Rollout([g.samples for g in groups], [g.rewards for g in groups], merged_metrics(groups))
        metrics = self.grpo.learn(self.grpo.shaping.apply(rollout), {"time/wait_for_rollouts": waited})
        staleness = [version - g.min_version for g in groups]
        metrics.update({
            "async/staleness/mean": sum(staleness) / len(staleness), "async/staleness/max": float(max(staleness)),
            "async/dropped": float(len(dropped)), "async/buffered": float(self.buffer.waiting()),
            "async/generation_restarts": float(self.generation.restarts),
        })
        metrics["async/staleness"] = [float(s) for s in staleness]  # type: ignore[assignment]
        return metrics

    def stop(self) -> None:
        """Stop generating and let the worker take the newest weights (for the held-out evaluation)."""
        if self.producer is None:
            return
        self.producer.stop()
        self.producer = None
        self.generation.update_weights(counted(self.grpo.training.weight_stream()))
