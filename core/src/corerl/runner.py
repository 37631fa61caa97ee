"""Running a validated recipe: GRPO over the selected backends, with a progress bar, a run
directory (metrics.jsonl, the final Hugging Face checkpoint) and a held-out evaluation
before and after.

SFT, checkpoints and resume, TensorBoard and the plot land with the rest of the GRPO issue.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from corerl.config import Config
from corerl.errors import ConfigError, EngineNotAvailable
from corerl.plugin_manager import PluginHost
from corerl.selection import Selection

BUILTIN_MODELS = {
    "builtin:tiny-qwen2": dict(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, vocab_size=128),
}


def make_run_dir(config: Config) -> Path:
    """``run.output_dir/run.name`` (a timestamp when unnamed); refuses to overwrite a finished run."""
    run = config.core.run
    name = run.name or time.strftime("%Y%m%d-%H%M%S")
    path = Path(run.output_dir) / name
    if (path / "metrics.jsonl").exists():
        raise ConfigError(
            f"run directory {path} already holds a run", key="run.name",
            hint="pick another run.name (resuming lands with checkpointing)",
        )
    path.mkdir(parents=True, exist_ok=True)
    return path


def resolve_model(model_name: str, run_dir: Path) -> str:
    """A Hugging Face checkpoint directory, building a ``builtin:`` model into the run directory."""
    if model_name in BUILTIN_MODELS:
        from corerl.models.tiny import build_tiny_model

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
    run_dir = make_run_dir(config)
    console.print(f"run directory: [bold]{run_dir}[/]")
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
        before = evaluate(generation, task, max_new)
        console.print(f"held-out reward before training: {before:.3f}")
        columns = [TextColumn("[bold]GRPO"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("reward {task.fields[reward]:.3f}  loss {task.fields[loss]:+.4f}  {task.fields[tps]:,.0f} tok/s"),
                   TimeRemainingColumn()]
        with (run_dir / "metrics.jsonl").open("w") as log, Progress(*columns, console=console) as progress:
            bar = progress.add_task("grpo", total=algorithm.max_steps, reward=0.0, loss=0.0, tps=0.0)
            for _ in range(algorithm.max_steps):
                prompts, items = task.sample(algorithm.batch_size)
                start = time.perf_counter()
                metrics = loop.step(prompts, items)
                metrics["time/step"] = time.perf_counter() - start
                log.write(json.dumps(metrics) + "\n")
                log.flush()
                progress.update(bar, advance=1, reward=metrics["reward/mean"], loss=metrics["loss"],
                                tps=metrics["generated_tokens"] / metrics["time/step"])
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
