"""Registers the ``vllm`` generation backend, the default, and its memory model for ``corerl plan``."""

from __future__ import annotations

from collections.abc import Callable

from corerl.sdk import DialectSection, GenerationBackend, MemoryModel, hookimpl
from corerl_vllm.config import VllmConfig


@hookimpl
def corerl_register_generation_backends(register: Callable[[GenerationBackend], None]) -> None:
    register(
        GenerationBackend(
            id="vllm",
            priority=200,
            factory="corerl_vllm.backend:VllmGenerationBackend",
            check_supported="corerl_vllm.support:check_supported",
            config_section="policy.generation.vllm_cfg",
            config_schema=VllmConfig,
            description="vLLM engine with in-place weight refit",
            lora=True,
            moe=True,
            adapter_sampler="corerl_vllm.adapter_sampler:build",
        )
    )


@hookimpl
def corerl_register_memory_models(register: Callable[[MemoryModel], None]) -> None:
    register(MemoryModel(id="vllm", factory="corerl_vllm.memory_model:VllmMemory",
                         description="gpu_memory_utilization of each GPU colocated; 16-bit weights over its TP"))


@hookimpl
def corerl_register_dialect_sections(register: Callable[[DialectSection], None]) -> None:
    register(DialectSection(id="nemo-rl.vllm", dialect="nemo-rl", backend="vllm",
                            sections=("policy.generation.vllm_cfg", "policy.generation.vllm_kwargs"),
                            factory="corerl_vllm.nemo_rl_section:SECTION",
                            description="NeMo RL's vllm_cfg section and vllm_kwargs"))
    register(DialectSection(id="skyrl.vllm", dialect="skyrl", backend="vllm",
                            sections=("generator.inference_engine",),
                            factory="corerl_vllm.skyrl_section:SECTION",
                            description="SkyRL's inference engine keys and generator.inference_engine.backend vllm"))


#: the plugin contract this plugin was written against (docs/plugins.md, "Contract changelog")
corerl_contract = "2.18"
