"""Every hook corerl calls, in one place (pluggy project name ``corerl``).

Plugins implement these with :data:`corerl.hookimpl`. Each registration hook is called once
per plugin manager with a ``register`` callback; the plugin calls it once per component
it provides. Registration must stay cheap: import heavy engines (torch, vllm, megatron,
deepspeed) in the factory, never at module level or inside the hook.

A registration hook's ``register`` parameter is annotated ``Callable[[<its registration class>],
None]``: that is how the plugin host finds the kind each hook collects (the class carries the rest,
:mod:`corerl.registry`), in the order the hooks are written here. A new kind is its registration
class and its hook spec; nothing else lists the kinds.

The reference for plugin authors is ``docs/plugins.md``; a test keeps the two in step.
"""

from __future__ import annotations

from collections.abc import Callable

import pluggy

from corerl.registry import (
    Algorithm,
    Command,
    DialectSection,
    Environment,
    ExperimentLogger,
    GenerationBackend,
    MemoryModel,
    OffloadPolicy,
    Preset,
    Reward,
    Sandbox,
    SequencePacker,
    Task,
    Tool,
    ToolCallParser,
    TrainingBackend,
)

PROJECT_NAME = "corerl"

#: The plugin contract this corerl offers, ``MAJOR.MINOR`` (docs/plugins.md, "Contract changelog").
#: A plugin states the version it was written against as ``corerl_contract = "2.18"`` in its plugin
#: module; it is loaded when the majors match and its minor is not newer than this one's.
CONTRACT_VERSION = "2.18"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def corerl_register_algorithms(register: Callable[[Algorithm], None]) -> None:
    """Register training algorithms.

    Call ``register(Algorithm(id=..., factory=..., consumes=..., generation=..., critic=...,
    config_section=..., config_schema=...))`` once per algorithm. ``algorithm.name`` names the
    one a recipe runs (default ``grpo``); the core's own are ``sft``, ``grpo``, ``ppo`` and
    ``dpo``. The factory is called with the run's :class:`corerl.run.context.RunContext` and
    returns a :class:`corerl.algorithms.contract.AlgorithmRun`.

    Called when the plugin manager first needs the algorithm registry (``corerl validate``,
    ``corerl run``, ``corerl plugins``).
    """


@hookspec
def corerl_register_training_backends(register: Callable[[TrainingBackend], None]) -> None:
    """Register training backends.

    Call ``register(TrainingBackend(id=..., factory=..., priority=..., config_section=...,
    config_schema=...))`` once per backend. When ``policy.training_backend`` is unset, the
    enabled backend (``<config_section>.enabled: true``) with the highest priority is
    selected; first-party priorities are megatron 300, deepspeed 200, dtensor 100.

    Called when the plugin manager first needs the training-backend registry (``corerl
    validate``, ``corerl run``, ``corerl plugins``).
    """


@hookspec
def corerl_register_generation_backends(register: Callable[[GenerationBackend], None]) -> None:
    """Register generation backends.

    Call ``register(GenerationBackend(id=..., factory=..., config_section=...))`` once per
    backend. ``policy.generation.backend`` names the one to use; unset, ``vllm`` is used
    when installed and ``hf`` otherwise.

    Called when the plugin manager first needs the generation-backend registry.
    """


@hookspec
def corerl_register_sequence_packers(register: Callable[[SequencePacker], None]) -> None:
    """Register sequence-packing algorithms.

    Call ``register(SequencePacker(id=..., factory=...))`` once per algorithm. With
    ``policy.sequence_packing.enabled: true`` the packer named by
    ``policy.sequence_packing.algorithm`` is used.

    Called when the plugin manager first needs the sequence-packer registry.
    """


@hookspec
def corerl_register_offload_policies(register: Callable[[OffloadPolicy], None]) -> None:
    """Register offload policies: what leaves the accelerator between phases, and when.

    Call ``register(OffloadPolicy(id=..., factory=...))`` once per policy.
    ``policy.offload.policy`` names the one to use (default ``none``).

    Called when the plugin manager first needs the offload-policy registry.
    """


@hookspec
def corerl_register_tasks(register: Callable[[Task], None]) -> None:
    """Register tasks: where training prompts, held-out prompts and SFT demonstrations come from.

    Call ``register(Task(id=..., factory=...))`` once per task; ``data.task`` names the one
    to use. The factory receives a :class:`corerl.tasks.TaskContext` (tokenizer, seed, the
    ``data`` section, the reward chosen by ``data.reward`` or None) and returns an object
    with the methods of :class:`corerl.tasks.TaskSource`; a task registered with
    ``provides="preferences"`` feeds DPO instead, with those of
    :class:`corerl.tasks.preferences.PreferenceSource`.

    Called when the plugin manager first needs the task registry.
    """


@hookspec
def corerl_register_rewards(register: Callable[[Reward], None]) -> None:
    """Register reward functions.

    Call ``register(Reward(id=..., factory=...))`` once per function; the factory is the
    function itself (or its import path), called as ``fn(completion: str, example: dict)
    -> float``. ``data.reward`` names one by id, or gives any function by import path
    ``pkg.module:fn`` without a plugin.

    Called when the plugin manager first needs the reward registry.
    """


@hookspec
def corerl_register_commands(register: Callable[[Command], None]) -> None:
    """Register ``corerl`` sub-commands.

    Call ``register(Command(id=..., factory=..., arguments=..., description=...))`` once per
    command: ``factory`` runs it as ``run(args: argparse.Namespace) -> int`` (the exit status),
    ``arguments`` adds its arguments as ``add_arguments(parser)``; both are import paths resolved
    when the command is used, so ``corerl --help`` imports no engine. The megatron plugin
    registers ``convert`` this way.

    Called when the command line is built.
    """


@hookspec
def corerl_register_presets(register: Callable[[Preset], None]) -> None:
    """Register presets: recipe fragments for a training strategy, laid over a recipe with
    ``corerl run --preset NAME`` or named in ``defaults:`` as ``preset:NAME``.

    Call ``register(Preset(id=..., factory=..., description=...))`` once per preset; ``factory``
    names its YAML file (an import path to a ``pathlib.Path``). A preset sets the sections of the
    plugin that registers it (the deepspeed plugin's ``zero3`` sets ``policy.deepspeed_cfg``).

    Called once per process, when a preset is first looked up.
    """


@hookspec
def corerl_register_memory_models(register: Callable[[MemoryModel], None]) -> None:
    """Register memory models: how much each GPU holds in a training backend's layouts, for
    ``corerl plan`` and ``corerl validate``'s fit check.

    Call ``register(MemoryModel(id=..., factory=...))`` with ``id`` the training backend's id;
    ``factory()`` returns an object with the methods of
    :class:`corerl.planning.memory.MemoryModel`: ``layouts(request)`` (the layouts worth
    considering), ``layout_of(config, request)`` (a recipe's own layout) and
    ``estimate(request, layout)`` (per-GPU parameter, gradient, optimizer, activation and
    reference bytes). The core adds the generation engine and ranks the layouts of every
    installed backend together.

    Called when a plan or a fit check first needs the memory models.
    """


@hookspec
def corerl_register_environments(register: Callable[[Environment], None]) -> None:
    """Register environments: what answers each model turn of a multi-turn episode.

    Call ``register(Environment(id=..., factory=..., config_schema=...))`` once per environment;
    ``data.env_name`` names the one a run uses (unset: one turn, scored by the task's reward). The
    factory is called with a :class:`corerl.environments.contract.EnvironmentContext` and returns
    an object whose ``step(episode) -> Turn`` (plain or ``async def``) answers each model turn
    (:class:`corerl.environments.contract.Environment`). Its section is ``env.<id>``; with
    ``env.<id>.num_workers`` > 0 it runs as that many Ray actors. Registered with
    ``plays="agent"``, the object instead has ``play(row, client) -> reward`` and plays each
    episode against corerl's OpenAI-compatible endpoint (:mod:`corerl.environments.agent`).

    Called when the plugin manager first needs the environment registry.
    """


@hookspec
def corerl_register_tools(register: Callable[[Tool], None]) -> None:
    """Register tools that an environment's model may call.

    Call ``register(Tool(id=..., factory=fn, parameters={...json schema...}))`` once per tool; the
    factory is the function, called with the call's arguments as keywords. An environment lists
    the tools it offers in ``env.<id>.tools`` (the built-in ``tools`` environment executes them).

    Called when the plugin manager first needs the tool registry.
    """


@hookspec
def corerl_register_tool_parsers(register: Callable[[ToolCallParser], None]) -> None:
    """Register tool-call parsers: how the calls in a model turn are read.

    Call ``register(ToolCallParser(id=..., factory=parse))`` once per format; ``parse(text)``
    returns a list of :class:`corerl.environments.tools.ToolCall` (a malformed call is one with
    its ``error`` set). The core registers ``hermes`` (Qwen's and Hermes' ``<tool_call>`` JSON).

    Called when the plugin manager first needs the tool-call parser registry.
    """


@hookspec
def corerl_register_loggers(register: Callable[[ExperimentLogger], None]) -> None:
    """Register experiment loggers: where each step's metrics go besides ``metrics.jsonl``.

    Call ``register(ExperimentLogger(id=..., factory=..., config_schema=...))`` once per logger;
    its section is ``logger.<id>`` and ``logger.<id>.enabled`` switches it on. The factory is called
    with a :class:`corerl.reporting.loggers.contract.LoggerContext` once the run directory exists
    and returns an object with ``log(metrics, step)`` and ``close()``. The core registers
    ``tensorboard`` (on by default), ``wandb`` and ``mlflow``.

    Called when the plugin manager first needs the logger registry.
    """


@hookspec
def corerl_register_sandboxes(register: Callable[[Sandbox], None]) -> None:
    """Register sandboxes: where model-written code runs (``env.code.isolation``).

    Call ``register(Sandbox(id=..., factory=..., contained=True, priority=...))`` once per
    sandbox; the factory returns a runner with ``unavailable()`` and ``run(source, *, timeout_s,
    memory_mb, max_processes, files=None)`` returning a :class:`corerl.sdk.SandboxResult`. The core
    registers ``namespaces`` (contained, priority 100) and ``audit`` (not contained: a recipe opts in
    by name). :class:`corerl.testing.sandbox_conformance.SandboxConformance` runs the hostile
    programs a sandbox must contain.

    Called when the plugin manager first needs the sandbox registry (``corerl validate`` and
    ``corerl run`` of a recipe that runs model-written code).
    """


@hookspec
def corerl_register_dialect_sections(register: Callable[[DialectSection], None]) -> None:
    """Register the translation of an engine's section of another framework's recipes.

    Call ``register(DialectSection(id=..., dialect="nemo-rl", sections=("policy.my_cfg", ...),
    backend=..., factory=...))`` once per section; ``factory`` is (or returns) a
    :class:`corerl.sdk.SectionRules`, or a mapping of NeMo RL key -> :class:`corerl.sdk.Rule`. The
    core's dialect (:mod:`corerl.config.dialects.nemo_rl`) translates NeMo RL's shared sections and
    takes an engine's section (``policy.megatron_cfg.*``, ``policy.generation.vllm_cfg.*``) from the
    plugin that registers the engine; a key of a first-party engine's section whose plugin is not
    installed is reported with the line that installs it.

    Called when a recipe in another framework's dialect is first translated.
    """
