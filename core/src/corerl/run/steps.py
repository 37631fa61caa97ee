"""What the run loop (:mod:`corerl.run.loop`) does around each step of a phase and at each
checkpoint, as functions the conformance helpers (:mod:`corerl.testing.algorithm_conformance`)
call too, so that a plugin's tests drive the very code a run does.

The run loop alone counts steps: :func:`take_step` calls the phase's ``step()``, refuses a step
that changed the phase's ``done`` or returned a metric the loop writes itself, and only then
adds 1 to ``done``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from corerl.algorithms.contract import check_step_counter, check_step_metrics
from corerl.errors import RunError
from corerl.run.checkpoints import save_checkpoint
from corerl.training.weights import REFITS


def check_finite(phase: str, step: int, metrics: dict[str, Any]) -> None:
    """Stop the run at a step whose loss or gradient norm (the policy's or the critic's) is NaN or infinite."""
    watched = ("loss", "grad_norm", "critic/value_loss", "critic/grad_norm")
    bad = {k: metrics[k] for k in watched if k in metrics and not math.isfinite(metrics[k])}
    if bad:
        shown = ", ".join(f"{k} {v}" for k, v in bad.items())
        raise RunError(f"{phase} step {step}: {shown}; the run stopped there, before logging or saving that step",
                       key="policy.optimizer.lr", hint="lower the learning rate; the last checkpoint, if any, is intact")


def take_step(phase: Any, registration: Any = None) -> dict[str, Any]:
    """One step of ``phase`` (an :class:`~corerl.algorithms.contract.AlgorithmRun`), counted by
    the run loop: its metrics, once ``phase.done`` is one more than before. A step that changed
    ``done`` itself, or returned a metric the loop writes, stops the run in one line naming the
    algorithm (``registration``, when given, adds its plugin); a :class:`RunError` it raises is
    told which step met it; a NaN loss stops the run before anything is logged. A step that sent
weights to the generation engine gets ``refit/updates`` (in the step), ``refit/tensors`` and
``refit/bytes`` (of its last update; :data:`corerl.training.weights.REFITS`)."""
    before, updates = phase.done, REFITS.updates
    try:
        metrics = phase.step()
    except RunError as exc:  # a reward, a divergence: say which step met it
        exc.message += f" (at {phase.name} step {before + 1})"
        raise
    check_step_counter(phase, before, registration)
    check_step_metrics(phase, metrics, registration)
    check_finite(phase.name, before + 1, metrics)
    phase.done = before + 1
    if REFITS.updates > updates:  # the step's weight update(s) to the generation engine, seen
        metrics = {**metrics, **REFITS.metrics(), "refit/updates": float(REFITS.updates - updates)}
    return metrics


def start_algorithm(context: Any, registration: Any) -> Any:
    """The algorithm's run object over the context's started engines, with a resumed run's state
    (what its ``save`` wrote into the checkpoint) read back by its ``load``."""
    algorithm = registration.load()(context)
    if context.resume is not None:
        algorithm.load(context.resume[1])
    return algorithm


def task_state(algorithm: Any, task: Any) -> Any:
    """Where a resumed run draws its next prompts: the algorithm's word (``task_state()``, contract
    2.3), else the task's own state (an algorithm written to 2.2 or earlier)."""
    return algorithm.task_state() if hasattr(algorithm, "task_state") else task.state()


def save_run_checkpoint(context: Any, phases: list[Any], algorithm: Any, state: dict[str, Any] | None = None,
                        keep: Any = 1) -> Path:
    """A checkpoint of the run at its global step (the steps of every phase): the policy's
    training state, what the algorithm saves, and ``state.json`` with each phase's steps, the
    task's position and ``state`` (the run loop's own: metrics lines, held-out figures). A run
    opened on the run directory resumes from it (:meth:`corerl.run.context.RunContext.open`)."""
    context.offload.restore()
    snapshot = {"steps_done": {p.name: p.done for p in phases}, "task": task_state(algorithm, context.task),
                **(state or {})}

    def save(folder: Path) -> None:
        context.training.save_checkpoint(str(folder / "training"))
        algorithm.save(folder)

    return save_checkpoint(context.run_dir, sum(p.done for p in phases), save, snapshot, keep)
