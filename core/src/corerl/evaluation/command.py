"""``corerl eval RECIPE CHECKPOINT [KEY=VALUE ...] [--json] [--output FILE]``: evaluate one
checkpoint on the recipe's held-out prompts and print the figures (:mod:`corerl.evaluation`).

CHECKPOINT is a Hugging Face folder (a run's ``final/``, ``sft_model/``, ``final/merged``), which
the generation engine loads as it is, or a resumable checkpoint (a run's
``checkpoints/step_NNNNNN``), whose policy the training engine loads over the model the run
started from before it is sent to the generation engine. Nothing is written in the run
directory. Registered by the core's own plugin (``corerl_register_commands``).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

_STEP_FOLDER = re.compile(r"^step_(\d+)$")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", metavar="RECIPE", help="the recipe the checkpoint was trained with (its task, "
                                                          "reward, generation settings and eval section)")
    parser.add_argument("checkpoint", metavar="CHECKPOINT", help="a run's final/ (any Hugging Face folder) or one "
                                                                 "of its checkpoints/step_NNNNNN")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="dotted-key overrides, as for `corerl run` (e.g. eval.num_samples=8 eval.max_prompts=50)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    parser.add_argument("--output", metavar="FILE", help="also write the figures as JSON to FILE")


def checkpoint_kind(text: str) -> tuple[str, Path]:
    """``("hf", folder)`` for a Hugging Face folder, ``("checkpoint", folder)`` for a complete
    ``checkpoints/step_NNNNNN``; anything else is a one-line usage error saying what to give."""
    from corerl.complete_folders import is_complete
    from corerl.errors import UsageError

    folder = Path(text)
    what = "give a run's final/ folder or one of its checkpoints/step_NNNNNN"
    if not folder.exists():
        hint = ("CHECKPOINT comes before the KEY=VALUE overrides" if "=" in text else what)
        raise UsageError(f"checkpoint {text} does not exist", hint=hint)
    if not folder.is_dir():
        raise UsageError(f"checkpoint {text} is a file, not a folder", hint=what)
    if (folder / "config.json").is_file():
        return "hf", folder
    if (folder / "adapter_config.json").is_file():
        raise UsageError(f"{text} is a LoRA adapter, which the generation engine does not load alone",
                         hint="evaluate final/merged (written with checkpointing.merge_lora_on_export=true) or one "
                              "of the run's checkpoints/step_NNNNNN")
    if _STEP_FOLDER.match(folder.name):
        if not is_complete(folder) or not (folder / "training").is_dir():
            raise UsageError(f"checkpoint {text} is not complete (a save that did not finish)",
                             hint="evaluate another of the run's checkpoints")
        return "checkpoint", folder
    if (folder / "final").is_dir() or (folder / "checkpoints").is_dir():
        raise UsageError(f"{text} is a run directory, not a checkpoint",
                         hint=f"give {folder / 'final'} or one of {folder / 'checkpoints'}/step_NNNNNN")
    raise UsageError(f"{text} is neither a Hugging Face folder (no config.json) nor a run's checkpoint", hint=what)


def evaluate_checkpoint(config: Any, selection: Any, host: Any, kind: str, folder: Path, console: Any) -> Any:
    """Start the engines :func:`checkpoint_kind`'s ``kind`` of ``folder`` needs (generation alone
    for a Hugging Face folder; training, then generation refitted from it, for a run's checkpoint),
    evaluate, and shut them down; returns the :class:`corerl.evaluation.Evaluation`."""
    from corerl.evaluation.figures import EvalPlan, evaluate_policy
    from corerl.run.context import RunContext

    run_dir = folder.parent.parent if kind == "checkpoint" else folder.parent
    resume = (int(_STEP_FOLDER.match(folder.name).group(1)), folder) if kind == "checkpoint" else None  # type: ignore[union-attr]
    if resume is not None:  # refused before anything reads it, if it would run code (as a resumed run's)
        from corerl.checkpoint_safety import engines_checkpoint_globals, verify_folder

        verify_folder(folder, engines_checkpoint_globals(selection))
    context = RunContext(config, selection, console, host, run_dir, resume)
    finished = False
    try:
        context.start_for_evaluation(folder)
        result = evaluate_policy(context.rollout(), context.task, EvalPlan.from_config(config))
        finished = True
        return result
    finally:
        context.close(run_failed=not finished)


def evaluate_model(config: Any, selection: Any, host: Any) -> int:
    """``corerl run`` with ``eval.only``: ``policy.model_name`` as it is, evaluated on the held-out
    prompts as :func:`run` evaluates a checkpoint, its figures printed; a built-in or packaged
    model is built or converted into a temporary folder or corerl's model cache, nothing else is
    written."""
    import tempfile

    from corerl.errors import ConfigError
    from corerl.run.directory import resolve_policy_model
    from corerl.run.inputs import check_run_inputs

    if not selection.samples:
        raise ConfigError(f"{selection.algorithm.id} samples nothing, and eval.only scores sampled answers with the "
                          "task's reward", key="eval.only", hint="evaluate with an algorithm that samples (grpo, ppo)")
    check_run_inputs(config, selection, host)
    policy = config.core.policy
    with tempfile.TemporaryDirectory(prefix="corerl-eval-") as scratch:
        folder = Path(resolve_policy_model(policy, Path(scratch)))
        return _evaluate_and_report(config, selection, host, "hf", folder, str(config.source or "the recipe"))


def run(args: argparse.Namespace) -> int:
    from corerl.config import load_config
    from corerl.config.presets import default_host
    from corerl.config.selection import select
    from corerl.errors import ConfigError

    kind, folder = checkpoint_kind(args.checkpoint)
    host = default_host()
    config = load_config(args.recipe, list(args.overrides), host)
    selection = select(config, host)
    if not selection.samples:
        raise ConfigError(f"{selection.algorithm.id} samples nothing, and corerl eval scores sampled answers with the "
                          "task's reward", key="algorithm.name",
                          hint="evaluate with a recipe of an algorithm that samples (grpo, ppo, sft)")
    return _evaluate_and_report(config, selection, host, kind, folder, str(args.recipe), args.output, args.json)


def _evaluate_and_report(config: Any, selection: Any, host: Any, kind: str, folder: Path, recipe: str,
                         output: str | None = None, as_json: bool = False) -> int:
    from transformers.utils import logging as hf_logging

    from corerl.errors import UsageError
    from corerl.evaluation.figures import EvalPlan
    from corerl.reporting.console import make_console

    hf_logging.disable_progress_bar()
    plan = EvalPlan.from_config(config)
    progress = make_console(stderr=True)
    progress.print(f"evaluating {folder} on the {selection.task.id} task's held-out prompts: greedy and "
                   f"{plan.num_samples} sampled answers a prompt at temperature {plan.sampled.temperature:g}",
                   highlight=False)
    result = evaluate_checkpoint(config, selection, host, kind, folder, progress)
    report = {"checkpoint": str(folder), "recipe": recipe, "task": selection.task.id,
              "prompts": result.prompts, "num_samples": plan.num_samples, "pass_k": plan.pass_k,
              "temperature": plan.sampled.temperature, "seconds": round(result.seconds, 3), "metrics": result.named()}
    if output:
        try:
            Path(output).write_text(json.dumps(report, indent=2) + "\n")
        except OSError as exc:
            raise UsageError(f"cannot write --output {output}: {exc.strerror or exc}",
                             hint="give a file in a folder that exists and can be written") from exc
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        render(report)
    return 0


def render(report: dict[str, Any]) -> None:
    """The figures as a table, under a line saying what was evaluated."""
    from rich.table import Table

    from corerl.reporting.console import make_console

    console = make_console()
    console.print(f"[bold]{report['checkpoint']}[/]: {report['prompts']} held-out prompts of {report['task']}, "
                  f"{report['num_samples']} samples each at temperature {report['temperature']:g} "
                  f"({report['seconds']:.1f} s)", highlight=False)
    table = Table(show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in report["metrics"].items():
        table.add_row(name, f"{value:.4f}")
    console.print(table)
