"""Running a validated recipe: an optional SFT warm start, then GRPO (or SFT alone), over the
selected backends, with a progress bar per phase and a run directory holding metrics.jsonl,
TensorBoard event files, curves.png, summary.json and the final Hugging Face checkpoint.

``corerl run`` on a run directory that holds a complete checkpoint resumes from it; one that
holds none starts over there (``run.resume=must`` refuses instead). Folders the run trusts later
are written as complete folders (:mod:`corerl.complete_folders`). Ctrl-C finishes the current
step, saves a checkpoint and exits with status 130. A NaN loss or gradient stops the run.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from corerl.checkpoints import latest_checkpoint, read_state, save_checkpoint
from corerl.complete_folders import is_complete, recover, remove, write_complete
from corerl.config import Config
from corerl.errors import ConfigError, RegistrationError, RunError
from corerl.models.tiny import BUILTIN_MODELS, build_tiny_model
from corerl.plugin_manager import PluginHost
from corerl.progress_markers import mark
from corerl.selection import Selection

EXIT_INTERRUPTED = 130


@attrs.define
class RunResult:
    """What a run produced: its directory, its summary, and whether Ctrl-C stopped it early."""

    run_dir: Path
    summary: dict[str, Any]
    interrupted: bool = False


# what a run writes into its directory; a run that holds no complete checkpoint loses these
# when it starts over (a complete built-in base model is kept: it is rebuilt identically anyway)
RUN_OUTPUTS = ("metrics.jsonl", "tensorboard", "checkpoints", "sft_model", "final", "curves.png", "summary.json")


def make_run_dir(config: Config, console: Any = None) -> tuple[Path, tuple[int, Path] | None]:
    """``run.output_dir/run.name`` (a timestamp when unnamed) and the checkpoint to resume from.

    An existing run resumes from its last complete checkpoint. One without any starts over in
    the same directory, saying so in one line (``run.resume=must`` refuses instead); a finished
    run without checkpoints is refused rather than overwritten.
    """
    run = config.core.run
    name = run.name or time.strftime("%Y%m%d-%H%M%S")
    path = Path(run.output_dir) / name
    resume = latest_checkpoint(path)
    if resume is not None:
        return path, resume
    leftovers = [n for n in RUN_OUTPUTS if (path / n).exists()]
    if run.resume == "must":
        raise ConfigError(f"run directory {path} holds no complete checkpoint to resume from", key="run.resume",
                          hint="set run.resume=auto to start the run over in the same directory")
    if (path / "summary.json").exists():
        raise ConfigError(f"run directory {path} holds a finished run and no checkpoint to resume from", key="run.name",
                          hint="pick another run.name, or delete the directory to run it again")
    if leftovers:
        for name in leftovers:
            target = path / name
            remove(target) if target.is_dir() else target.unlink()
        if console is not None:
            console.print(f"run directory {path} holds no complete checkpoint: starting over "
                          f"(removed {', '.join(leftovers)})")
    path.mkdir(parents=True, exist_ok=True)
    return path, None


def resolve_model(model_name: str, run_dir: Path) -> str:
    """A Hugging Face checkpoint directory, building a ``builtin:`` model into the run directory."""
    if model_name in BUILTIN_MODELS:
        target = run_dir / "base_model"
        recover(target)
        if not is_complete(target):  # a resumed run keeps its base model; a half-built one is rebuilt
            write_complete(target, lambda work: build_tiny_model(work, **BUILTIN_MODELS[model_name]))
        return str(target)
    if model_name.startswith("builtin:"):
        raise ConfigError(f"unknown built-in model {model_name!r}", key="policy.model_name",
                          hint=f"built-in models: {', '.join(BUILTIN_MODELS)}")
    if not Path(model_name).exists():
        raise ConfigError(f"model path {model_name} does not exist", key="policy.model_name",
                          hint="give a local Hugging Face checkpoint folder or a builtin: model; nothing is downloaded")
    if not (Path(model_name) / "config.json").exists():
        raise ConfigError(f"{model_name} is not a Hugging Face checkpoint directory (no config.json)",
                          key="policy.model_name", hint="give a local checkpoint folder: nothing is downloaded")
    return model_name


def check_finite(phase: str, step: int, metrics: dict[str, Any]) -> None:
    """Stop the run at a step whose loss or gradient norm is NaN or infinite."""
    bad = {k: metrics[k] for k in ("loss", "grad_norm") if k in metrics and not math.isfinite(metrics[k])}
    if bad:
        shown = ", ".join(f"{k} {v}" for k, v in bad.items())
        raise RunError(f"{phase} step {step}: {shown}; the run stopped there, before logging or saving that step",
                       key="policy.optimizer.lr", hint="lower the learning rate; the last checkpoint, if any, is intact")


def evaluate(generation: Any, task: Any, max_new_tokens: int, max_seq_length: int) -> float:
    """Mean held-out reward of greedy answers (completions end at ``max_seq_length``)."""
    from corerl.generation.contract import SamplingSettings
    from corerl.tasks import mean_reward

    prompts, examples = task.held_out()
    sampling = SamplingSettings(temperature=0.0, max_new_tokens=max_new_tokens).within(max_seq_length, prompts)
    groups = generation.generate(prompts, sampling, n=1)
    return mean_reward(task, groups, examples)


@attrs.define
class Phase:
    """One phase of a run (``sft`` or ``grpo``): its length and how to run one step."""

    name: str
    total: int
    step: Callable[[], dict[str, float]]
    done: int = 0


def _progress(console: Any) -> Any:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("[bold]{task.description:<4}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[shown]}"), TimeRemainingColumn(), console=console,
    )


def _shown(metrics: dict[str, float]) -> str:
    tokens = metrics.get("generated_tokens", metrics.get("tokens", 0.0))
    text = f"reward {metrics['reward/mean']:.3f}  " if "reward/mean" in metrics else ""
    return text + f"loss {metrics['loss']:+.4f}  {tokens / metrics['time/step']:,.0f} tok/s"


def execute(config: Config, selection: Selection, host: PluginHost, console: Any = None) -> RunResult:
    """Run ``config`` with the selected components (see the module docstring)."""
    from rich.console import Console
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from corerl.algorithms.grpo import GRPO
    from corerl.algorithms.grpo_math import GRPOLoss
    from corerl.algorithms.sft import SFT
    from corerl.interrupt import stop_on_sigint
    from corerl.offload import ReferenceOffload
    from corerl.registry import TrainingBackend
    from corerl.reporting.metrics_log import MetricsLog, read_metrics
    from corerl.reporting.plot import plot_curves
    from corerl.tasks import TaskContext
    from corerl.training.contract import describe_missing

    console = console or Console()
    hf_logging.disable_progress_bar()  # the run's own bars say what is happening
    core = config.core
    algorithm = core.algorithm
    mark("run:start")
    run_dir, resume = make_run_dir(config, console)
    console.print(f"run directory: [bold]{run_dir}[/]" + (f" (resuming from step {resume[0]})" if resume else ""))
    state = read_state(resume[1]) if resume else {}
    model_path = resolve_model(core.policy.model_name, run_dir)
    tokenizer = AutoTokenizer.from_pretrained(core.policy.tokenizer_path(model_path))
    if core.policy.chat_template is not None:
        tokenizer.chat_template = core.policy.chat_template
    assert selection.task.registration is not None
    max_new = core.policy.generation.max_new_tokens
    task = selection.task.registration.create(TaskContext(tokenizer, algorithm.seed, core.data, selection.reward_fn,
                                                          max_prompt_tokens=core.policy.max_seq_length - 1))
    sft_only = algorithm.name == "sft"
    sft_steps = algorithm.max_steps if sft_only else (core.sft.max_steps if core.sft.enabled else 0)
    sft_batch = algorithm.batch_size if sft_only else core.sft.batch_size
    grpo_steps = 0 if sft_only else algorithm.max_steps
    evals: dict[str, float] = dict(state.get("evals", {}))
    done: dict[str, int] = dict(state.get("steps_done", {}))

    started: list[Any] = []

    def start(registration: Any, path: str, training: Any = None) -> Any:
        backend = registration.create(config=config)
        started.append(backend)
        if isinstance(registration, TrainingBackend) and (missing := describe_missing(backend)):
            raise RegistrationError(f"training backend {registration.id!r} (plugin {registration.plugin!r}) built a "
                                    f"{type(backend).__name__} without {', '.join(missing)} of the training contract",
                                    hint="corerl.training.contract.TrainingEngine lists what a training backend provides")
        nodes = backend.worker_nodes() if hasattr(backend, "worker_nodes") else []
        if nodes:
            console.print(f"{registration.id}: {len(nodes)} rank(s) on {len(set(nodes))} Ray node(s)")
        if training is not None and hasattr(backend, "use_training_engine"):
            if backend.use_training_engine(training):
                console.print(f"generation samples with the {selection.training_backend.id} training model itself")
        backend.load_hf(path)
        return backend

    try:
        assert selection.training_backend.registration and selection.generation_backend.registration
        training = start(selection.training_backend.registration, model_path)
        generation = start(selection.generation_backend.registration, model_path, training)
        assert selection.offload_policy.registration is not None
        offload = selection.offload_policy.registration.create(training=training, generation=generation, config=config)

        def held_out_reward() -> float:
            offload.before_generation()
            return evaluate(generation, task, max_new, core.policy.max_seq_length)

        def export(folder: Path) -> None:
            offload.restore()
            write_complete(folder, lambda work: training.export_hf(str(work)))
        if resume is not None:
            training.load_checkpoint(str(resume[1] / "training"))
            generation.update_weights(training.weight_stream())
            task.set_state(state["task"])
        if "before" not in evals:
            evals["before"] = held_out_reward()
            console.print(f"held-out reward before training: {evals['before']:.3f}")
        log = MetricsLog(run_dir, keep_lines=state.get("metrics_lines") if resume else None,
                         tensorboard=core.run.tensorboard)

        sft = SFT(training, steps_done=done.get("sft", 0))

        def sft_step() -> dict[str, float]:
            offload.before_training()
            return sft.step(task.demonstrations(sft_batch))

        phases = [Phase("sft", sft_steps, sft_step, sft.steps_done)]
        grpo: GRPO | None = None

        def begin_grpo() -> None:
            nonlocal grpo
            reference = reference_offload = None
            if algorithm.kl_penalty:
                ref_path = run_dir / "sft_model" if sft_steps else Path(model_path)
                reference = start(selection.training_backend.registration, str(ref_path))
                reference_offload = ReferenceOffload(reference, core.policy.reference.cpu_offload)
            grpo = GRPO(config, training, generation, task.reward,
                        loss=GRPOLoss.from_config(algorithm),
                        scale_rewards_by_std=algorithm.scale_rewards_by_std,
                        leave_one_out_baseline=algorithm.leave_one_out_baseline,
                        optimization_passes=algorithm.optimization_passes,
                        optimizer_batch_size=algorithm.optimizer_batch_size, reference=reference,
                        steps_done=done.get("grpo", 0), offload=offload, reference_offload=reference_offload)

        def grpo_step() -> dict[str, float]:
            assert grpo is not None
            prompts, examples = task.sample(algorithm.batch_size)
            return grpo.step(prompts, examples)

        phases.append(Phase("grpo", grpo_steps, grpo_step, done.get("grpo", 0)))

        def global_step() -> int:
            return sum(p.done for p in phases)

        def checkpoint() -> None:
            offload.restore()
            snapshot = {"steps_done": {p.name: p.done for p in phases}, "metrics_lines": log.lines,
                        "task": task.state(), "evals": evals}
            save_checkpoint(run_dir, global_step(), lambda folder: training.save_checkpoint(str(folder / "training")),
                            snapshot, core.checkpointing.keep_last)

        interrupted = False
        with stop_on_sigint(lambda text: console.print(f"[yellow]{text}[/]")) as stop:
            for phase in phases:
                if phase.total == 0:
                    continue
                if phase.name == "grpo":
                    begin_grpo()
                    if phases[0].total and "after_sft" not in evals:
                        evals["after_sft"] = held_out_reward()
                        console.print(f"held-out reward after SFT: {evals['after_sft']:.3f}")
                with _progress(console) as progress:
                    bar = progress.add_task(phase.name.upper(), total=phase.total, completed=phase.done, shown="")
                    while phase.done < phase.total and not stop.requested:
                        begin = time.perf_counter()
                        metrics = phase.step()
                        check_finite(phase.name, phase.done + 1, metrics)
                        phase.done += 1
                        metrics = {"phase": phase.name, "step": phase.done, **metrics,
                                   "time/step": time.perf_counter() - begin}
                        log.write(metrics, tb_step=global_step())
                        progress.update(bar, advance=1, shown=_shown(metrics))
                        mark(f"{phase.name}:step:{phase.done}")
                        every = core.checkpointing.save_period
                        if core.checkpointing.enabled and (phase.done % every == 0 or phase.done == phase.total):
                            checkpoint()
                if stop.requested:
                    interrupted = True
                    break
                if phase.name == "sft" and not sft_only and "after_sft" not in evals:
                    # GRPO starts from the SFT weights with a fresh optimizer and schedule: Adam's
                    # moments from SFT's large gradients would shrink GRPO's first hundreds of steps
                    export(run_dir / "sft_model")
                    training.load_hf(str(run_dir / "sft_model"))
                    generation.update_weights(training.weight_stream())

        if interrupted:
            checkpoint()
            log.close()
            plot_curves(read_metrics(log.path), run_dir / "curves.png", f"{run_dir.name} (interrupted)")
            console.print(f"saved a checkpoint at step {global_step()}; "
                          f"run the same command with run.name={run_dir.name} to resume")
            return RunResult(run_dir, {"interrupted_at": {p.name: p.done for p in phases}}, interrupted=True)

        if sft_only:
            generation.update_weights(training.weight_stream())
        evals["after"] = held_out_reward()
        log.scalar("eval/held_out_reward", evals["after"], global_step())
        log.close()
        export(run_dir / "final")
        plot_curves(read_metrics(log.path), run_dir / "curves.png", run_dir.name)
        summary = {
            "held_out_reward_before": evals["before"], "held_out_reward_after_sft": evals.get("after_sft"),
            "held_out_reward_after": evals["after"], "sft_steps": sft_steps, "grpo_steps": grpo_steps,
            "steps": sft_steps + grpo_steps, "algorithm": algorithm.name, "task": selection.task.id,
            "reward": selection.reward.id, "training_backend": selection.training_backend.id,
            "generation_backend": selection.generation_backend.id,
        }
        written = run_dir / ".summary.json.partial"
        written.write_text(json.dumps(summary, indent=2) + "\n")
        written.replace(run_dir / "summary.json")  # its presence says the run finished: all or nothing
        mark("run:end")
        _report(console, evals)
        tensorboard = f"{run_dir / 'tensorboard'}, " if core.run.tensorboard else ""
        console.print(f"wrote {run_dir / 'metrics.jsonl'}, {tensorboard}{run_dir / 'curves.png'}, "
                      f"{run_dir / 'final'} (Hugging Face checkpoint)")
        return RunResult(run_dir, summary)
    finally:
        for backend in reversed(started):
            backend.shutdown()


def _report(console: Any, evals: dict[str, float]) -> None:
    start_label, start = ("SFT start", evals["after_sft"]) if "after_sft" in evals else ("start", evals["before"])
    line = f"held-out reward: {evals['before']:.3f} before"
    if "after_sft" in evals:
        line += f", {evals['after_sft']:.3f} after SFT"
    line += f", {evals['after']:.3f} at the end ({(evals['after'] - start) * 100:+.1f} points over the {start_label})"
    console.print(line)


def run_recipe(config: Config, selection: Selection, host: PluginHost) -> int:
    """``corerl run``: run ``config``; returns the exit status (130 when Ctrl-C stopped it)."""
    return EXIT_INTERRUPTED if execute(config, selection, host).interrupted else 0
