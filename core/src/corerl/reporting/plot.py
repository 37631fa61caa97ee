"""The PNG of a run's reward and loss curves (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_curves(rows: list[dict[str, Any]], out: Path, title: str) -> Path:
    """Left: reward per GRPO or PPO step (mean and max), or for DPO the preference accuracy and the
    implicit-reward margin per step; right: loss per step of each phase (PPO: the policy's and
    the critic's value loss)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, loss_axes) = plt.subplots(1, 2, figsize=(11, 4))
    sampled = [r for r in rows if r.get("phase") in ("grpo", "ppo")]
    dpo = [r for r in rows if r.get("phase") == "dpo"]
    if sampled:
        name = sampled[0]["phase"].upper()
        steps = [r["step"] for r in sampled]
        left.plot(steps, [r["reward/mean"] for r in sampled], label="mean")
        left.plot(steps, [r["reward/max"] for r in sampled], label="max", alpha=0.5)
        left.legend()
        left.set(title=f"{name} reward", xlabel=f"{name} step", ylabel="reward")
    elif dpo:
        steps = [r["step"] for r in dpo]
        left.plot(steps, [r.get("preference_accuracy", float("nan")) for r in dpo], label="preference accuracy")
        left.plot(steps, [r.get("rewards/margin", float("nan")) for r in dpo], label="reward margin", alpha=0.7)
        left.legend()
        left.set(title="DPO (training batches)", xlabel="DPO step")
    else:
        left.text(0.5, 0.5, "no GRPO, PPO or DPO steps", ha="center", va="center", transform=left.transAxes)
        left.set(title="reward", xlabel="step")
    offset = 0
    for phase in ("sft", "grpo", "ppo", "dpo"):
        part = [r for r in rows if r.get("phase") == phase]
        if part:
            loss_axes.plot([offset + r["step"] for r in part], [r["loss"] for r in part], label=phase)
            if phase == "ppo":
                loss_axes.plot([offset + r["step"] for r in part], [r["critic/value_loss"] for r in part],
                               label="critic value loss")
            offset += len(part)
    loss_axes.set(title="loss", xlabel="step (SFT, then GRPO, PPO or DPO)", ylabel="loss")
    if offset:
        loss_axes.legend()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(out, dpi=100)
    plt.close(figure)
    return out
