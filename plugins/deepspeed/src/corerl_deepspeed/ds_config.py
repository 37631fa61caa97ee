"""The DeepSpeed JSON config of a corerl recipe (``policy.deepspeed_cfg`` and ``policy``)."""

from __future__ import annotations

import copy
from typing import Any

from corerl.sdk import Config


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` merged in: nested mappings key by key, everything else replaced."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _offload(target: str, nvme_path: str | None, on_gpu: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {"device": target, "pin_memory": on_gpu}
    if target == "nvme":
        entry["nvme_path"] = nvme_path
    return entry


def build_ds_config(config: Config, on_gpu: bool) -> dict[str, Any]:
    """The config ``deepspeed.initialize`` gets. Gradient accumulation is corerl's (the micro-batch
    plan of each step, with explicit accumulation boundaries), so DeepSpeed sees one micro-batch
    per step; ``policy.deepspeed_cfg.config`` is merged over the result."""
    settings = config.section("policy.deepspeed_cfg")
    policy = config.core.policy
    clip = settings.gradient_clipping if settings.gradient_clipping is not None else policy.max_grad_norm
    zero: dict[str, Any] = {"stage": settings.zero_stage}
    if settings.offload_optimizer != "none":
        zero["offload_optimizer"] = _offload(settings.offload_optimizer, settings.nvme_path, on_gpu)
    if settings.offload_param != "none":
        zero["offload_param"] = _offload(settings.offload_param, settings.nvme_path, on_gpu)
    generated: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": policy.train_micro_batch_size,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": clip or 0.0,
        "zero_optimization": zero,
        "bf16": {"enabled": policy.precision == "bfloat16"},
        "fp16": {"enabled": policy.precision == "float16"},
        "zero_allow_untested_optimizer": True,  # the torch optimizers of policy.optimizer
        "zero_force_ds_cpu_optimizer": False,  # ... also with optimizer offload
        "steps_per_print": 2**31 - 1,  # the run's progress bar reports; no per-step DeepSpeed lines
        "wall_clock_breakdown": False,
    }
    if settings.use_deepspeed_optimizer:
        opt = policy.optimizer  # adam or adamw (the section's check refuses sgd)
        generated["optimizer"] = {"type": "AdamW" if opt.name == "adamw" else "Adam", "params": {
            "lr": opt.lr, "betas": list(opt.betas), "eps": opt.eps, "weight_decay": opt.weight_decay}}
    return merge(generated, settings.config)
