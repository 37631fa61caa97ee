"""What a run records beside its steps for evaluation and for ranking its checkpoints: the
held-out evaluations of ``eval.every_n_steps`` (:mod:`corerl.evaluation`; rows of the ``eval``
phase in metrics.jsonl), each metric's newest logged value, and the value a checkpoint records
for ``checkpointing.metric_name`` (:class:`corerl.run.checkpoints.KeepPolicy` prunes by it)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from corerl.progress_markers import mark
from corerl.run.checkpoints import KeepPolicy, best_checkpoint


class RunEvaluation:
    """The evaluations and metric values of one run over its ``context`` and metrics ``log``;
    ``global_step()`` is the run's step counting every phase (the loggers' step)."""

    def __init__(self, context: Any, log: Any, global_step: Callable[[], int]) -> None:
        from corerl.reporting.metrics_log import latest_values, read_metrics

        core = context.config.core
        self.context, self.log, self.global_step = context, log, global_step
        self.every, self.at_start = core.eval.every_n_steps or 0, core.eval.at_start
        self.keep = KeepPolicy.from_config(core.checkpointing)
        self.step: int | None = context.state.get("eval_step")  # the algorithm's step last evaluated
        # each metric's newest value (a resumed run's from the rows it kept)
        self.latest: dict[str, float] = latest_values(read_metrics(log.path)) if context.resume else {}
        self.warned = False

    def write(self, row: dict[str, Any]) -> None:
        """One row of metrics to metrics.jsonl and the loggers, at the run's global step."""
        from corerl.reporting.metrics_log import latest_values

        self.log.write(row, tb_step=self.global_step())
        self.latest.update(latest_values([row]))

    def before_first_step(self, algorithm: Any) -> None:
        """With ``eval.at_start``, the evaluation at step 0 (once: not again on a resume)."""
        if self.every and self.at_start and algorithm.done == 0 and self.step != 0:
            self.evaluate(algorithm)

    def after_step(self, algorithm: Any) -> None:
        """The evaluation after every ``eval.every_n_steps``-th step of the algorithm and its last."""
        if self.every and (algorithm.done % self.every == 0 or algorithm.done == algorithm.total):
            self.evaluate(algorithm)

    def evaluate(self, algorithm: Any) -> None:
        """Evaluate the current weights on the held-out prompts and log the figures as a row of
        the ``eval`` phase at the algorithm's step."""
        from corerl.evaluation.figures import EVAL_PHASE, EvalPlan, describe, evaluate_policy

        context, step = self.context, algorithm.done
        plan = EvalPlan.from_config(context.config)
        where = f"{algorithm.name.upper()} step {step}"
        context.console.print(f"evaluating at {where}: greedy and {plan.num_samples} sampled answers a held-out "
                              "prompt", highlight=False)
        context.offload.restore()
        context.refit()  # the generation engine takes the current weights (SFT steps do not refit)
        context.offload.before_generation()
        result = evaluate_policy(context.rollout(), context.task, plan)
        self.write({"phase": EVAL_PHASE, "step": step, **result.figures, "seconds": result.seconds})
        mark(f"{EVAL_PHASE}:step:{step}")
        self.step = step
        context.console.print(f"eval at {where} ({result.prompts} prompts, {result.seconds:.1f} s): "
                              f"{describe(result.figures)}", highlight=False)

    def checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint's state records: the step last evaluated, and with
        ``checkpointing.metric_name`` the metric's newest value (None before it has one: that
        checkpoint ranks last, said once)."""
        state: dict[str, Any] = {"eval_step": self.step}
        name = self.keep.metric_name
        if name is None:
            return state
        value = self.latest.get(name)
        if value is None and not self.warned:
            self.warned = True
            self.context.console.print(f"[yellow]warning:[/] checkpointing.metric_name: {name} has no value yet at "
                                       f"step {self.global_step()}; checkpoints saved before it has one rank last",
                                       highlight=False)
        return {**state, "metric": {"name": name, "value": value}}

    def best(self, run_dir: Path) -> dict[str, Any]:
        """summary.json's ``best_checkpoint`` (by ``checkpointing.metric_name``; nothing without one),
        said on the terminal too."""
        best = best_checkpoint(run_dir, self.keep)
        if best is None:
            return {}
        self.context.console.print(f"best checkpoint by {self.keep.metric_name}: {best[0]} ({best[1]:.3f})",
                                   highlight=False)
        return {"best_checkpoint": {"path": str(best[0]), "metric": self.keep.metric_name, "value": best[1]}}
