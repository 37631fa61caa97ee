"""Registers the ``example`` training backend. Keep this module light: no torch here."""

from __future__ import annotations

from collections.abc import Callable

from corerl.sdk import DialectSection, MemoryModel, TrainingBackend, hookimpl
from corerl_example.config import ExampleConfig


@hookimpl
def corerl_register_training_backends(register: Callable[[TrainingBackend], None]) -> None:
    register(
        TrainingBackend(
            id="example",
            priority=50,
            factory="corerl_example.backend:ExampleBackend",
            config_section="policy.example_cfg",
            config_schema=ExampleConfig,
            description="template backend",
        )
    )


@hookimpl
def corerl_register_memory_models(register: Callable[[MemoryModel], None]) -> None:
    # what each GPU holds in the backend's layouts: `corerl plan` ranks them with the others'
    register(MemoryModel(id="example", factory="corerl_example.memory_model:ExampleMemory",
                         description="one float32 process with AdamW"))


@hookimpl
def corerl_register_dialect_sections(register: Callable[[DialectSection], None]) -> None:
    # NeMo RL's recipes: corerl's NeMo RL dialect takes policy.example_cfg as this backend's section
    register(DialectSection(id="nemo-rl.example", dialect="nemo-rl", sections=("policy.example_cfg",),
                            backend="example", factory="corerl_example.nemo_rl_section:SECTION",
                            description="policy.example_cfg in NeMo RL's recipes"))


#: the plugin contract this plugin was written against (docs/plugins.md, "Contract changelog")
corerl_contract = "2.18"
