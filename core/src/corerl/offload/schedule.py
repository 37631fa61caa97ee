"""The core's offload policies, as phase-boundary schedules over the engines' contracts.

A GRPO step runs ``before_generation`` -> generate -> ``before_training`` -> (logprobs,)
train -> ``before_refit`` -> refit -> ``after_refit``. A policy moves training state with
the training backend's ``offload(parts)`` / ``reload(parts)`` (parts: ``"parameters"``,
``"optimizer"``) and sleeps the generation engine while training runs, so that colocated
engines take turns with the accelerator memory. Every call is idempotent: a policy keeps
track of what is away.
"""

from __future__ import annotations

from typing import Any, ClassVar

PARAMETERS = "parameters"
OPTIMIZER = "optimizer"


class PhaseOffload:
    """The base schedule; subclasses say what leaves for generation and for the refit.

    ``for_generation``: training state off the accelerator while the generation engine runs.
    ``for_refit``: what leaves before the refit (the parameters stay until the weights have
    been streamed, then leave with ``after_refit``). An empty ``for_generation`` moves
    nothing and never sleeps the generation engine.
    """

    for_generation: ClassVar[frozenset[str]] = frozenset()
    for_refit: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, training: Any, generation: Any, config: Any = None) -> None:
        self.training = training
        self.generation = generation
        self.config = config
        self.away: set[str] = set()
        self.generation_asleep = False

    def _offload(self, parts: frozenset[str]) -> None:
        todo = sorted(parts - self.away)
        if todo:
            self.training.offload(todo)
            self.away.update(todo)

    def _reload(self) -> None:
        if self.away:
            self.training.reload(sorted(self.away))
            self.away.clear()

    def _wake(self) -> None:
        if self.generation_asleep:
            self.generation.wake()
            self.generation_asleep = False

    def before_generation(self) -> None:
        """Training state leaves; the generation engine is awake."""
        self._offload(self.for_generation)
        self._wake()

    def before_training(self) -> None:
        """The generation engine sleeps; training state comes back."""
        if self.for_generation and not self.generation_asleep:
            self.generation.sleep()
            self.generation_asleep = True
        self._reload()

    def before_refit(self) -> None:
        """What the refit does not need leaves; the generation engine wakes to take the weights."""
        self._offload(self.for_refit)
        self._wake()

    def after_refit(self) -> None:
        """The rest of what generation does not need leaves."""
        self._offload(self.for_generation)

    def restore(self) -> None:
        """Everything back where it started (before a checkpoint or an export)."""
        self._reload()
        self._wake()


class NoOffload(PhaseOffload):
    """``none``: everything stays on the accelerator."""


class OptimizerOffload(PhaseOffload):
    """``optimizer``: the optimizer state leaves while generating and refitting."""

    for_generation = frozenset({OPTIMIZER})
    for_refit = frozenset({OPTIMIZER})


class FullOffload(PhaseOffload):
    """``full``: parameters and optimizer state leave while generating (the parameters right
    after the refit has streamed them)."""

    for_generation = frozenset({OPTIMIZER, PARAMETERS})
    for_refit = frozenset({OPTIMIZER})
