"""The run loop: an optional SFT warm start, then the algorithm ``algorithm.name`` names (a
registered :class:`corerl.registry.Algorithm`, known here only through
:class:`corerl.algorithms.contract.AlgorithmRun`), with a progress bar per phase, held-out
figures before and after (and every ``eval.every_n_steps``: :mod:`corerl.evaluation.during_run`),
checkpoints, and a run directory holding metrics.jsonl, the loggers'
files (TensorBoard's by default), run.log, curves.png, summary.json and the final checkpoint.

``corerl run`` on a run directory that holds a complete checkpoint resumes from it; one that
holds none starts over there (``run.resume=must`` refuses instead). With ``run.max_restarts``, a
worker that dies or hangs is recovered in the run itself the same way (:mod:`corerl.run.recovery`). Folders the run trusts later
are written as complete folders (:mod:`corerl.complete_folders`). Ctrl-C finishes the current
step, saves a checkpoint and exits with status 130 (``checkpointing.save_by`` spent: the same, status
0). A NaN loss or gradient stops the run."""

from __future__ import annotations

import json
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import attrs

from corerl.complete_folders import write_complete, write_file_whole
from corerl.config import Config
from corerl.config.selection import Selection
from corerl.failures import checkpoint_failure, disk_error
from corerl.plugin_manager import PluginHost
from corerl.progress_markers import mark
from corerl.reporting.console import bar_text, progress_bars, report_held_out
from corerl.run.checkpoints import TimeBudget
from corerl.run.directory import (
    check_writable as check_writable,  # re-exported: where it used to live
)
from corerl.run.steps import save_run_checkpoint, start_algorithm, take_step
from corerl.training.final_export import export_final, final_kind

EXIT_INTERRUPTED = 130


@attrs.define
class RunResult:
    """What a run produced: its directory, its summary, and whether Ctrl-C stopped it early."""

    run_dir: Path
    summary: dict[str, Any]
    interrupted: bool = False


def execute(config: Config, selection: Selection, host: PluginHost, console: Any = None,
            quiet: bool | None = None) -> RunResult:
    """Run ``config`` with the selected components (see the module docstring). ``quiet``: other
    libraries' output goes to the run's log file (True), or to the terminal and that file (False);
    None (the Python API, tests): nothing is redirected."""
    from transformers.utils import logging as hf_logging

    from corerl.distributed.placement import POOLS
    from corerl.distributed.worker_group import set_call_timeout
    from corerl.reporting.console import make_console
    from corerl.reporting.quiet import LOG_NAME, QuietTerminal
    from corerl.run.checkpoints import latest_checkpoint
    from corerl.run.context import RunContext
    from corerl.run.recovery import Recovery, describe

    hf_logging.disable_progress_bar()  # the run's own bars say what is happening
    mark("run:start")
    # the engines' modules first: a backend that cannot be imported fails the run before its
    # directory is made
    for choice in selection.engines():
        if choice.registration is not None:
            choice.registration.load()
    quieting = ExitStack()  # from the run directory's first line to the engines' shutdown

    def quiet_from(run_dir: Path) -> None:
        if quiet is not None:
            quieting.enter_context(QuietTerminal(run_dir / LOG_NAME, verbose=not quiet))

    set_call_timeout(config.core.run.collective_timeout_s)
    recovery = Recovery(config.core.run.max_restarts)
    console = console or make_console()
    with quieting:
        while True:  # once, and once more after each recovery
            context, run, finished = None, None, False
            try:
                context = RunContext.open(config, selection, console, host,
                                          on_run_dir=quiet_from if recovery.restarts == 0 else None)
                run = Run(context, recovery)
                result = run.run()
                finished = True
                return result
            except BaseException as exc:  # BaseException: torch's CheckpointException is one
                run_dir = context.run_dir if context is not None else Path(config.core.run.output_dir) / (config.core.run.name or "")
                refused = disk_error(exc, run_dir) or checkpoint_failure(exc, "saving or loading", run_dir / "checkpoints")
                if refused is not None:
                    raise refused from None
                if context is None or run is None:
                    raise
                checkpoint = latest_checkpoint(run_dir)
                step = run.global_step() or (context.resume[0] if context.resume else 0)  # failed while starting: the resumed step
                fault = recovery.recover_from(exc, step, checkpoint[1] if checkpoint else None)
                if fault is None:
                    raise
                console.print(f"[yellow]{describe(fault, recovery.restarts, recovery.max_restarts)}[/]", highlight=False)
                config = same_run_again(config, run_dir)
                POOLS.wait_s = config.core.run.restart_wait_s  # a node gone: wait for the layout to fit again
            finally:
                if context is not None:
                    context.close(run_failed=not finished)


def same_run_again(config: Config, run_dir: Path) -> Config:
    """``config`` pointed at ``run_dir`` (a run named by its start time keeps its folder), resuming
    from its last complete checkpoint if it has one and starting over there if not."""
    run = attrs.evolve(config.core.run, output_dir=str(run_dir.parent), name=run_dir.name, resume="auto")
    return attrs.evolve(config, core=attrs.evolve(config.core, run=run))


class Run:
    """The phases of one run over a :class:`~corerl.run.context.RunContext`: the warm start (when
    ``sft.enabled`` and the algorithm takes one) and the algorithm, each to its step count."""

    def __init__(self, context: Any, recovery: Any = None) -> None:
        from corerl.algorithms.contract import WARM_START

        self.context = context
        self.recovery = recovery  # the run's corerl.run.recovery.Recovery: a recovery under way is logged once started
        selection, core = context.selection, context.config.core
        self.registration = selection.algorithm.registration
        assert self.registration is not None
        self.warm_registration = None
        if self.registration.warm_start and core.sft.enabled:
            self.warm_registration = context.host.algorithms.get(WARM_START)
            assert self.warm_registration is not None, "the core registers the warm-start algorithm"
            context.model.start_from_warm_start()  # what the algorithm starts from (it begins after the warm start)
        self.warm_start: Any = None
        self.evals: dict[str, float] = dict(context.state.get("evals", {}))
        self.log: Any = None
        self.evaluation: Any = None  # the evaluations during training and the metrics that rank checkpoints
        self.algorithm: Any = None
        self.budget = TimeBudget(core.checkpointing.save_by)  # once past it, save and stop

    @property
    def phases(self) -> list[Any]:
        return [p for p in (self.warm_start, self.algorithm) if p is not None]

    def global_step(self) -> int:
        return sum(p.done for p in self.phases)

    def run(self) -> RunResult:
        from corerl import start_up
        from corerl.evaluation.during_run import RunEvaluation
        from corerl.reporting.loggers.start import start_loggers
        from corerl.reporting.metrics_log import MetricsLog
        from corerl.run.interrupt import stop_on_sigint

        context = self.context
        # the loggers first: one that cannot start stops the run before the engines take minutes to start
        loggers = start_loggers(context.config, context.host, context.run_dir, resumed=context.resume is not None,
                                warn=lambda line: context.console.print(f"[yellow]{line}[/]", highlight=False))
        self.log = MetricsLog(context.run_dir, keep_lines=context.state.get("metrics_lines") if context.resume else None,
                              loggers=loggers)
        self.evaluation = RunEvaluation(context, self.log, self.global_step)
        try:
            context.start_engines()  # the phases are built over the started engines
            if self.warm_registration is not None:
                self.warm_start = self.warm_registration.load()(context, warm_start=True)
            self.algorithm = start_algorithm(context, self.registration)
            if self.recovery is not None and self.recovery.pending:
                for row in self.recovery.recovered(self.global_step(), started_over=context.resume is None):
                    self.log.write(row, row["step"])
                    mark(f"recovery:{row['restart']}")
            if "before" not in self.evals:
                self.evals["before"] = self.algorithm.held_out()[self.algorithm.measure]
                context.console.print(f"held-out {self.label} before training: {self.evals['before']:.3f}")
            start_up.end()  # started: the default garbage collections from the first step on
            with stop_on_sigint(lambda text: context.console.print(f"[yellow]{text}[/]")) as stop:
                if self.warm_start is not None and self.warm_start.total:
                    self.run_phase(self.warm_start, stop)
                    if not stop.requested and "after_sft" not in self.evals:
                        self.end_warm_start()
                if not stop.requested and not self.budget.spent:
                    self.algorithm.begin()
                    if self.warm_start is not None and "after_sft" not in self.evals:
                        self.evals["after_sft"] = self.algorithm.held_out()[self.algorithm.measure]
                        context.console.print(f"held-out {self.label} after SFT: {self.evals['after_sft']:.3f}")
                    self.evaluation.before_first_step(self.algorithm)
                    self.run_phase(self.algorithm, stop)
            return self.stop_interrupted(deadline=not stop.requested) if stop.requested or self.budget.spent else self.finish()
        finally:
            self.log.close()  # the loggers end their runs however this one stopped (a second close does nothing)

    @property
    def label(self) -> str:
        return self.algorithm.measure.replace("_", " ")

    def end_warm_start(self) -> None:
        """The algorithm starts from the warm start's weights with a fresh optimizer and schedule:
        Adam's moments from SFT's large gradients would shrink its first hundreds of steps."""
        context = self.context
        context.offload.restore()
        write_complete(context.run_dir / "sft_model", lambda work: context.training.export_hf(str(work)))
        context.training.load_hf(str(context.run_dir / "sft_model"))
        context.refit()

    def run_phase(self, phase: Any, stop: Any) -> None:
        """Steps of ``phase`` until it is done or Ctrl-C asks to stop, logging and checkpointing;
        the loop alone counts them (:func:`corerl.run.steps.take_step`)."""
        checkpointing = self.context.config.core.checkpointing
        registration = self.registration if phase is self.algorithm else self.warm_registration
        with progress_bars(self.context.console) as progress:
            bar = progress.add_task(phase.name.upper(), total=phase.total, completed=phase.done, shown="")
            while phase.done < phase.total and not stop.requested and not self.budget.check():
                begin = time.perf_counter()
                metrics = take_step(phase, registration)
                metrics = {"phase": phase.name, "step": phase.done, **metrics, "time/step": time.perf_counter() - begin}
                self.evaluation.write(metrics)
                progress.update(bar, advance=1, shown=bar_text(metrics))
                mark(f"{phase.name}:step:{phase.done}")
                if phase is self.algorithm:
                    self.evaluation.after_step(phase)
                if checkpointing.enabled and (phase.done % checkpointing.save_period == 0 or phase.done == phase.total):
                    self.checkpoint()

    def checkpoint(self) -> None:
        state = {"metrics_lines": self.log.lines, "evals": self.evals, **self.evaluation.checkpoint_state()}
        save_run_checkpoint(self.context, self.phases, self.algorithm, state, self.evaluation.keep)

    def stop_interrupted(self, deadline: bool = False) -> RunResult:
        """Ctrl-C (exit 130) or checkpointing.save_by spent (exit 0): a checkpoint and the curves so far."""
        from corerl.reporting.metrics_log import read_metrics
        from corerl.reporting.plot import plot_curves

        run_dir = self.context.run_dir
        self.checkpoint()
        self.log.close()
        why = f"checkpointing.save_by ({self.context.config.core.checkpointing.save_by}) ran out: " if deadline else ""
        plot_curves(read_metrics(self.log.path), run_dir / "curves.png",
                    f"{run_dir.name} ({'stopped at save_by' if deadline else 'interrupted'})", self.context.host.algorithms)
        self.context.console.print(f"{why}saved a checkpoint at step {self.global_step()}; "
                                   f"run the same command with run.name={run_dir.name} to resume")
        return RunResult(run_dir, {"interrupted_at": {p.name: p.done for p in self.phases}}, interrupted=not deadline)

    def finish(self) -> RunResult:
        from corerl.reporting.metrics_log import read_metrics
        from corerl.reporting.plot import plot_curves

        context, run_dir, measure = self.context, self.context.run_dir, self.algorithm.measure
        figures = self.algorithm.held_out()
        self.evals["after"] = figures[measure]
        for name, value in figures.items():
            self.log.scalar(f"eval/held_out_{name}", value, self.global_step())
        self.log.close()
        context.offload.restore()
        write_complete(run_dir / "final", lambda work: export_final(context.training, context.config, work))
        extra = self.algorithm.export(run_dir)
        plot_curves(read_metrics(self.log.path), run_dir / "curves.png", run_dir.name, context.host.algorithms)
        summary = {**self.summary(figures), **self.evaluation.best(run_dir)}
        write_file_whole(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
        mark("run:end")  # summary.json's presence says the run finished: all or nothing
        report_held_out(context.console, self.evals, self.label)
        tensorboard = f"{run_dir / 'tensorboard'}, " if (run_dir / "tensorboard").is_dir() else ""
        extras = "".join(f", {path}" for path in extra)
        context.console.print(f"wrote {run_dir / 'metrics.jsonl'}, {tensorboard}{run_dir / 'curves.png'}, "
                              f"{run_dir / 'final'} ({final_kind(context.training, context.config)}){extras}")
        return RunResult(run_dir, summary)

    def summary(self, figures: dict[str, float]) -> dict[str, Any]:
        """summary.json: held-out figures, steps per algorithm, and what was selected."""
        selection, measure = self.context.selection, self.algorithm.measure
        steps = {f"{registration.id}_steps": 0 for registration in self.context.host.algorithms}
        steps.update({f"{p.name}_steps": p.total for p in self.phases})
        sampled = self.registration.generation
        summary = {
            f"held_out_{measure}_before": self.evals["before"],
            f"held_out_{measure}_after_sft": self.evals.get("after_sft"),
            f"held_out_{measure}_after": self.evals["after"], **steps,
            "steps": sum(p.total for p in self.phases),
            "algorithm": self.registration.id,
            "task": selection.task.id, "reward": selection.reward.id if sampled else None,
            "environment": selection.environment.id,
            "training_backend": selection.training_backend.id,
            "generation_backend": selection.generation_backend.id if sampled else None,
            "critic_backend": selection.critic_backend.id if selection.critic_backend is not None else None,
        }
        summary.update({f"held_out_{k}_after": v for k, v in figures.items() if k != measure})
        return summary


def run_recipe(config: Config, selection: Selection, host: PluginHost, verbose: bool = False) -> int:
    """``corerl run``: run ``config``; returns the exit status (130 when Ctrl-C stopped it). Other
    libraries' output goes to the run's log file, and with ``verbose`` to the terminal too."""
    return EXIT_INTERRUPTED if execute(config, selection, host, quiet=not verbose).interrupted else 0
