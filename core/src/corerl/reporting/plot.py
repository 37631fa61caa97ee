"""The PNG of a run's curves (matplotlib, headless): each algorithm says what it plots
(:class:`corerl.registry.PlotSpec`)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from corerl.environments.contract import STOP_REASONS
from corerl.reporting.phases import EVAL_PHASE, RECOVERY_PHASE


def plot_curves(rows: list[dict[str, Any]], out: Path, title: str, algorithms: Iterable[Any] = ()) -> Path:
    """Left: the metrics the run's last algorithm with a plot declares, per step (GRPO and PPO:
    reward mean and max; DPO: preference accuracy and margin), and the held-out evaluations
    (``eval.every_n_steps``: the ``eval`` rows, as markers at the algorithm's steps); right: the
    loss-like metrics of each phase, one after the other (PPO: the policy's loss and the critic's
    value loss)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    specs = {a.id: a.plot for a in algorithms}
    rows = [r for r in rows if r.get("phase") != RECOVERY_PHASE]  # a recovery's row is an event, not a step
    phases = list(dict.fromkeys(r["phase"] for r in rows if "phase" in r and r["phase"] != EVAL_PHASE))
    evaluations = [r for r in rows if r.get("phase") == EVAL_PHASE]
    episodes = [r for r in rows if "env/turns" in r]
    figure, axes = plt.subplots(1, 3 if episodes else 2, figsize=(16 if episodes else 11, 4))
    left, loss_axes = axes[0], axes[1]
    if episodes:
        _plot_episodes(axes[2], episodes)
    shown = [p for p in phases if p in specs and specs[p].metrics]
    if shown:
        phase, spec = shown[-1], specs[shown[-1]]
        part = [r for r in rows if r.get("phase") == phase]
        steps = [r["step"] for r in part]
        for index, metric in enumerate(spec.metrics):
            left.plot(steps, [r.get(metric, float("nan")) for r in part], label=metric, alpha=1.0 if index == 0 else 0.6)
        left.set(title=f"{phase.upper()} {spec.title}".strip(), xlabel=f"{phase.upper()} step")
    if evaluations:
        _plot_evaluations(left, evaluations)
        if not shown:
            left.set(title="held-out evaluation", xlabel="step")
    if shown or evaluations:
        left.legend(fontsize="small")
    else:
        left.text(0.5, 0.5, "no steps with curves to plot", ha="center", va="center", transform=left.transAxes)
        left.set(title="reward", xlabel="step")
    offset = 0
    for phase in phases:
        part = [r for r in rows if r.get("phase") == phase]
        losses = specs[phase].losses if phase in specs else ("loss",)
        for metric in losses:
            label = phase if metric == "loss" else f"{phase} {metric}"
            loss_axes.plot([offset + r["step"] for r in part], [r.get(metric, float("nan")) for r in part], label=label)
        offset += len(part)
    loss_axes.set(title="loss", xlabel=f"step ({', then '.join(p.upper() for p in phases) or 'none'})", ylabel="loss")
    if offset:
        loss_axes.legend()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(out, dpi=100)
    plt.close(figure)
    return out


def _plot_evaluations(axes: Any, rows: list[dict[str, Any]]) -> None:
    """The held-out evaluations: each figure (greedy, mean@n, pass@k) a dashed line of markers."""
    steps = [r["step"] for r in rows]
    for metric in dict.fromkeys(k for r in rows for k in r if k not in ("phase", "step", "seconds")):
        axes.plot(steps, [r.get(metric, float("nan")) for r in rows], marker="o", linestyle="--",
                  label=f"eval {metric}")


def _plot_episodes(axes: Any, rows: list[dict[str, Any]]) -> None:
    """The environment's panel: turns per episode, tool calls and failures per episode, and the
    share of episodes ended by each reason that occurred (and environment seconds per step, on a
    second axis)."""
    steps = [r["step"] for r in rows]
    axes.plot(steps, [r["env/turns"] for r in rows], label="turns per episode")
    if any(r.get("env/tool_calls") for r in rows):
        axes.plot(steps, [r["env/tool_calls_per_episode"] for r in rows], label="tool calls per episode")
        axes.plot(steps, [r["env/tool_failures_per_episode"] for r in rows], label="failed tool calls per episode")
    for reason in STOP_REASONS:
        if any(r.get(f"env/stop/{reason}") for r in rows):
            axes.plot(steps, [r.get(f"env/stop/{reason}", 0.0) for r in rows], linestyle="--", label=f"ended: {reason}")
    seconds = axes.twinx()
    seconds.plot(steps, [r.get("time/environment", 0.0) for r in rows], color="grey", alpha=0.4, label="env seconds")
    seconds.set_ylabel("environment seconds per step")
    axes.legend(fontsize="small")
    axes.set(title="episodes", xlabel=f"{rows[0].get('phase', '').upper()} step")
