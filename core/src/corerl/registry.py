"""What plugins register, and the registries that hold it.

A plugin's registration hook receives a ``register`` callback and calls it with one of the
registration classes below. The factory is an import path (``"pkg.module:Class"``) or a
callable; it is resolved only when the component is created, so registering imports nothing
heavy.

Each registration class carries the facts of its kind: ``hook`` (the hook spec that collects it,
in :mod:`corerl.hookspecs`), ``registry_name`` (``PluginHost.<registry_name>``, the key in
``corerl plugins --json``), ``kind`` (its name in messages) and ``label`` (its line in the
``corerl plugins`` table). Nothing else lists the kinds: a new kind is its class here (named in
``__all__``) and its hook spec.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Generic, Literal, TypeVar

import attrs

from corerl import import_paths
from corerl.errors import RegistrationError

#: the classes a plugin registers with; ``corerl`` and ``corerl.sdk`` export these names
__all__ = [
    "Algorithm", "Command", "DialectSection", "Environment", "ExperimentLogger", "GenerationBackend", "MemoryModel",
    "OffloadPolicy", "PlotSpec", "Preset", "Reward", "Rule", "Sandbox", "SectionRules", "SequencePacker", "Task",
    "Tool", "ToolCallParser", "TrainingBackend",
]

_ID_PATTERN = re.compile(r"^[a-z][a-z0-9_.-]*$")
_SECTION_PATTERN = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)+$")
_FACTORY_PATTERN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def _check_id(_: Any, attribute: attrs.Attribute, value: str) -> None:
    if not isinstance(value, str) or not _ID_PATTERN.match(value):
        raise RegistrationError(
            f"invalid id {value!r}: use lower-case letters, digits, '_', '.', '-' (starting with a letter)"
        )


def _check_factory(_: Any, attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, str):
        if not _FACTORY_PATTERN.match(value):
            raise RegistrationError(f"invalid factory {value!r}: expected an import path 'package.module:name'")
    elif not callable(value):
        raise RegistrationError(f"invalid factory {value!r}: expected an import path or a callable")


def _check_optional_factory(_: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None:
        _check_factory(_, attribute, value)


def _check_section(_: Any, attribute: attrs.Attribute, value: str | None) -> None:
    if value is not None and not (isinstance(value, str) and _SECTION_PATTERN.match(value)):
        raise RegistrationError(f"invalid config_section {value!r}: expected a dotted key path such as 'policy.my_cfg'")


def _check_schema(_: Any, attribute: attrs.Attribute, value: type | None) -> None:
    if value is not None and not attrs.has(value):
        raise RegistrationError(f"invalid config_schema {value!r}: expected an attrs class")


def _check_priority(_: Any, attribute: attrs.Attribute, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise RegistrationError(f"invalid priority {value!r}: expected an integer")


@attrs.frozen(kw_only=True)
class Registration:
    """One named component a plugin provides.

    ``id`` is what recipes name; ``priority`` breaks ties when several enabled components
    compete (higher wins); ``config_section`` is the dotted key path the component owns
    (for example ``policy.megatron_cfg``) and ``config_schema`` the attrs class that
    validates it; ``factory`` builds the component and may import heavy engines.
    """

    #: the kind's name in messages (``"training backend"``)
    kind: ClassVar[str] = "component"
    #: the hook spec whose ``register`` callback takes this kind (``"corerl_register_training_backends"``)
    hook: ClassVar[str] = ""
    #: the kind's registry: ``PluginHost.registry(name)`` and the key in ``corerl plugins --json``
    registry_name: ClassVar[str] = ""
    #: the kind's label in the ``corerl plugins`` table
    label: ClassVar[str] = ""

    id: str = attrs.field(validator=_check_id)
    factory: str | Callable[..., Any] = attrs.field(validator=_check_factory)
    priority: int = attrs.field(default=0, validator=_check_priority)
    config_section: str | None = attrs.field(default=None, validator=_check_section)
    config_schema: type | None = attrs.field(default=None, validator=_check_schema)
    description: str = ""
    plugin: str = ""
    #: ``check_supported(config)``, an import path or a callable: refuses, in one line, a validated
    #: config this component cannot run here; selection calls it, so ``corerl validate`` refuses
    #: exactly what ``corerl run`` would at start-up
    check_supported: str | Callable[..., Any] | None = attrs.field(default=None, validator=_check_optional_factory)
    #: ``check_inputs(config)``, an import path or a callable (contract 2.17): refuses, in one line
    #: each, what the component needs from this machine that is not there (a database folder, a
    #: server that must answer); ``corerl run`` calls it with the run's other inputs (the model and
    #: data files) and ``corerl validate`` too, unless ``--recipe-only``, which judges the recipe alone
    check_inputs: str | Callable[..., Any] | None = attrs.field(default=None, validator=_check_optional_factory)
    #: other spellings of :attr:`config_section` that recipes may use (e.g. ``policy.dtensor_config``)
    section_aliases: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    #: keys outside :attr:`config_section` that only this component reads (the ``hf`` generation
    #: backend's ``policy.generation.hf_kv_cache``): set while another of its kind is in use, they
    #: are warned about, as its section's keys are
    owned_keys: tuple[str, ...] = attrs.field(default=(), converter=tuple)

    def load(self) -> Callable[..., Any]:
        """Resolve the factory, importing its module now (and whatever engine it needs)."""
        return self._resolve(self.factory, "factory")

    def check(self, config: Any) -> None:
        """Run :attr:`check_supported` on ``config`` (nothing when the registration has none)."""
        if self.check_supported is not None:
            self._resolve(self.check_supported, "check_supported")(config)

    def check_machine(self, config: Any) -> None:
        """Run :attr:`check_inputs` on ``config`` (nothing when the registration has none)."""
        if self.check_inputs is not None:
            self._resolve(self.check_inputs, "check_inputs")(config)

    def _resolve(self, path: str | Callable[..., Any], what: str) -> Callable[..., Any]:
        return import_paths.resolve(path, what=what, owner=f"{self.kind} {self.id!r} (plugin {self.plugin!r})",
                                    hint="install the engine the plugin needs, or pick another backend")

    def create(self, *args: Any, **kwargs: Any) -> Any:
        """Build the component: ``load()`` then call the factory."""
        return self.load()(*args, **kwargs)


@attrs.frozen(kw_only=True)
class TrainingBackend(Registration):
    """A training engine (dtensor, megatron, deepspeed, ...) selected by ``policy.*`` rules.
    ``tensor_parallel_key`` names the key of its section that sets the tensor-parallel size, if
    it has one (``GRPOTrainer.from_pretrained(tensor_parallel_size=...)`` writes it).
    ``value_model`` says it also trains PPO's critic: built from a config with ``role="critic"`` it
    loads a value model and provides :class:`corerl.training.contract.ValueEngine`'s methods
    (a backend without it is refused as PPO's critic, and serves GRPO, SFT and DPO as before).
    ``lora`` says it trains a LoRA adapter with ``policy.lora`` (its ranks wrap the model with PEFT,
    as :class:`corerl.training.rank_worker.RankWorker` does, and its engine has ``adapter_only``,
    ``base_logprobs``, ``adapter_weights`` and ``export_adapter``; see docs/lora.md); a backend
    without it is refused with ``policy.lora.enabled``.
    ``moe`` says it trains mixture-of-experts models (Qwen3-MoE, Mixtral: ``policy.moe`` acts on
    its ranks, see docs/moe.md); a backend without it is refused, in one line, for such a model
    (contract 2.7; a backend written before then takes dense models only, as it always did).
    ``expert_parallel_key`` names the key of its section that sets the expert-parallel size, if it
    has one (the support matrix and ``corerl plan`` read it); ``context_parallel_key`` the key
    that sets the context-parallel size (contract 2.13; the support matrix reads it).
    ``checkpoint_globals`` names what the engine's own checkpoint files may hold besides tensors
    and plain data (``module.name`` globals of their pickles, or ``module.`` prefixes: an enum, a
    loss scaler's plain attributes); a resume refuses any other before the engine reads the files
    (:mod:`corerl.checkpoint_safety`; contract 2.16).
    ``adapter_model``, an import path or a callable (contract 2.18, optional), is
    ``build(config, model_path)``: the base model the Tinker service (``corerl serve RECIPE``,
    docs/serve.md) trains its many LoRA adapters on, built this backend's way from the recipe
    (its precision, activation checkpointing, wrapping) in the calling process (world size 1: the
    service refuses a recipe of more ranks before calling it),
    for the Hugging Face folder ``model_path``. It returns ``(model, forward_context)``: the
    model (a causal LM module on the device it runs on; the service freezes it and adds its
    adapters with PEFT) and a callable with no arguments returning the context manager each of
    the service's forward passes runs under (the backend's autocast, or
    ``contextlib.nullcontext``). A backend without it is refused by ``corerl serve RECIPE`` in
    one line."""

    kind: ClassVar[str] = "training backend"
    hook: ClassVar[str] = "corerl_register_training_backends"
    registry_name: ClassVar[str] = "training_backends"
    label: ClassVar[str] = "training"
    tensor_parallel_key: str | None = None
    expert_parallel_key: str | None = None
    context_parallel_key: str | None = None
    value_model: bool = False
    lora: bool = False
    moe: bool = False
    checkpoint_globals: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    adapter_model: str | Callable[..., Any] | None = attrs.field(default=None, validator=_check_optional_factory)


@attrs.frozen(kw_only=True)
class GenerationBackend(Registration):
    """A generation engine (vllm, hf, megatron, ...) selected by ``policy.generation.backend``.
    ``lora`` says it samples with a LoRA adapter: its engine has ``load_adapter(adapter)`` taking a
    :class:`corerl.lora.weights.AdapterWeights` at each refit (a backend without it is refused
    with ``policy.lora.enabled``). ``moe`` says it samples mixture-of-experts models, their expert
    weights included in each refit (a backend without it is refused for such a model).
    ``adapter_sampler``, an import path or a callable (optional), is
    ``build(config, model_path, max_adapters, max_rank)``: the sampler the Tinker service
    (``corerl serve RECIPE``, docs/serve.md) samples its many LoRA adapters with, when the recipe
    selects this backend; an engine on the Hugging Face folder ``model_path`` in the recipe's
    ``policy.precision``, built in the calling process, holding up to ``max_adapters`` adapters of
    rank up to ``max_rank`` at once. Plain values cross in both directions. The sampler has
    ``max_length`` (an int: prompt plus sampled tokens at most) and
    ``sample(adapter, prompt, num_samples, *, max_tokens, temperature, top_k, top_p, seed,
    stop_tokens, stop_strings, stop_at_eos)``, ``adapter`` a PEFT adapter folder
    (``adapter_config.json`` and ``adapter_model.safetensors``; None: the base model), ``top_k``
    -1 and ``top_p`` 1 for no truncation, ``temperature`` 0 greedy, ``seed`` None for an unseeded
    draw, ``stop_at_eos`` whether the model's end of sequence stops a sample besides ``stop_tokens``
    and ``stop_strings``. It returns ``num_samples`` dicts with ``tokens`` (the sampled ids, a stop
    token included), ``logprobs`` (each token's, from the distribution sampled at ``temperature``)
    and ``stop_reason`` (``"stop"`` or ``"length"``). Optional: ``takes_unembed`` (default False:
    an adapter on the output projection is sampled by the service itself) and ``close()``. The
    service calls ``sample`` one call at a time. A backend without it: the service samples in its
    own process with torch."""

    kind: ClassVar[str] = "generation backend"
    hook: ClassVar[str] = "corerl_register_generation_backends"
    registry_name: ClassVar[str] = "generation_backends"
    label: ClassVar[str] = "generation"
    lora: bool = False
    moe: bool = False
    adapter_sampler: str | Callable[..., Any] | None = attrs.field(default=None, validator=_check_optional_factory)


@attrs.frozen(kw_only=True)
class MemoryModel(Registration):
    """A training backend's memory model for ``corerl plan``: ``id`` is the backend's id and the
    factory, called with no arguments, returns a :class:`corerl.planning.memory.MemoryModel`."""

    kind: ClassVar[str] = "memory model"
    hook: ClassVar[str] = "corerl_register_memory_models"
    registry_name: ClassVar[str] = "memory_models"
    label: ClassVar[str] = "memory models"


@attrs.frozen(kw_only=True)
class SequencePacker(Registration):
    """A packing algorithm selected by ``policy.sequence_packing.algorithm``."""

    kind: ClassVar[str] = "sequence packer"
    hook: ClassVar[str] = "corerl_register_sequence_packers"
    registry_name: ClassVar[str] = "sequence_packers"
    label: ClassVar[str] = "packers"


@attrs.frozen(kw_only=True)
class OffloadPolicy(Registration):
    """What leaves the accelerator between phases, selected by ``policy.offload.policy``."""

    kind: ClassVar[str] = "offload policy"
    hook: ClassVar[str] = "corerl_register_offload_policies"
    registry_name: ClassVar[str] = "offload_policies"
    label: ClassVar[str] = "offload"


@attrs.frozen(kw_only=True)
class Task(Registration):
    """A source of prompts, held-out prompts and (by default) their reward, named by ``data.task``;
    or, with ``provides="preferences"``, of preference pairs for DPO
    (:class:`corerl.tasks.preferences.PreferenceSource`).

    The factory is called as ``factory(context)`` with a :class:`corerl.tasks.TaskContext`.
    """

    kind: ClassVar[str] = "task"
    hook: ClassVar[str] = "corerl_register_tasks"
    registry_name: ClassVar[str] = "tasks"
    label: ClassVar[str] = "tasks"
    provides: Literal["prompts", "preferences"] = "prompts"


@attrs.frozen(kw_only=True)
class Reward(Registration):
    """A reward function named by ``data.reward``: the factory *is* the function,
    ``fn(completion: str, example: dict) -> float``."""

    kind: ClassVar[str] = "reward"
    hook: ClassVar[str] = "corerl_register_rewards"
    registry_name: ClassVar[str] = "rewards"
    label: ClassVar[str] = "rewards"


@attrs.frozen(kw_only=True)
class Command(Registration):
    """A ``corerl`` sub-command: ``id`` is its name, ``factory`` runs it (``run(args) -> int``, the
    exit status) and ``arguments`` (an import path or callable) adds its arguments to its
    ``argparse`` parser; ``description`` is its help line."""

    kind: ClassVar[str] = "command"
    hook: ClassVar[str] = "corerl_register_commands"
    registry_name: ClassVar[str] = "commands"
    label: ClassVar[str] = "commands"
    arguments: str | Callable[..., Any] | None = attrs.field(default=None, validator=_check_optional_factory)

    def add_arguments(self, parser: Any) -> None:
        """Give ``parser`` this command's arguments (importing the plugin module that declares them)."""
        if self.arguments is not None:
            self._resolve(self.arguments, "arguments")(parser)


@attrs.frozen(kw_only=True)
class Preset(Registration):
    """A recipe fragment for a training strategy (``--preset NAME``, ``defaults: preset:NAME``):
    ``factory`` names the YAML file, as an import path to a :class:`pathlib.Path` or a callable
    returning one; ``description`` is its help line."""

    kind: ClassVar[str] = "preset"
    hook: ClassVar[str] = "corerl_register_presets"
    registry_name: ClassVar[str] = "presets"
    label: ClassVar[str] = "presets"

    def path(self) -> Any:
        """The preset's YAML file."""
        target = self.load()
        return target() if callable(target) else target


@attrs.frozen(kw_only=True)
class PlotSpec:
    """How an algorithm's steps appear in ``curves.png``: the metrics drawn on the left panel
    (``title`` names it) and the loss-like metrics drawn beside ``loss`` on the right."""

    metrics: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    title: str = ""
    losses: tuple[str, ...] = attrs.field(default=("loss",), converter=tuple)


@attrs.frozen(kw_only=True)
class Algorithm(Registration):
    """A training algorithm (grpo, ppo, dpo, sft, a third party's), named by ``algorithm.name``.

    What it declares, so that validation, selection and ``corerl plan`` need not import it:

    - ``consumes``: the kind of task it trains on, ``"prompts"`` (prompts with a reward and their
      demonstrations) or ``"preferences"`` (preference pairs); a task that provides the other
      kind is refused at validation;
    - ``generation``: it samples, so a generation backend is selected and started;
    - ``critic``: it trains a value model beside the policy (a second training group, the
      ``critic`` section);
    - ``warm_start``: ``sft.enabled`` runs a supervised phase before it;
    - ``plot``: what ``curves.png`` shows of its steps;
    - ``environments``: its rollout plays episodes against ``data.env_name``'s environment (it
      calls :meth:`corerl.run.context.RunContext.rollout`); a recipe naming an environment for
      an algorithm without it is refused at validation;
    - ``asynchronous``: its step can train from the rollout buffer of ``algorithm.async``
      (:mod:`corerl.asynchronous`); ``algorithm.async.enabled`` is refused for an algorithm
      without it.
    - ``value_model``: it trains a value model in the policy's place (a reward model): the
      policy's training backend is built in the critic role (it must declare ``value_model``)
      from the model with a zero one-label head, and ``final/`` is that value model.

    ``config_section``/``config_schema`` name its own keys (e.g. ``algorithm.reinforce``) and
    ``check_supported(config)`` refuses, in one line, what it cannot run. The factory is called
    as ``factory(context)`` with the run's :class:`corerl.run.context.RunContext` and returns an
    object with the methods of :class:`corerl.algorithms.contract.AlgorithmRun`.
    """

    kind: ClassVar[str] = "algorithm"
    hook: ClassVar[str] = "corerl_register_algorithms"
    registry_name: ClassVar[str] = "algorithms"
    label: ClassVar[str] = "algorithms"
    consumes: Literal["prompts", "preferences"] = "prompts"
    generation: bool = True
    critic: bool = False
    warm_start: bool = True
    plot: PlotSpec = attrs.field(factory=PlotSpec)
    environments: bool = False
    asynchronous: bool = False
    value_model: bool = False


_SECTION_ID_PATTERN = re.compile(r"^[a-z][a-z0-9_]*$")


def _own_section(item: Registration, parent: str, settings: type) -> None:
    """Give ``item`` the section ``<parent>.<id>`` and a schema subclassing ``settings`` (its own
    ``config_schema``, or ``settings`` itself): environments' ``env.<id>``, loggers' ``logger.<id>``."""
    if not _SECTION_ID_PATTERN.match(item.id):
        raise RegistrationError(f"invalid {item.kind} id {item.id!r}: its section is {parent}.<id>, so use lower-case "
                                "letters, digits and '_' (starting with a letter)")
    if item.config_schema is not None and not issubclass(item.config_schema, settings):
        raise RegistrationError(f"{item.kind} {item.id!r}: config_schema {item.config_schema.__name__} must subclass "
                                f"corerl.sdk.{settings.__name__} (every {parent}.<id> section has its keys)")
    expected = f"{parent}.{item.id}"
    if item.config_section not in (None, expected):
        raise RegistrationError(f"{item.kind} {item.id!r}: its section is {expected}, not {item.config_section!r}")
    object.__setattr__(item, "config_section", expected)
    object.__setattr__(item, "config_schema", item.config_schema or settings)


@attrs.frozen(kw_only=True)
class Environment(Registration):
    """An environment (a game, a sandbox, a verifier, a tool-using task), named by ``data.env_name``.

    The factory is called as ``factory(context)`` with a
    :class:`corerl.environments.contract.EnvironmentContext` and returns an object with the
    methods of :class:`corerl.environments.contract.Environment`. Its section is ``env.<id>``
    (set for it): ``num_workers``, ``timeout_s`` and ``max_failure_share`` are every
    environment's keys; ``config_schema``, when given, is a subclass of
    :class:`corerl.environments.contract.EnvironmentSettings` adding the environment's own.

    ``plays="agent"``: the factory builds an agent harness instead, with
    ``play(row, client) -> reward`` run against corerl's OpenAI-compatible endpoint
    (:mod:`corerl.environments.agent`)."""

    kind: ClassVar[str] = "environment"
    hook: ClassVar[str] = "corerl_register_environments"
    registry_name: ClassVar[str] = "environments"
    label: ClassVar[str] = "environments"
    plays: Literal["turns", "agent"] = "turns"

    def __attrs_post_init__(self) -> None:
        from corerl.environments.contract import EnvironmentSettings

        _own_section(self, "env", EnvironmentSettings)


@attrs.frozen(kw_only=True)
class Tool(Registration):
    """A tool an environment's model may call, named in ``env.<id>.tools``: the factory *is* the
    function, called with the call's arguments as keywords; it returns the result (text, or
    anything JSON can write). ``parameters`` is its JSON schema (what a chat template shows the
    model)."""

    kind: ClassVar[str] = "tool"
    hook: ClassVar[str] = "corerl_register_tools"
    registry_name: ClassVar[str] = "tools"
    label: ClassVar[str] = "tools"
    parameters: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class ToolCallParser(Registration):
    """How tool calls are read from a model turn, named by ``env.<id>.tool_parser``: the factory
    *is* the function ``parse(text) -> list[corerl.environments.tools.ToolCall]``."""

    kind: ClassVar[str] = "tool-call parser"
    hook: ClassVar[str] = "corerl_register_tool_parsers"
    registry_name: ClassVar[str] = "tool_parsers"
    label: ClassVar[str] = "tool parsers"


@attrs.frozen(kw_only=True)
class ExperimentLogger(Registration):
    """An experiment logger (TensorBoard, W&B, MLflow), switched on by ``logger.<id>.enabled``.

    The factory is called as ``factory(context)`` with a
    :class:`corerl.reporting.loggers.contract.LoggerContext` and returns an object with
    ``log(metrics, step)`` and ``close()``. Its section is ``logger.<id>``; ``config_schema``, when
    given, subclasses :class:`corerl.reporting.loggers.contract.LoggerSettings` (``enabled``,
    ``optional``) with the logger's own keys."""

    kind: ClassVar[str] = "logger"
    hook: ClassVar[str] = "corerl_register_loggers"
    registry_name: ClassVar[str] = "loggers"
    label: ClassVar[str] = "loggers"

    def __attrs_post_init__(self) -> None:
        from corerl.reporting.loggers.contract import LoggerSettings

        _own_section(self, "logger", LoggerSettings)


@attrs.frozen(kw_only=True)
class Sandbox(Registration):
    """Where model-written code runs (the ``code`` environment, the ``humaneval_tests`` reward),
    named by ``env.code.isolation``.

    The factory, called with no arguments, returns an object with ``unavailable() -> str | None``
    (why it cannot run on this machine, in one line; None when it can) and ``run(source, *,
    timeout_s, memory_mb, max_processes, files=None) ->`` :class:`corerl.sdk.SandboxResult`, with
    the limits and result :func:`corerl.environments.sandbox.run_python` has (docs/security.md).
    ``contained`` says whether it is a boundary against hostile code: ``env.code.isolation=auto``
    (the default) picks the available contained sandbox of highest priority, and never one that
    is not (the core's ``audit`` mode), which a recipe must name itself."""

    kind: ClassVar[str] = "sandbox"
    hook: ClassVar[str] = "corerl_register_sandboxes"
    registry_name: ClassVar[str] = "sandboxes"
    label: ClassVar[str] = "sandboxes"
    contained: bool = True


@attrs.frozen
class Rule:
    """What one key of another framework's recipe (or every key under a ``prefix.*``) becomes in
    corerl's configuration: ``acts`` (its value goes to ``target``, through ``convert`` where the two
    differ), ``inert`` (accepted with ``reason``: no effect in corerl; ``refuse_if`` names the values
    that would change behaviour, ``warn_if`` those accepted with a warning at every run),
    ``refused`` (in one line, ``reason`` saying what corerl does not support) or ``derived``
    (decided together with other keys, by a translation function). Build one with the class
    methods: ``Rule.acts("policy.moe.freeze_router")``, ``Rule.inert(Rule.PERF)``."""

    fate: str
    target: str | None = None
    convert: Callable[[Any], Any] | None = None
    reason: str = ""
    refuse_if: Callable[[Any], bool] | None = None
    warn_if: Callable[[Any], bool] | None = None

    #: an engine's kernel-fusion or memory switch
    PERF: ClassVar[str] = "a kernel-fusion or memory switch of NeMo RL's engines; corerl leaves the choice to the library"
    #: a switch off by default that corerl has no feature for
    OFF: ClassVar[str] = ("a switch NeMo RL leaves off by default; corerl has no such feature, so only false/null is "
                          "accepted")
    #: an engine's environment variables
    ENV: ClassVar[str] = ("corerl sets no environment variables per backend: export them in the shell that starts "
                          "corerl (Ray workers inherit it)")

    @classmethod
    def acts(cls, target: str, convert: Callable[[Any], Any] | None = None, note: str = "") -> Rule:
        """The value goes to corerl's ``target`` (``convert``ed); ``note`` says what the conversion does."""
        return cls("acts", target, convert, reason=note)

    @classmethod
    def inert(cls, reason: str, refuse_if: Callable[[Any], bool] | None = None) -> Rule:
        """Accepted with ``reason``; a value ``refuse_if`` holds for is refused."""
        return cls("inert", reason=reason, refuse_if=refuse_if)

    @classmethod
    def inert_with_warning(cls, reason: str, warn_if: Callable[[Any], bool]) -> Rule:
        """Accepted with ``reason``; a value ``warn_if`` holds for is warned about at every run."""
        return cls("inert", reason=reason, warn_if=warn_if)

    @classmethod
    def refused(cls, reason: str) -> Rule:
        """Refused in one line (a ``prefix.*`` rule: one line for the whole section)."""
        return cls("refused", reason=reason)

    @classmethod
    def derived(cls, what: str = "") -> Rule:
        """Decided together with other keys (a translation function); ``what`` says how, for the guide."""
        return cls("derived", reason=what)

    @staticmethod
    def truthy(value: Any) -> bool:
        """On: a value other than false, null, 0, empty or ``"none"`` (``refuse_if`` of a switch)."""
        return bool(value) and value not in ("none", "None")

    @staticmethod
    def other_than(expected: Any) -> Callable[[Any], bool]:
        """A test for any value but ``expected``."""
        return lambda value: value != expected

    @staticmethod
    def above(limit: int) -> Callable[[Any], bool]:
        """A test for a value above ``limit``."""
        return lambda value: value is not None and value > limit


def _rules_of(value: Any) -> dict[str, Rule]:
    rules = {}
    for key, rule in dict(value).items():
        if isinstance(rule, str):
            rule = Rule.acts(rule)
        if not isinstance(key, str) or not isinstance(rule, Rule):
            raise RegistrationError(f"invalid dialect rule {key!r}: {rule!r}; give a Rule, or a corerl key (it acts)")
        rules[key] = rule
    return rules


@attrs.frozen(kw_only=True)
class SectionRules:
    """What a :class:`DialectSection`'s factory returns: the translation of its section's keys.

    - ``rules``: key (or ``prefix.*``) -> :class:`Rule`; a plain corerl key stands for
      ``Rule.acts(key)``. A key without a rule passes through under its own name, so a section
      that means what the backend's own section means needs rules only for the keys that differ;
    - ``switched``: sections whose keys are all inert while their ``enabled`` is false (``True``:
      ``enabled`` itself acts, it switches the backend);
    - ``unsupported``: sections whose ``enabled: true`` is refused, with why;
    - ``opaque``: mappings taken whole (engine arguments, environment variables);
    - ``frozen_inert``: keys a frozen model's section (NeMo RL's teacher) holds that only training
      or generation read, relative to the section (``my_cfg.optimizer``);
    - ``before(raw, out)``: called before the keys are translated; returns ``{prefix: reason}``,
      sections made inert in this recipe (it may add to ``out.warnings``);
    - ``derived(raw, out)``: called after the core's own translation functions, to decide the
      ``derived`` keys (``out``: :class:`corerl.config.dialects.rules.Translator`);
    - ``claims``: a value switch, recipe key -> the values of it that choose this section's engine
      (``None`` among them: the key unset, the other framework's default). SkyRL's
      ``trainer.strategy``: the dialect gives the key to the one installed section claiming its
      value (that section's own rule for the key applies), makes the keys of the other sections
      claiming the key inert, and refuses a value no installed section claims."""

    rules: dict[str, Rule] = attrs.field(factory=dict, converter=_rules_of)
    switched: dict[str, bool] = attrs.field(factory=dict, converter=dict)
    unsupported: dict[str, str] = attrs.field(factory=dict, converter=dict)
    opaque: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    frozen_inert: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    before: Callable[[dict[str, Any], Any], dict[str, str]] | None = None
    derived: Callable[[dict[str, Any], Any], None] | None = None
    claims: dict[str, tuple[Any, ...]] = attrs.field(
        factory=dict, converter=lambda value: {key: tuple(values) for key, values in dict(value).items()})


def _check_sections(_: Any, attribute: attrs.Attribute, value: tuple[str, ...]) -> None:
    for section in value:
        _check_section(_, attribute, section)


@attrs.frozen(kw_only=True)
class DialectSection(Registration):
    """The translation of an engine's section of another framework's recipes (a dialect,
    :mod:`corerl.config.dialects`), contributed by the plugin that registers the engine: NeMo RL's
    ``policy.megatron_cfg.*`` comes with the megatron plugin. The core's dialect keeps the shared
    sections and asks the installed plugins for the rest.

    ``dialect`` is the dialect's id (``nemo-rl``), ``sections`` the recipe's section prefixes this
    registration owns (``policy.my_cfg``, and ``value.my_cfg`` for the critic's), ``backend`` the
    corerl backend the section's ``enabled: true`` switches on. ``factory``, an import path or a
    callable, is (or returns) a :class:`SectionRules` or a mapping of key -> :class:`Rule`."""

    kind: ClassVar[str] = "dialect section"
    hook: ClassVar[str] = "corerl_register_dialect_sections"
    registry_name: ClassVar[str] = "dialect_sections"
    label: ClassVar[str] = "dialect sections"
    dialect: str = "nemo-rl"
    sections: tuple[str, ...] = attrs.field(default=(), converter=tuple, validator=_check_sections)
    backend: str | None = None

    def section_rules(self) -> SectionRules:
        """The factory's rules (importing the module that holds them)."""
        found = self.load()
        if callable(found) and not isinstance(found, (SectionRules, dict)):
            found = found()
        if isinstance(found, SectionRules):
            return found
        try:
            return SectionRules(rules=found)
        except (TypeError, ValueError) as exc:
            raise RegistrationError(f"{self.kind} {self.id!r} (plugin {self.plugin!r}): its factory gave {found!r}, "
                                    "not SectionRules or a mapping of rules") from exc


R = TypeVar("R", bound=Registration)


class Registry(Generic[R]):
    """The registrations of one kind, keyed by id; refuses a second registration of an id."""

    def __init__(self, cls: type[R]) -> None:
        self.cls = cls
        self.kind = cls.kind
        self._items: dict[str, R] = {}
        self.conflicts: dict[str, list[str]] = {}

    def add(self, item: R, plugin: str) -> R:
        """Record ``item`` as provided by ``plugin``; raise if its id is already taken."""
        if not isinstance(item, self.cls):
            raise RegistrationError(
                f"plugin {plugin!r} passed {type(item).__name__} to the {self.kind} hook; "
                f"register a {self.cls.__name__} there"
            )
        item = attrs.evolve(item, plugin=plugin)
        held = self._items.get(item.id)
        if held is not None:
            self.conflicts.setdefault(item.id, [held.plugin]).append(plugin)
            raise RegistrationError(
                f"{self.kind} {item.id!r} is registered by both plugin {held.plugin!r} and plugin {plugin!r}",
                hint=f"uninstall one of them or disable it with CORERL_DISABLE_PLUGINS={plugin}",
            )
        self._items[item.id] = item
        return item

    def get(self, id: str) -> R | None:
        return self._items.get(id)

    def ids(self) -> list[str]:
        return sorted(self._items)

    def by_plugin(self, plugin: str) -> list[str]:
        return sorted(i.id for i in self._items.values() if i.plugin == plugin)

    def __iter__(self) -> Iterator[R]:
        return iter(sorted(self._items.values(), key=lambda r: (-r.priority, r.id)))

    def __contains__(self, id: object) -> bool:
        return id in self._items

    def __len__(self) -> int:
        return len(self._items)
