"""Registers the ``megatron`` training backend (priority 300) and generation backend."""

from __future__ import annotations

from collections.abc import Callable

from corerl import GenerationBackend, TrainingBackend, hookimpl
from corerl_megatron.config import MegatronConfig, MegatronGenerationConfig


@hookimpl
def corerl_register_training_backends(register: Callable[[TrainingBackend], None]) -> None:
    register(
        TrainingBackend(
            id="megatron",
            priority=300,
            check_supported="corerl_megatron.support:check_supported",
            factory="corerl_megatron.backend:MegatronBackend",
            config_section="policy.megatron_cfg",
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
            factory="corerl_megatron.generation:MegatronGeneration",
            config_section="policy.generation.mcore_generation_config",
            config_schema=MegatronGenerationConfig,
            description="sampling with the Megatron training model itself",
        )
    )
