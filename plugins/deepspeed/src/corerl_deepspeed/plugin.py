"""Registers the ``deepspeed`` training backend (priority 200)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from corerl.sdk import MemoryModel, Preset, TrainingBackend, hookimpl
from corerl_deepspeed.config import DeepSpeedConfig


def _drop_accelerator_notice(record: logging.LogRecord) -> bool:
    return "Setting accelerator to CPU" not in record.getMessage()


# transformers imports DeepSpeed whenever it is installed, and DeepSpeed then prints, on stdout, a
# notice that it found no GPU: on a CPU machine that line would open every run's output (and break
# tools that read corerl's stdout). A filter on DeepSpeed's logger (set up before DeepSpeed creates
# it, kept when it does) drops that one record, without importing DeepSpeed here.
logging.getLogger("DeepSpeed").addFilter(_drop_accelerator_notice)


#: what DeepSpeed's optimizer-state files name besides tensors and plain data: an enum, its loss
#: scaler's plain attributes, tensor subclass rebuilding (a resume refuses anything else unread)
OPTIMIZER_STATE_GLOBALS = (
    "deepspeed.runtime.zero.config.ZeroStageEnum", "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler", "deepspeed.utils.tensor_fragment.fragment_address",
)


@hookimpl
def corerl_register_training_backends(register: Callable[[TrainingBackend], None]) -> None:
    register(
        TrainingBackend(
            id="deepspeed",
            priority=200,
            check_supported="corerl_deepspeed.support:check_supported",
            factory="corerl_deepspeed.backend:DeepSpeedBackend",
            config_section="policy.deepspeed_cfg",
            value_model=True,
            lora=True,
            moe=True,
            checkpoint_globals=OPTIMIZER_STATE_GLOBALS,
            config_schema=DeepSpeedConfig,
            adapter_model="corerl_deepspeed.adapter_model:build",
            description="DeepSpeed ZeRO stages 0-3 with CPU/NVMe offload",
        )
    )


@hookimpl
def corerl_register_presets(register: Callable[[Preset], None]) -> None:
    register(Preset(id="zero2", factory="corerl_deepspeed.presets:ZERO2", description="DeepSpeed ZeRO-2: optimizer state and gradients partitioned"))
    register(Preset(id="zero3", factory="corerl_deepspeed.presets:ZERO3", description="DeepSpeed ZeRO-3: parameters, gradients and optimizer state partitioned"))
    register(Preset(id="zero3_offload", factory="corerl_deepspeed.presets:ZERO3_OFFLOAD", description="DeepSpeed ZeRO-3 with optimizer state and parameters in CPU memory"))


@hookimpl
def corerl_register_memory_models(register: Callable[[MemoryModel], None]) -> None:
    register(MemoryModel(id="deepspeed", factory="corerl_deepspeed.memory_model:DeepSpeedMemory",
                         description="ZeRO 1-3 partitions, optimizer and parameter offload"))


#: the plugin contract this plugin was written against (docs/plugins.md, "Contract changelog")
corerl_contract = "2.18"
