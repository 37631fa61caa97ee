"""What a registered algorithm provides to the run loop (:mod:`corerl.runner`).

An :class:`corerl.registry.Algorithm` registration's factory is called with the run's
:class:`corerl.run_context.RunContext` (the config, the task, the started training and
generation engines, the offload policy, the run directory and what a resumed run had done) and
returns an :class:`AlgorithmRun`. The run loop knows algorithms only through this contract:

1. ``held_out()`` before training (and after an SFT warm start), then ``begin()`` once;
2. ``step()`` until ``algorithm.max_steps`` steps are done, each returning the step's metrics;
3. ``save(folder)`` / ``load(folder)`` with every checkpoint, for state it owns beyond the
   policy's (the policy's weights and optimizer are the run loop's);
4. ``held_out()`` at the end, then ``export(run_dir)`` for final outputs beyond ``final/``.

Optional (contract 2.3): ``task_state()``, the task's position a checkpoint records (called
just before ``save``; without it, the task's own ``state()``). An algorithm that draws prompts
ahead of what it trained (asynchronous GRPO) gives the position before the prompts it has not
trained on yet, so that a resumed run generates them again and trains nothing twice.

The rollout (sampling, scoring) lives inside ``step()``: an algorithm that owns a multi-turn
rollout, or one that does not wait for generation, changes its own step, not the loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from corerl.run_context import RunContext

#: the algorithm a recipe's ``sft`` section runs as a warm start before the algorithm it names
WARM_START = "sft"


@runtime_checkable
class AlgorithmRun(Protocol):
    """One algorithm over one run's engines (what an :class:`~corerl.registry.Algorithm`
    registration's factory returns).

    ``name`` is the phase name in metrics.jsonl, the progress bar and checkpoints (the
    registration's id); ``total`` the steps it runs; ``done`` the steps already done (a resumed
    run starts there); ``measure`` the first key of what :meth:`held_out` returns, the figure
    the run reports before and after training (``reward``, ``preference_accuracy``).
    """

    name: str
    total: int
    done: int
    measure: str

    def begin(self) -> None:
        """Build what the steps need beyond the policy and generation engines (a frozen
        reference, a critic); called once, after any warm start, before the first step."""

    def step(self) -> dict[str, float]:
        """One step (its rollout included): the step's metrics, ``loss`` among them."""

    def held_out(self) -> dict[str, float]:
        """Held-out figures of the current weights, :attr:`measure` first."""

    def save(self, folder: Path) -> None:
        """Write the state this algorithm owns beyond the policy into a checkpoint ``folder``."""

    def load(self, folder: Path) -> None:
        """Read back what :meth:`save` wrote (a resumed run, before :meth:`begin`)."""

    def export(self, run_dir: Path) -> list[str]:
        """Write final outputs beyond the policy's ``final/`` (a critic's); each as the run's
        last line names it (its path, and what it is)."""


class AlgorithmBase:
    """Defaults for an :class:`AlgorithmRun`: held-out reward of greedy answers, no state of its
    own, nothing to export. Subclasses set :attr:`name` and implement :meth:`step`."""

    name = "algorithm"
    measure = "reward"

    def __init__(self, context: RunContext) -> None:
        self.context = context
        self.total = context.config.core.algorithm.max_steps
        self.done = context.steps_done(self.name)

    def begin(self) -> None:
        return None

    def step(self) -> dict[str, float]:
        raise NotImplementedError

    def held_out(self) -> dict[str, float]:
        return {"reward": self.context.held_out_reward()}

    def save(self, folder: Path) -> None:
        return None

    def load(self, folder: Path) -> None:
        return None

    def task_state(self) -> Any:
        return self.context.task.state()

    def export(self, run_dir: Path) -> list[str]:
        return []
