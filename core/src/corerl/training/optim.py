"""Optimizer and learning-rate schedule from ``policy.optimizer`` / ``policy.scheduler``."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from corerl.config.schema import OptimizerConfig, SchedulerConfig


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: OptimizerConfig, *,
                    fused: bool = True) -> torch.optim.Optimizer:
    """AdamW, Adam or SGD with the configured hyper-parameters. Adam(W) takes torch's fused
    kernel where ``fused`` allows it and every parameter is a plain tensor on the CPU or a GPU
    (pass ``fused=False`` where another library re-partitions the parameters, as DeepSpeed does)."""
    import torch

    params = [p for p in params if p.requires_grad]
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    cls = torch.optim.AdamW if cfg.name == "adamw" else torch.optim.Adam
    fused = fused and bool(params) and all(type(p.data) is torch.Tensor and p.is_floating_point()
                                 and p.device.type in ("cpu", "cuda") for p in params)
    return cls(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay,
               fused=fused or None)


def lr_factor(step: int, cfg: SchedulerConfig, total_steps: int) -> float:
    """The multiplier of the base LR after ``step`` optimizer steps."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.name == "constant":
        return 1.0
    span = max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    if cfg.name == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: SchedulerConfig, total_steps: int) -> Any:
    """A ``LambdaLR`` following :func:`lr_factor`."""
    import torch

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg, total_steps))
