"""GRPO's step over the rollout buffer: take a batch, train on it, push the new weights to the
generation group without waiting for it (:meth:`corerl.algorithms.grpo.GRPO.learn` does the
arithmetic, exactly as in a synchronous step).

Metrics added to each step: ``async/staleness/mean`` and ``/max`` (policy versions between the
weights trained and the oldest token of each group), ``async/staleness`` (every group's, a
histogram in TensorBoard), ``async/dropped`` (groups past ``max_staleness``, never trained),
``async/buffered`` (finished groups waiting), ``async/generation_restarts`` and
``time/wait_for_rollouts`` (how long training waited for the buffer) and
``time/generation_driver_cpu`` (the CPU seconds this process used while the batch trained was
generated, every thread's: the rollout's own work here, tokenising, decoding, the environment
pool, with training's beside it unless ``max_staleness`` is 0, where training waits meanwhile).

With ``policy.lora`` each hand-over carries the adapter alone (the worker's backend takes it by
``load_adapter``, as a synchronous LoRA refit does).

With ``algorithm.async.simulate_training`` the trainer is simulated (a benchmark of the generation
side): a step takes its batch from the buffer as usual, then sleeps ``simulate_training_seconds``
instead of training and hands over the next version without weights (the worker pauses
``simulate_refit_seconds`` as ``in_flight`` says). The policy's weights never change; the step's
metrics say ``simulated: 1`` and carry the rollout's figures, the staleness bookkeeping and the
timings, but no loss, gradient norm or learning rate.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from corerl.asynchronous.buffer import Key, RolloutBuffer
from corerl.asynchronous.producer import RolloutProducer
from corerl.environments.rollout import Rollout
from corerl.training.weights import refit_weights, send_weights

log = logging.getLogger(__name__)

STATE_FILE = "async_state.json"


def merged_metrics(groups: list[Any]) -> dict[str, float]:
    """The rollout metrics of the batches a step's groups came from, averaged over those batches."""
    batches: dict[int, dict[str, float]] = {}
    for group in groups:
        batches.setdefault(group.key[0], group.metrics)
    keys = {k for metrics in batches.values() for k in metrics}
    return {k: sum(m.get(k, 0.0) for m in batches.values()) / len(batches) for k in keys}


def model_tokens(sample: Any) -> int:
    """The tokens the model generated in ``sample`` (an episode's turns, a step-wise one's rows)."""
    steps = getattr(sample, "steps", ())
    if steps:
        return sum(model_tokens(s) for s in steps)
    mask = sample.completion_mask
    return int(sum(mask)) if mask is not None else len(sample.completion_ids)


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
        if settings.simulate_training:
            said = (f"SIMULATED TRAINING (algorithm.async.simulate_training): each step sleeps "
                    f"{settings.simulate_training_seconds:g} s instead of training and the policy's weights never "
                    f"change; each refit pauses generation {settings.simulate_refit_seconds:g} s and sends no weights")
            console = getattr(context, "console", None)
            if console is not None:  # the console shows warnings too: said once, in red
                console.print(f"[bold red]{said}[/]")
            else:
                log.warning(said)

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
        """The new weights to the worker; the step goes on while it takes them (the batch they let
        start starts once it holds them: ``on_version`` wakes the producer)."""
        self.generation.push(refit_weights(self.grpo.training), self.grpo.steps_done + 1)

    def step(self) -> dict[str, float]:
        if self.producer is None:
            # the worker's weights are the policy's (a warm start's, a resumed run's) as version steps_done
            self.generation.push(refit_weights(self.grpo.training), self.grpo.steps_done)
            self.generation.settle()  # the producer counts its versions from this one
            self.producer = RolloutProducer(self.context.rollout(), self.context.task, self.context.config,
                                            self.settings, self.buffer, lambda: self.generation.version,
                                            self.first_batch, self.settled)
            # a version the worker takes starts the batch it lets start at once, not at the producer's next poll
            self.generation.on_version = self.producer.wake
            self.producer.start()
        version = self.grpo.steps_done
        start = time.perf_counter()
        groups = self.buffer.take(self.context.config.core.algorithm.batch_size, version)
        waited = time.perf_counter() - start
        dropped = self.buffer.drain_dropped()
        taken = [g.key for g in groups]
        self.producer.settle(taken + dropped)
        self.producer.wake()  # groups left the buffer (taken, or dropped as too old): a batch may start
        self.settled.update(taken + dropped)
        rollout = self.grpo.shaping.apply(Rollout([g.samples for g in groups], [g.rewards for g in groups],
                                                  merged_metrics(groups)))
        if self.settings.simulate_training:
            metrics = self.simulated(rollout, waited)
        else:
            metrics = self.grpo.learn(rollout, {"time/wait_for_rollouts": waited})
        staleness = [version - g.min_version for g in groups]
        metrics.update({
            "async/staleness/mean": sum(staleness) / len(staleness), "async/staleness/max": float(max(staleness)),
            "async/dropped": float(len(dropped)), "async/buffered": float(self.buffer.waiting()),
            "async/generation_restarts": float(self.generation.restarts),
        })
        metrics["async/staleness"] = [float(s) for s in staleness]  # type: ignore[assignment]
        return metrics

    def simulated(self, rollout: Rollout, waited: float) -> dict[str, float]:
        """A simulated step over the batch taken: sleep instead of training, then hand over the
        next version without weights; the rollout's figures and the timings, ``simulated: 1``."""
        settings = self.settings
        start = time.perf_counter()
        time.sleep(settings.simulate_training_seconds)
        trained = time.perf_counter() - start
        start = time.perf_counter()
        self.generation.push_version(self.grpo.steps_done + 1, settings.simulate_refit_seconds)
        refit = time.perf_counter() - start
        self.grpo.steps_done += 1
        rewards = [r for group in rollout.rewards for r in group]
        generated = sum(model_tokens(s) for group in rollout.groups for s in group)
        return {"simulated": 1.0, "reward/mean": sum(rewards) / len(rewards), "reward/max": max(rewards),
                "generated_tokens": float(generated), **rollout.metrics, "time/wait_for_rollouts": waited,
                "time/training": trained, "time/refit": refit}

    def stop(self) -> None:
        """Stop generating and let the worker take the newest weights (for the held-out evaluation)."""
        if self.producer is None:
            return
        self.producer.stop()
        self.producer = None
        self.generation.on_version = None
        send_weights(self.grpo.training, self.generation)
