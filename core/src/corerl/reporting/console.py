"""The console every corerl message goes through.

In a terminal it is rich's own (wrapped to the window, live progress bars). Anywhere else (a
pipe, a log file, a script's ``capture_output``) each message stays one line whatever its
length: a path or a ``run directory:`` line is never cut, so ``grep`` and scripts read it back
whole. Tables keep their own layout, as wide as their content needs.
"""

from __future__ import annotations

from typing import Any

#: The width a console that is not a terminal lays tables out in: wide enough that no table of
#: ours is squeezed, and tables are not stretched to it (rich sizes them to their content).
UNWRAPPED_WIDTH = 4096


def make_console(**kwargs: Any) -> Any:
    """A ``rich.console.Console`` (``kwargs`` as rich takes them) that wraps only in a terminal."""
    from rich.console import Console

    console = Console(**kwargs)
    if console.is_terminal:
        return console
    return Console(soft_wrap=True, width=UNWRAPPED_WIDTH, **kwargs)


def report_held_out(console: Any, evals: dict[str, float], label: str) -> None:
    """The run's last line of figures: held-out ``label`` before, after SFT (when it ran), at the end."""
    start_label, start = ("SFT start", evals["after_sft"]) if "after_sft" in evals else ("start", evals["before"])
    line = f"held-out {label}: {evals['before']:.3f} before"
    if "after_sft" in evals:
        line += f", {evals['after_sft']:.3f} after SFT"
    line += f", {evals['after']:.3f} at the end ({(evals['after'] - start) * 100:+.1f} points over the {start_label})"
    console.print(line)


def progress_bars(console: Any) -> Any:
    """The run's progress bars: phase, bar, steps, the step's figures, time left."""
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


def bar_text(metrics: dict[str, float]) -> str:
    """What a progress bar shows of a step's metrics."""
    tokens = metrics.get("generated_tokens", metrics.get("tokens", 0.0))
    text = f"reward {metrics['reward/mean']:.3f}  " if "reward/mean" in metrics else ""
    if "preference_accuracy" in metrics:
        text = f"accuracy {metrics['preference_accuracy']:.2f}  margin {metrics.get('rewards/margin', 0.0):+.3f}  "
    if "critic/value_loss" in metrics:
        text += f"value loss {metrics['critic/value_loss']:.4f}  "
    if "env/turns" in metrics:
        text += f"turns {metrics['env/turns']:.1f}  "
    if "loss" in metrics:
        text += f"loss {metrics['loss']:+.4f}  "
    elif metrics.get("simulated"):  # algorithm.async.simulate_training: the step slept, nothing trained
        text += "simulated  "
    return text + f"{tokens / metrics['time/step']:,.0f} tok/s"
