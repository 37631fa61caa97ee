"""The PNG of a run's reward and loss curves (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_curves(rows: list[dict[str, Any]], out: Path, title: str) -> Path:
    """Left: reward per GRPO step (mean and max), or for DPO the preference accuracy and the
    implicit-reward margin per step; right: loss per step of each phase."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, loss_axes) = plt.subplots(1, 2, figsize=(11, 4))
    grpo = [r for r in rows if r.get("phase") == "grpo"]
    dpo = [r for r in rows if r.get("phase") == "dpo"]
    if grpo:
        steps = [r["step"] for r in grpo]
        left.plot(steps, [r["reward/mean"] for r in grpo], label="mean")
        left.plot(steps, [r["reward/max"] for r in grpo], label="max", alpha=0.5)
        left.legend()
        left.set(title="GRPO reward", xlabel="GRPO step", ylabel="reward")
    elif dpo:
        steps = [r["step"] for r in dpo]
        left.plot(steps, [r.get("preference_accuracy", float("nan")) for r in dpo], label="preference accuracy")
        left.plot(steps, [r.get("rewards/margin", float("nan")) for r in dpo], label="reward margin", alpha=0.7)
        left.legend()
        left.set(title="DPO (training batches)", xlabel="DPO step")
    else:
        left.text(0.5, 0.5, "no GRPO or DPO steps", ha="center", va="center", transform=left.transAxes)
        left.set(title="reward", xlabel="step")
    offset = 0
    for phase in ("sft", "grpo", "dpo"):
        part = [r for r in rows if r.get("phase") == phase]
        if part:
            loss_axes.plot([offset + r["step"] for r in part], [r["loss"] for r in part], label=phase)
            offset += len(part)
    loss_axes.set(title="loss", xlabel="step (SFT, then GRPO or DPO)", ylabel="loss")
    if offset:
        loss_axes.legend()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(out, dpi=100)
    plt.close(figure)
    return out
