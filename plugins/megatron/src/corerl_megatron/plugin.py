"""Registers the ``megatron`` training backend (priority 300), generation backend and the
``corerl convert`` command."""

from __future__ import annotations

from collections.abc import Callable

from corerl.sdk import (
    Command,
    DialectSection,
    GenerationBackend,
    MemoryModel,
    Preset,
    TrainingBackend,
    hookimpl,
)
from corerl_megatron.config import MegatronConfig, MegatronGenerationConfig


@hookimpl
def corerl_register_training_backends(register: Callable[[TrainingBackend], None]) -> None:
    register(
        TrainingBackend(
            id="megatron",
            priority=300,
            check_supported="corerl_megatron.support:check_supported",
            factory="corerl_megatron.training.backend:MegatronBackend",
            config_section="policy.megatron_cfg",
            value_model=True,
            moe=True,
            lora=True,
            tensor_parallel_key="tensor_model_parallel_size",
            expert_parallel_key="expert_model_parallel_size",
            context_parallel_key="context_parallel_size",
            config_schema=MegatronConfig,
            description="megatron-core tensor/pipeline/context/expert parallel",
        )
    )


@hookimpl
def corerl_register_generation_backends(register: Callable[[GenerationBackend], None]) -> None:
    register(
        GenerationBackend(
            id="megatron",
            priority=100,
            factory="corerl_megatron.generation.backend:MegatronGeneration",
            check_supported="corerl_megatron.support:check_generation_supported",
            config_section="policy.generation.mcore_generation_config",
            config_schema=MegatronGenerationConfig,
            moe=True,
            description="sampling with the Megatron training model itself",
        )
    )


@hookimpl
def corerl_register_commands(register: Callable[[Command], None]) -> None:
    register(
        Command(
            id="convert",
            factory="corerl_megatron.conversion.command:main",
            arguments="corerl_megatron.conversion.command:add_arguments",
            description="convert a checkpoint between Hugging Face and Megatron formats",
        )
    )


@hookimpl
def corerl_register_presets(register: Callable[[Preset], None]) -> None:
    register(Preset(id="megatron_tp", factory="corerl_megatron.presets:MEGATRON_TP", description="megatron-core, tensor parallel 2 with sequence parallel"))


@hookimpl
def corerl_register_memory_models(register: Callable[[MemoryModel], None]) -> None:
    register(MemoryModel(id="megatron", factory="corerl_megatron.training.memory_model:MegatronMemory",
                         description="TP x PP x DP with the distributed optimizer; megatron generation's KV buffer"))


@hookimpl
def corerl_register_dialect_sections(register: Callable[[DialectSection], None]) -> None:
    register(DialectSection(id="nemo-rl.megatron", dialect="nemo-rl", backend="megatron",
                            sections=("policy.megatron_cfg", "value.megatron_cfg",
                                      "policy.generation.mcore_generation_config"),
                            factory="corerl_megatron.nemo_rl_section:SECTION",
                            description="NeMo RL's megatron_cfg and mcore_generation_config sections"))
    register(DialectSection(id="skyrl.megatron", dialect="skyrl", backend="megatron",
                            sections=("trainer.policy.megatron_config", "trainer.ref.megatron_config"),
                            factory="corerl_megatron.skyrl_section:SECTION",
                            description="SkyRL's megatron_config sections and trainer.strategy megatron"))


#: the plugin contract this plugin was written against (docs/plugins.md, "Contract changelog")
corerl_contract = "2.18"
