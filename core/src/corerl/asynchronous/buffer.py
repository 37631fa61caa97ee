"""The rollout buffer between the generation group and training: finished prompt groups in,
a training step's batch out, by a sampler, never older than ``max_staleness`` policy versions.

A group's age is the weights' version when it is trained on minus the oldest version that
produced any of its model tokens (``Sample.versions``); a group past the bound is dropped (and
counted), never trained on. Pure Python: the fast tier tests it without engines.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import attrs

from corerl.generation.contract import Sample

Key = tuple[int, int]  # (prompt batch, position of the prompt in it)


def oldest_version(samples: Sequence[Sample]) -> int:
    """The oldest policy version among the model tokens of ``samples`` (0 where none is stamped)."""
    versions = [v for s in samples for v, own in zip(s.versions or (), s.completion_mask or [1] * len(s.versions or ()),
                                                     strict=False) if own]
    return min(versions, default=0)


@attrs.define
class RolloutGroup:
    """One prompt's ``n`` scored samples, from prompt batch ``key[0]``; ``metrics``: its batch's
    rollout metrics (shared by the batch's groups)."""

    key: Key
    samples: list[Sample]
    rewards: list[float]
    metrics: dict[str, float] = attrs.field(factory=dict)
    min_version: int = 0
    arrived: float = attrs.field(factory=time.monotonic)

    @classmethod
    def of(cls, key: Key, samples: list[Sample], rewards: list[float], metrics: dict[str, float]) -> RolloutGroup:
        return cls(key, samples, rewards, metrics, oldest_version(samples))


class GenerationStopped(Exception):
    """Raised by :meth:`RolloutBuffer.take` once the buffer is closed with nothing left to give."""


class RolloutBuffer:
    """Finished groups waiting for training; ``sampler`` picks a step's batch: ``in_order`` (the
    groups in the order their prompts were drawn, waiting for each), ``ready_first`` (in the
    order they finished) or ``windowed`` (the freshest first)."""

    def __init__(self, sampler: str, max_staleness: int) -> None:
        if sampler not in ("in_order", "ready_first", "windowed"):
            raise ValueError(f"unknown sampler {sampler!r}")
        self.sampler, self.max_staleness = sampler, max_staleness
        self.expected: list[Key] = []  # drawn, not yet taken or dropped (in_order's queue)
        self.ready: dict[Key, RolloutGroup] = {}
        self.dropped: list[Key] = []  # groups past the staleness bound, never trained on (drained by the trainer)
        self.dropped_total = 0
        self.error: BaseException | None = None
        self.closed = False
        self.cond = threading.Condition()

    # -- the generation side ------------------------------------------------------------------

    def expect(self, keys: Sequence[Key]) -> None:
        """Prompts were drawn and are being generated (in this order)."""
        with self.cond:
            self.expected.extend(keys)

    def put(self, group: RolloutGroup) -> None:
        with self.cond:
            self.ready[group.key] = group
            self.cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """Generation failed for good: the next :meth:`take` raises ``error``."""
        with self.cond:
            self.error = error
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def waiting(self) -> int:
        """Finished groups not yet taken."""
        with self.cond:
            return len(self.ready)

    # -- the training side --------------------------------------------------------------------

    def take(self, count: int, version: int, timeout: float | None = None) -> list[RolloutGroup]:
        """``count`` groups for a step training weights of ``version`` (blocks until there are)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while True:
                if self.error is not None:
                    raise self.error
                self._drop_stale(version)
                chosen = self._choose(count)
                if chosen is not None:
                    for group in chosen:
                        del self.ready[group.key]
                        self.expected.remove(group.key)
                    self.cond.notify_all()
                    return chosen
                if self.closed:
                    raise GenerationStopped("generation stopped before the step's batch was complete")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"no batch of {count} groups within {timeout} s")
                self.cond.wait(left)

    def _drop_stale(self, version: int) -> None:
        for key, group in list(self.ready.items()):
            if version - group.min_version > self.max_staleness:
                del self.ready[key]
                self.expected.remove(key)
                self.dropped.append(key)
                self.dropped_total += 1

    def _choose(self, count: int) -> list[RolloutGroup] | None:
        if self.sampler == "in_order":
            head = self.expected[:count]
            if len(head) < count or any(key not in self.ready for key in head):
                return None
            return [self.ready[key] for key in head]
        if len(self.ready) < count:
            return None
        groups = list(self.ready.values())
        if self.sampler == "ready_first":
            groups.sort(key=lambda g: g.arrived)
        else:  # windowed: the freshest first, then in the order the prompts were drawn
            groups.sort(key=lambda g: (-g.min_version, g.key))
        return groups[:count]

    def drain_dropped(self) -> list[Key]:
        """The groups dropped since the last call."""
        with self.cond:
            dropped, self.dropped = self.dropped, []
            return dropped
