"""Registers the ``deepspeed`` training backend (priority 200)."""

from __future__ import annotations

from collections.abc import Callable

from corerl import TrainingBackend, hookimpl
from corerl.pending import pending_engine
from corerl_deepspeed.config import DeepSpeedConfig


@hookimpl
def corerl_register_training_backends(register: Callable[[TrainingBackend], None]) -> None:
    register(
        TrainingBackend(
            id="deepspeed",
            priority=200,
            factory=pending_engine("training backend 'deepspeed'", "the DeepSpeed plugin issue"),
            config_section="policy.deepspeed_cfg",
            config_schema=DeepSpeedConfig,
            description="DeepSpeed ZeRO stages 0-3 with CPU/NVMe offload",
        )
    )
