"""Every kind of component a plugin registers, in one table: its hook, its registry (the
attribute of :class:`corerl.plugin_manager.PluginHost` and the key of ``corerl plugins --json``),
its registration class and its label in the ``corerl plugins`` table. The plugin manager, the
listing and :func:`corerl.testing.plugin_from` all read it; a new kind is one row here, one
hook spec in :mod:`corerl.hookspecs` and one registration class in :mod:`corerl.registry`."""

from __future__ import annotations

import attrs

from corerl.registry import (
    Algorithm,
    Command,
    Environment,
    ExperimentLogger,
    GenerationBackend,
    MemoryModel,
    OffloadPolicy,
    Preset,
    Registration,
    Reward,
    SequencePacker,
    Task,
    Tool,
    ToolCallParser,
    TrainingBackend,
)


@attrs.frozen
class ComponentKind:
    """One kind of registered component."""

    hook: str
    registry: str
    registration: type[Registration]
    label: str


KINDS: tuple[ComponentKind, ...] = (
    ComponentKind("corerl_register_algorithms", "algorithms", Algorithm, "algorithms"),
    ComponentKind("corerl_register_training_backends", "training_backends", TrainingBackend, "training"),
    ComponentKind("corerl_register_generation_backends", "generation_backends", GenerationBackend, "generation"),
    ComponentKind("corerl_register_sequence_packers", "sequence_packers", SequencePacker, "packers"),
    ComponentKind("corerl_register_offload_policies", "offload_policies", OffloadPolicy, "offload"),
    ComponentKind("corerl_register_tasks", "tasks", Task, "tasks"),
    ComponentKind("corerl_register_rewards", "rewards", Reward, "rewards"),
    ComponentKind("corerl_register_commands", "commands", Command, "commands"),
    ComponentKind("corerl_register_presets", "presets", Preset, "presets"),
    ComponentKind("corerl_register_memory_models", "memory_models", MemoryModel, "memory models"),
    ComponentKind("corerl_register_environments", "environments", Environment, "environments"),
    ComponentKind("corerl_register_tools", "tools", Tool, "tools"),
    ComponentKind("corerl_register_tool_parsers", "tool_parsers", ToolCallParser, "tool parsers"),
    ComponentKind("corerl_register_loggers", "loggers", ExperimentLogger, "loggers"),
)
