"""Running a validated recipe: GRPO over the selected backends, with a progress bar, a run
directory (metrics.jsonl, the final Hugging Face checkpoint) and a held-out evaluation
before and after.

With ``checkpointing.enabled`` a run saves resumable checkpoints, and ``corerl run`` on an
existing run directory resumes from the last complete one. SFT, TensorBoard and the plot land
with the rest of the GRPO issue.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from corerl.checkpoints import latest_checkpoint, read_state, save_checkpoint
from corerl.config import Config
from corerl.errors import ConfigError, EngineNotAvailable
from corerl.plugin_manager import PluginHost
from corerl.selection import Selection

BUILTIN_MODELS = {
    "builtin:tiny-qwen2": dict(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, vocab_size=128),
}


def make_run_dir(config: Config) -> tuple[Path, tuple[int, Path] | None]:
    """``run.output_dir/run.name`` (a timestamp when unnamed) and the checkpoint to resume from.

    An existing run resumes from its last complete checkpoint; one without any is refused.
    """
    run = config.core.run
    name = run.name or time.strftime("%Y%m%d-%H%M%S")
    path = Path(run.output_dir) / name
    if (path / "metrics.jsonl").exists():
        resume = latest_checkpoint(path) if config.core.checkpointing.enabled else None
        if resume is None:
            raise ConfigError(
                f"run directory {path} already holds a run and no complete checkpoint to resume from",
                key="run.name", hint="pick another run.name, or enable checkpointing to make runs resumable",
            )
        return path, resume
    path.mkdir(parents=True, exist_ok=True)
    return path, None


def resolve_model(model_name: str, run_dir: Path) -> str:
    """A Hugging Face checkpoint directory, building a ``builtin:`` model into the run directory."""
    if model_name in BUILTIN_MODELS:
        from corerl.models.tiny import build_tiny_model

        if (run_dir / "base_model" / "config.json").exists():  # a resumed run keeps its base model
            return str(run_dir / "base_model")
        return str(build_tiny_model(run_dir / "base_model", **BUILTIN_MODELS[model_name]))
    if model_name.startswith("builtin:"):
        raise ConfigError(f"unknown built-in model {model_name!r}", key="policy.model_name",
                          hint=f"built-in models: {', '.join(BUILTIN_MODELS)}")
    if not (Path(model_name) / "config.json").exists():
        raise ConfigError(f"{model_name} is not a Hugging Face checkpoint directory (no config.json)",
                          key="policy.model_name", hint="give a local checkpoint folder: nothing is downloaded")
    return model_name


def evaluate(generation: Any, task: Any, max_new_tokens: int) -> float:
    """Mean held-out reward of greedy answers."""
    from corerl.generation.contract import SamplingSettings

    prompts, items = task.held_out()
    groups = generation.generate(prompts, SamplingSettings(temperature=0.0, max_new_tokens=max_new_tokens), n=1)
    return sum(task.reward(g[0], item) for g, item in zip(groups, items, strict=True)) / len(items)


def run_recipe(config: Config, selection: Selection, host: PluginHost) -> int:
    """Run ``config`` with the selected components; returns the exit status."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )
    from transformers import AutoTokenizer

    from corerl.algorithms.grpo import GRPO
    from corerl.algorithms.grpo_math import GRPOLoss
    from corerl.tasks import load_task

    algorithm = config.core.algorithm
    if algorithm.name != "grpo":
        raise EngineNotAvailable(f"algorithm {algorithm.name!r} is not implemented yet (it lands with the SFT work)",
                                 key="algorithm.name", hint="use algorithm.name=grpo")
    console = Console()
    run_dir, resume = make_run_dir(config)
    console.print(f"run directory: [bold]{run_dir}[/]" + (f" (resuming from step {resume[0]})" if resume else ""))
    model_path = resolve_model(config.core.policy.model_name, run_dir)
    task = load_task(config.core.data.task, AutoTokenizer.from_pretrained(model_path), algorithm.seed)
    max_new = config.core.policy.generation.max_new_tokens

    started = []
    try:
        for choice in (selection.training_backend, selection.generation_backend):
            assert choice.registration is not None
            backend = choice.registration.create(config=config)
            started.append(backend)
            backend.load_hf(model_path)
        training, generation = started
        loop = GRPO(
            config, training, generation, task.reward,
            loss=GRPOLoss(algorithm.ratio_clip_min, algorithm.ratio_clip_max, algorithm.kl_penalty),
            scale_rewards_by_std=algorithm.scale_rewards_by_std, optimization_passes=algorithm.optimization_passes,
        )
        metrics_path = run_dir / "metrics.jsonl"
        if resume is not None:
            state = read_state(resume[1])
            training.load_checkpoint(str(resume[1] / "training"))
            generation.update_weights(training.weight_stream())
            loop.steps_done = state["steps_done"]
            task.set_state(state["task"])
            before = state["held_out_reward_before"]
            kept = metrics_path.read_text().splitlines()[: loop.steps_done]
            metrics_path.write_text("".join(line + "\n" for line in kept))
        else:
            before = evaluate(generation, task, max_new)
            console.print(f"held-out reward before training: {before:.3f}")
        checkpointing = config.core.checkpointing
        columns = [TextColumn("[bold]GRPO"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("reward {task.fields[reward]:.3f}  loss {task.fields[loss]:+.4f}  {task.fields[tps]:,.0f} tok/s"),
                   TimeRemainingColumn()]
        with metrics_path.open("a") as log, Progress(*columns, console=console) as progress:
            bar = progress.add_task("grpo", total=algorithm.max_steps, completed=loop.steps_done, reward=0.0,
                                    loss=0.0, tps=0.0)
            while loop.steps_done < algorithm.max_steps:
                prompts, items = task.sample(algorithm.batch_size)
                start = time.perf_counter()
                metrics = loop.step(prompts, items)
                metrics["time/step"] = time.perf_counter() - start
                log.write(json.dumps(metrics) + "\n")
                log.flush()
                progress.update(bar, advance=1, reward=metrics["reward/mean"], loss=metrics["loss"],
                                tps=metrics["generated_tokens"] / metrics["time/step"])
                step = loop.steps_done
                if checkpointing.enabled and (step % checkpointing.save_period == 0 or step == algorithm.max_steps):
                    state = {"steps_done": step, "task": task.state(), "held_out_reward_before": before}
                    save_checkpoint(run_dir, step, lambda folder: training.save_checkpoint(str(folder / "training")),
                                    state, checkpointing.keep_last)
        after = evaluate(generation, task, max_new)
        training.export_hf(str(run_dir / "final"))
        (run_dir / "summary.json").write_text(json.dumps({
            "held_out_reward_before": before, "held_out_reward_after": after, "steps": algorithm.max_steps,
            "training_backend": selection.training_backend.id, "generation_backend": selection.generation_backend.id,
        }, indent=2) + "\n")
        console.print(f"held-out reward: {before:.3f} -> {after:.3f} ({(after - before) * 100:+.1f} points)")
        console.print(f"wrote {run_dir / 'metrics.jsonl'}, {run_dir / 'final'} (Hugging Face checkpoint)")
        return 0
    finally:
        for backend in reversed(started):
            backend.shutdown()
