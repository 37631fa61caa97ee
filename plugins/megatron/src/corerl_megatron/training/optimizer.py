"""megatron-core's optimizer and learning-rate scheduler for ``policy.megatron_cfg``."""

from __future__ import annotations

from typing import Any


def build_optimizer(settings: Any, mconfig: Any, model: Any, total_steps: int) -> tuple[Any, Any]:
    """(optimizer, scheduler) for the DDP-wrapped ``model`` from ``megatron_cfg.optimizer`` and
    ``megatron_cfg.scheduler``; the scheduler's warm-up and decay count optimizer steps."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    opt, sched = settings.optimizer, settings.scheduler
    optimizer = get_megatron_optimizer(OptimizerConfig(
        optimizer=opt.optimizer, lr=opt.lr, min_lr=opt.min_lr, weight_decay=opt.weight_decay,
        adam_beta1=opt.adam_beta1, adam_beta2=opt.adam_beta2, adam_eps=opt.adam_eps,
        sgd_momentum=opt.sgd_momentum, clip_grad=opt.clip_grad, bf16=mconfig.bf16,
        params_dtype=mconfig.params_dtype, use_distributed_optimizer=opt.use_distributed_optimizer,
    ), [model])
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=0.0 if sched.lr_warmup_iters else opt.lr, max_lr=opt.lr, min_lr=opt.min_lr,
        lr_warmup_steps=sched.lr_warmup_iters, lr_decay_steps=sched.lr_decay_iters or total_steps,
        lr_decay_style=sched.lr_decay_style, start_wd=opt.weight_decay, end_wd=opt.weight_decay,
        wd_incr_steps=total_steps, wd_incr_style="constant",
    )
    # megatron's warm-up gives step 0 the initial lr (0): count the first step as 1, so every
    # optimizer step learns (warm-up w: lr/w, 2 lr/w, ... lr)
    scheduler.step(increment=1)
    return optimizer, scheduler
