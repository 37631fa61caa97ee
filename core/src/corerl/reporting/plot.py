"""The PNG of a run's reward and loss curves (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_curves(rows: list[dict[str, Any]], out: Path, title: str) -> Path:
    """Reward per GRPO step (mean and max) and loss per step of each phase, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (reward_axes, loss_axes) = plt.subplots(1, 2, figsize=(11, 4))
    grpo = [r for r in rows if r.get("phase") == "grpo"]
    if grpo:
        steps = [r["step"] for r in grpo]
        reward_axes.plot(steps, [r["reward/mean"] for r in grpo], label="mean")
        reward_axes.plot(steps, [r["reward/max"] for r in grpo], label="max", alpha=0.5)
        reward_axes.legend()
    else:
        reward_axes.text(0.5, 0.5, "no GRPO steps", ha="center", va="center", transform=reward_axes.transAxes)
    reward_axes.set(title="GRPO reward", xlabel="GRPO step", ylabel="reward")
    offset = 0
    for phase in ("sft", "grpo"):
        part = [r for r in rows if r.get("phase") == phase]
        if part:
            loss_axes.plot([offset + r["step"] for r in part], [r["loss"] for r in part], label=phase)
            offset += len(part)
    loss_axes.set(title="loss", xlabel="step (SFT, then GRPO)", ylabel="loss")
    if offset:
        loss_axes.legend()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(out, dpi=100)
    plt.close(figure)
    return out
