"""Registers the ``sglang`` generation backend and NeMo RL's ``sglang_cfg`` section."""

from __future__ import annotations

from collections.abc import Callable

from corerl.sdk import DialectSection, GenerationBackend, hookimpl
from corerl_sglang.config import SglangConfig


@hookimpl
def corerl_register_generation_backends(register: Callable[[GenerationBackend], None]) -> None:
    register(
        GenerationBackend(
            id="sglang",
            priority=100,  # below vllm's: picked only where a recipe names it
            factory="corerl_sglang.backend:SglangGenerationBackend",
            check_supported="corerl_sglang.support:check_supported",
            config_section="policy.generation.sglang_cfg",
            config_schema=SglangConfig,
            description="SGLang's offline engine with in-place weight refit (GPU machines)",
            moe=True,
        )
    )


@hookimpl
def corerl_register_dialect_sections(register: Callable[[DialectSection], None]) -> None:
    register(DialectSection(id="nemo-rl.sglang", dialect="nemo-rl", backend="sglang",
                            sections=("policy.generation.sglang_cfg",),
                            factory="corerl_sglang.nemo_rl_section:SECTION",
                            description="NeMo RL's sglang_cfg section"))


#: the table's checks this plugin adds (run after the core's): what this machine lacks for SGLang
corerl_checks = ("corerl_sglang.support:check_machine",)

#: the plugin contract this plugin was written against (docs/plugins.md, "Contract changelog")
corerl_contract = "2.18"
