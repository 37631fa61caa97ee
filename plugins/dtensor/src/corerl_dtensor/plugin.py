"""Registers the ``dtensor`` training backend (priority 100, the default)."""

from __future__ import annotations

from collections.abc import Callable

from corerl.sdk import DialectSection, MemoryModel, Preset, TrainingBackend, hookimpl
from corerl_dtensor.config import DTensorConfig


@hookimpl
def corerl_register_training_backends(register: Callable[[TrainingBackend], None]) -> None:
    register(
        TrainingBackend(
            id="dtensor",
            priority=100,
            check_supported="corerl_dtensor.support:check_supported",
            factory="corerl_dtensor.backend:DTensorBackend",
            config_section="policy.dtensor_cfg",
            tensor_parallel_key="tensor_parallel_size",
            expert_parallel_key="expert_parallel_size",
            context_parallel_key="context_parallel_size",
            value_model=True,
            lora=True,
            moe=True,
            section_aliases=("policy.dtensor_config",),
            config_schema=DTensorConfig,
            adapter_model="corerl_dtensor.adapter_model:build",
            description="PyTorch FSDP2 + tensor parallel (DTensor)",
        )
    )


@hookimpl
def corerl_register_presets(register: Callable[[Preset], None]) -> None:
    register(Preset(id="fsdp", factory="corerl_dtensor.presets:FSDP", description="FSDP2 full sharding on the dtensor backend (the default strategy)"))


@hookimpl
def corerl_register_memory_models(register: Callable[[MemoryModel], None]) -> None:
    register(MemoryModel(id="dtensor", factory="corerl_dtensor.memory_model:DTensorMemory",
                         description="FSDP2 x TP: fp32 shards, AdamW moments"))


@hookimpl
def corerl_register_dialect_sections(register: Callable[[DialectSection], None]) -> None:
    register(DialectSection(id="nemo-rl.dtensor", dialect="nemo-rl", backend="dtensor",
                            sections=("policy.dtensor_cfg", "value.dtensor_cfg"),
                            factory="corerl_dtensor.nemo_rl_section:SECTION",
                            description="NeMo RL's dtensor_cfg sections"))
    register(DialectSection(id="skyrl.dtensor", dialect="skyrl", backend="dtensor",
                            sections=("trainer.policy.fsdp_config", "trainer.ref.fsdp_config",
                                      "trainer.critic.fsdp_config"),
                            factory="corerl_dtensor.skyrl_section:SECTION",
                            description="SkyRL's fsdp_config sections and trainer.strategy fsdp/fsdp2"))


#: the plugin contract this plugin was written against (docs/plugins.md, "Contract changelog")
corerl_contract = "2.18"
