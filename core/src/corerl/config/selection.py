"""Which training backend, generation backend, packer and offload policy run, and why.

Training backend, in order:
1. ``policy.training_backend`` names one: that one, or an error listing what is installed
   and how to install the plugin that provides the name;
2. otherwise the enabled sections (``<config_section>.enabled: true``) compete and the
   highest priority wins (megatron 300 > deepspeed 200 > dtensor 100), with a warning per
   backend passed over;
3. none enabled: ``dtensor``.

Generation backend: ``policy.generation.backend``, else ``vllm``, else ``hf``.

The defaults are :data:`corerl.known_plugins.DEFAULT_TRAINING_BACKEND` and
:data:`~corerl.known_plugins.DEFAULT_GENERATION_BACKEND` (the one table of first-party engines).

Task: ``data.task``. Reward: ``data.reward`` as a registered id or an import path
``pkg.module:fn`` (imported now, so a typo fails validation), unset: the task's own.
Environment: ``data.env_name`` (unset: none, one turn per sample).

Then the one validation phase (:func:`select`): each chosen registration's own support check,
and the checks across the chosen components, a table (:mod:`corerl.config.validation`) each
feature fills where it lives: this module imports no feature.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import attrs

from corerl.config import Config
from corerl.config.reward_paths import IMPORT_PATH, import_reward
from corerl.config.structure import suggest
from corerl.config.tree import origin_of
from corerl.config.validation import Chosen, run_checks
from corerl.errors import ConfigError, ConfigErrors, CorerlError, PluginError, SelectionError
from corerl.failures import first_line
from corerl.known_plugins import (
    DEFAULT_GENERATION_BACKEND,
    DEFAULT_TRAINING_BACKEND,
    FIRST_PARTY,
    provider_of,
)
from corerl.models.chat_template import resolve_chat_template
from corerl.plugin_manager import CORE_PLUGIN, PluginHost, version_key
from corerl.registry import Registration, Registry, TrainingBackend

#: the core's own generation backend: what generation falls back to without the default
FALLBACK_GENERATION_BACKEND = "hf"


@attrs.frozen
class Choice:
    """One selected component (``id`` None when the feature is off) and the reason for it."""

    id: str | None
    reason: str
    registration: Registration | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "reason": self.reason}


@attrs.define
class Selection:
    """Everything selected for a config, with the warnings the choice produced."""

    training_backend: Choice
    generation_backend: Choice
    sequence_packer: Choice
    offload_policy: Choice
    task: Choice
    reward: Choice
    reward_fn: Any = None
    warnings: list[str] = attrs.field(factory=list)
    #: the critic's backend (None unless the algorithm trains a critic, as PPO does) and the config it is built from
    critic_backend: Choice | None = None
    critic_config: Any = None
    #: the algorithm ``algorithm.name`` names (its registration declares what else is needed)
    algorithm: Choice = attrs.field(factory=lambda: Choice(None, "no algorithm selected"))
    #: the environment ``data.env_name`` names (id None: one turn, scored by the task's reward)
    environment: Choice = attrs.field(factory=lambda: Choice(None, "data.env_name is unset: one turn per sample"))
    #: whether prompts go through the tokenizer's chat template (``data.apply_chat_template``), and why
    chat_template: Choice = attrs.field(factory=lambda: Choice("off", "data.apply_chat_template is false"))

    @property
    def samples(self) -> bool:
        """Whether the algorithm samples (so a generation backend and an offload policy are used)."""
        registration = self.algorithm.registration
        return registration is None or registration.generation

    def engines(self) -> list[Choice]:
        """The engine backends a run starts: training, the critic's, generation when it samples."""
        used = [self.training_backend, *([self.critic_backend] if self.critic_backend is not None else [])]
        return used + ([self.generation_backend] if self.samples else [])

    def as_dict(self) -> dict[str, Any]:
        critic = {"critic_backend": self.critic_backend.as_dict()} if self.critic_backend is not None else {}
        return {
            "algorithm": self.algorithm.as_dict(),
            "training_backend": self.training_backend.as_dict(),
            **critic,
            "generation_backend": self.generation_backend.as_dict(),
            "sequence_packer": self.sequence_packer.as_dict(),
            "offload_policy": self.offload_policy.as_dict(),
            "task": self.task.as_dict(),
            "reward": self.reward.as_dict(),
            "environment": self.environment.as_dict(),
            "chat_template": self.chat_template.as_dict(),
        }


def _plugin_trouble(host: PluginHost, kind: str, component_id: str) -> tuple[str | None, str | None]:
    """Why a plugin that might provide ``component_id`` is not there: (explanation, status)."""
    known = provider_of(kind, component_id)
    candidates = {component_id} | ({known.name, known.distribution} if known else set())
    for info in host.plugins.values():
        if info.name in candidates or info.distribution in candidates:
            if info.status == "failed":
                return f"plugin {info.name!r} ({info.distribution}) failed to load: {info.error}", "failed"
            if info.status == "disabled":
                return f"plugin {info.name!r} is disabled by CORERL_DISABLE_PLUGINS or CORERL_LOAD_PLUGINS", "disabled"
    failed = [f"{p.name!r} ({p.error})" for p in host.failed_plugins()]
    if failed:
        return "plugins that failed to load and may provide it: " + ", ".join(failed), None
    return None, None


def _unavailable(host: PluginHost, registry: Registry[Any], component_id: str, key: str, config: Config) -> SelectionError:
    kind = registry.kind
    installed = ", ".join(registry.ids()) or "none"
    message = f"{kind} {component_id!r} is not available (installed: {installed})"
    trouble, status = _plugin_trouble(host, kind, component_id)
    if trouble:
        message += f"; {trouble}"
    known = provider_of(kind, component_id)
    if status == "disabled":
        hint = "enable it: take it out of CORERL_DISABLE_PLUGINS, or add it to CORERL_LOAD_PLUGINS"
    elif status == "failed":
        hint = "fix the plugin's error (`corerl plugins` shows it) or reinstall it" + (
            f": {known.install}" if known else ""
        )
    elif known is not None:
        hint = f"install it with: {known.install}"
    else:
        close = suggest(component_id, registry.ids())
        hint = f"did you mean {close!r}?" if close else f"pick one of the installed ids, or install the plugin that provides {component_id!r}"
    return SelectionError(message, key=key, source=origin_of(key, config.origins), hint=hint)


def _lookup(host: PluginHost, registry: Registry[Any], component_id: str, key: str, config: Config) -> Registration:
    if component_id in registry.conflicts:
        plugins = " and ".join(repr(p) for p in registry.conflicts[component_id])
        raise SelectionError(
            f"{registry.kind} {component_id!r} is registered by more than one plugin ({plugins})",
            key=key, source=origin_of(key, config.origins),
            hint=f"disable one with CORERL_DISABLE_PLUGINS={registry.conflicts[component_id][-1]}",
        )
    found = registry.get(component_id)
    if found is None:
        raise _unavailable(host, registry, component_id, key, config)
    return found


def _ids(registry: Registry[Any], flag: str) -> str:
    """The installed ids of ``registry`` whose registration says ``flag``, for a hint."""
    return ", ".join(r.id for r in registry if getattr(r, flag, False)) or "none is installed"


def select_training_backend(config: Config, host: PluginHost) -> tuple[Choice, list[str]]:
    """Apply the training-backend rules; returns the choice and the warnings it produced."""
    registry = host.training_backends
    enabled = [r for r in registry if r.config_section and config.section_enabled(r.config_section)]
    owned = {r.config_section for r in registry}
    for plugin in FIRST_PARTY:
        for path in plugin.sections:
            if plugin.training_backends and path not in owned and config.section_enabled(path):
                raise _unavailable(host, registry, plugin.training_backends[0], f"{path}.enabled", config)
    from corerl.config import unloaded_plugin_sections

    for path, name in unloaded_plugin_sections(host).items():
        if path not in owned and config.section_enabled(path):
            raise _unavailable(host, registry, name, f"{path}.enabled", config)
    explicit = config.core.policy.training_backend
    if explicit is not None:
        chosen = _lookup(host, registry, explicit, "policy.training_backend", config)
        ignored = [r for r in enabled if r.id != chosen.id]
        warnings = [
            f"training backend {r.id!r} is enabled ({r.config_section}.enabled=true) but policy.training_backend "
            f"picks {chosen.id!r}; {r.id!r} is not used"
            for r in ignored
        ]
        reason = f"policy.training_backend names {chosen.id!r}"
        if ignored:
            reason += "; it overrides the enabled " + ", ".join(f"{r.config_section}" for r in ignored)
        return Choice(chosen.id, reason, chosen), warnings
    if enabled:
        top = enabled[0]  # the registry iterates by descending priority
        _lookup(host, registry, top.id, f"{top.config_section}.enabled", config)  # refuses a clashing id
        tied = [r.id for r in enabled[1:] if r.priority == top.priority]
        if tied:
            raise SelectionError(
                f"training backends {', '.join(repr(i) for i in [top.id, *tied])} are all enabled with priority {top.priority}",
                key="policy.training_backend", hint="name one with policy.training_backend=<id>",
            )
        others = enabled[1:]
        reason = f"{top.config_section}.enabled is true and {top.id!r} has the highest priority ({top.priority})"
        if others:
            reason += " over " + ", ".join(f"{r.id!r} ({r.priority}, also enabled)" for r in others)
        warnings = [
            f"training backend {r.id!r} passed over: {r.config_section}.enabled is true but {top.id!r} "
            f"has a higher priority ({top.priority} > {r.priority}); set policy.training_backend to choose"
            for r in others
        ]
        return Choice(top.id, reason, top), warnings
    chosen = _lookup(host, registry, DEFAULT_TRAINING_BACKEND, "policy.training_backend", config)
    reason = f"no training backend section is enabled; {DEFAULT_TRAINING_BACKEND!r} is the default"
    return Choice(chosen.id, reason, chosen), []


def select_critic_backend(config: Config, host: PluginHost, policy: Choice) -> tuple[Choice, Config]:
    """PPO's critic backend: ``critic.training_backend``; else by the rules above over the enabled
    ``critic.<backend>_cfg`` sections; else the policy's. Refuses, in one line, a backend that
    does not train value models. Returns the choice and the critic's config."""
    from corerl.config.critic import critic_config, critic_layout_sections

    critic = config.core.critic
    draft = critic_config(config)
    if critic.training_backend is not None:
        chosen = _lookup(host, host.training_backends, critic.training_backend, "critic.training_backend", draft)
        choice = Choice(chosen.id, f"critic.training_backend names {chosen.id!r}", chosen)
    elif any(draft.section_enabled(path) for path in critic_layout_sections(config).values()):
        picked, _ = select_training_backend(draft, host)
        choice = Choice(picked.id, picked.reason.replace("policy.", "critic."), picked.registration)
    else:
        choice = Choice(policy.id, f"the policy's training backend ({policy.id!r}); critic.training_backend is unset",
                        policy.registration)
    registration = choice.registration
    assert isinstance(registration, TrainingBackend)
    if not registration.value_model:
        raise SelectionError(
            f"training backend {registration.id!r} (plugin {registration.plugin!r}) does not train value models, "
            "which PPO's critic needs", key="critic.training_backend",
            source=origin_of("critic.training_backend", config.origins) or origin_of("algorithm.name", config.origins),
            hint=f"set critic.training_backend to one that does ({_ids(host.training_backends, 'value_model')}), "
                 "or use algorithm.name=grpo")
    return choice, critic_config(config, backend=registration.id)


def select_generation_backend(config: Config, host: PluginHost) -> tuple[Choice, list[str]]:
    """``policy.generation.backend``, else the default when installed, else the core's own."""
    registry = host.generation_backends
    key = "policy.generation.backend"
    explicit = config.core.policy.generation.backend
    if explicit is not None:
        chosen = _lookup(host, registry, explicit, key, config)
        return Choice(chosen.id, f"{key} names {chosen.id!r}", chosen), []
    if DEFAULT_GENERATION_BACKEND in registry:
        chosen = _lookup(host, registry, DEFAULT_GENERATION_BACKEND, key, config)
        return Choice(chosen.id, f"{key} is unset; {chosen.id!r} is the default", chosen), []
    chosen = _lookup(host, registry, FALLBACK_GENERATION_BACKEND, key, config)
    why = _plugin_trouble(host, "generation backend", DEFAULT_GENERATION_BACKEND)[0] or "it is not installed"
    known = provider_of("generation backend", DEFAULT_GENERATION_BACKEND)
    reason = (f"{key} is unset and the default {DEFAULT_GENERATION_BACKEND!r} is not available ({why}); "
              f"falling back to {chosen.id!r}")
    warning = f"generation falls back to {chosen.id!r}: {DEFAULT_GENERATION_BACKEND} is not available" + (
        f" (install it with: {known.install})" if known else ""
    )
    return Choice(chosen.id, reason, chosen), [warning]


def select_sequence_packer(config: Config, host: PluginHost) -> Choice:
    """The packer named by ``policy.sequence_packing.algorithm``, or none when packing is off."""
    packing = config.core.policy.sequence_packing
    if not packing.enabled:
        return Choice(None, "sequence packing is off (policy.sequence_packing.enabled is false)")
    chosen = _lookup(host, host.sequence_packers, packing.algorithm, "policy.sequence_packing.algorithm", config)
    return Choice(chosen.id, f"policy.sequence_packing.algorithm is {chosen.id!r}", chosen)


def select_offload_policy(config: Config, host: PluginHost) -> Choice:
    """The offload policy named by ``policy.offload.policy`` (default ``none``)."""
    policy_id = config.core.policy.offload.policy
    chosen = _lookup(host, host.offload_policies, policy_id, "policy.offload.policy", config)
    return Choice(chosen.id, f"policy.offload.policy is {chosen.id!r}", chosen)


def select_algorithm(config: Config, host: PluginHost) -> Choice:
    """The algorithm named by ``algorithm.name``."""
    chosen = _lookup(host, host.algorithms, config.core.algorithm.name, "algorithm.name", config)
    return Choice(chosen.id, f"algorithm.name is {chosen.id!r}", chosen)


def select_task(config: Config, host: PluginHost, algorithm: Any = None) -> Choice:
    """The task named by ``data.task``; it must provide what ``algorithm`` (a registration)
    consumes."""
    chosen = _lookup(host, host.tasks, config.core.data.task, "data.task", config)
    if algorithm is not None and algorithm.consumes != chosen.provides:
        wanting = [a.id for a in host.algorithms if a.consumes == chosen.provides]
        tasks = [t.id for t in host.tasks if t.provides == algorithm.consumes]
        raise SelectionError(f"task {chosen.id!r} provides {chosen.provides}, and {algorithm.id.upper()} trains on "
                             f"{'preference pairs' if algorithm.consumes == 'preferences' else 'prompts'}",
                             key="data.task", source=origin_of("data.task", config.origins),
                             hint=f"set data.task to one that provides {algorithm.consumes} ({', '.join(tasks)})"
                                  + (f", or algorithm.name to {' or '.join(wanting)}" if wanting else ""))
    return Choice(chosen.id, f"data.task is {chosen.id!r}", chosen)


def select_reward(config: Config, host: PluginHost) -> tuple[Choice, Any]:
    """The reward ``data.reward`` names and the function itself (None: the task's own)."""
    spec = config.core.data.reward
    if spec is None:
        return Choice(None, "data.reward is unset: the task's own reward"), None
    if IMPORT_PATH.match(spec):
        try:
            return Choice(spec, f"data.reward is the import path {spec!r}"), import_reward(spec)
        except ConfigError as exc:
            raise SelectionError(exc.message, key="data.reward", source=origin_of("data.reward", config.origins),
                                 hint=exc.hint) from exc
    chosen = _lookup(host, host.rewards, spec, "data.reward", config)
    return Choice(chosen.id, f"data.reward is {chosen.id!r}", chosen), chosen.load()


def select_environment(config: Config, host: PluginHost, algorithm: Any = None) -> Choice:
    """The environment ``data.env_name`` names (none when unset); the algorithm must play
    episodes (its registration's ``environments``)."""
    name = config.core.data.env_name
    if name is None:
        return Choice(None, "data.env_name is unset: one turn per sample, scored by the task's reward")
    chosen = _lookup(host, host.environments, name, "data.env_name", config)
    if algorithm is not None and not algorithm.environments:
        playing = [a.id for a in host.algorithms if a.environments]
        raise SelectionError(f"algorithm {algorithm.id!r} plays no environment episodes, and data.env_name names "
                             f"{name!r}", key="data.env_name", source=origin_of("data.env_name", config.origins),
                             hint=f"unset data.env_name, or use an algorithm that plays them ({', '.join(playing)})")
    _check_tool_names(config, host, chosen.id)
    return Choice(chosen.id, f"data.env_name is {chosen.id!r}", chosen)


def _check_tool_names(config: Config, host: PluginHost, env_id: str) -> None:
    """The tools and the tool-call parser an environment's section names (``tools``,
    ``tool_parser``, where its schema has them) must be registered."""
    settings = config.section(f"env.{env_id}")
    for index, name in enumerate(getattr(settings, "tools", None) or ()):
        if name not in host.tools:
            key = f"env.{env_id}.tools[{index}]"
            raise SelectionError(f"no tool {name!r} is registered (tools: {', '.join(host.tools.ids()) or 'none'})",
                                 key=key, source=origin_of(key, config.origins),
                                 hint="name a registered tool (corerl plugins lists them)")
    parser = getattr(settings, "tool_parser", None)
    if parser is not None and parser not in host.tool_parsers:
        key = f"env.{env_id}.tool_parser"
        raise SelectionError(f"no tool-call parser {parser!r} is registered (parsers: {', '.join(host.tool_parsers.ids())})",
                             key=key, source=origin_of(key, config.origins), hint="name a registered parser, e.g. hermes")


#: the key that selects each component a support check runs for: the origin of a refusal that
#: names no key of its own
SELECTING_KEYS = {"algorithm": "algorithm.name", "training_backend": "policy.training_backend",
                  "generation_backend": "policy.generation.backend", "offload_policy": "policy.offload.policy",
                  "sequence_packer": "policy.sequence_packing.algorithm", "environment": "data.env_name",
                  "task": "data.task", "reward": "data.reward"}


def with_origin(error: CorerlError, config: Config, fallback_key: str | None = None) -> CorerlError:
    """``error`` with where its key was set (a recipe file, ``override '...'``), as schema errors
    carry it; a refusal naming no key gets the origin of ``fallback_key`` (the selecting key)."""
    key = error.key or fallback_key
    if error.source is None and key:
        error.source = origin_of(key, config.origins)
    return error


@contextmanager
def origins_said(config: Config, fallback_key: str | None = None) -> Iterator[None]:
    """What the block refuses (a :class:`ConfigError`, or several) raised as :class:`ConfigErrors`
    with the origins of their keys."""
    try:
        yield
    except ConfigErrors as exc:
        raise ConfigErrors([with_origin(e, config, fallback_key) for e in exc.errors]) from exc
    except ConfigError as exc:
        raise ConfigErrors([with_origin(exc, config, fallback_key)]) from exc


def support_check(registration: Registration, config: Config, selecting_key: str) -> list[CorerlError]:
    """What ``registration``'s own check (``check_supported``) refuses in ``config``, each with
    its origin (:func:`with_origin`). What this machine lacks (``EngineNotAvailable``, any other
    corerl error) is raised as it is, with its origin; anything else a plugin's check raises is a
    :class:`PluginError` naming the plugin (the core's own: a bug, raised as it is)."""
    try:
        registration.check(config)
    except ConfigErrors as exc:
        return [with_origin(e, config, selecting_key) for e in exc.errors]
    except (ConfigError, SelectionError) as exc:
        return [with_origin(exc, config, selecting_key)]
    except CorerlError as exc:
        with_origin(exc, config, selecting_key)
        raise
    except Exception as exc:
        if registration.plugin in ("", CORE_PLUGIN):
            raise
        raise PluginError(f"raised {first_line(exc)}", plugin=registration.plugin,
                          function=f"{registration.kind} {registration.id!r}: check_supported",
                          hint="a check refuses with corerl.sdk.ConfigError (or EngineNotAvailable) in one line",
                          source=origin_of(selecting_key, config.origins)) from exc
    return []


#: the contract version that gave training batches a vision-language model's images (contract 2.13)
IMAGES_IN_BATCHES = "2.13"


def check_reads_images(config: Config, host: PluginHost, training: Any) -> None:
    """Refuse a vision-language policy on a training backend whose plugin states a contract older
    than 2.13: its batches then hold the images (``pixel_values``, ``image_grid_thw``), which a
    forward of its own would not pass to the model (it would train on the text alone)."""
    from corerl.models.facts import model_shape

    shape = model_shape(config)
    if training is None or shape is None or not shape.vision or _states_images(host, training.plugin):
        return
    info = host.plugins.get(training.plugin)
    stated = info.contract if info is not None else None
    reading = [r.id for r in host.training_backends if _states_images(host, r.plugin)]
    raise ConfigError(f"training backend {training.id!r} (plugin {training.plugin!r}) states contract "
                      f"{stated or 'none'}, older than {IMAGES_IN_BATCHES}, which gave batches a vision-language "
                      f"model's images", key="policy.training_backend",
                      hint=f"use a training backend of contract {IMAGES_IN_BATCHES} or later "
                           f"({', '.join(reading) or 'none is installed'}), or ask its author to pass "
                           f"corerl.sdk.image_inputs(batch, ...) to the forward and state {IMAGES_IN_BATCHES}")


def _states_images(host: PluginHost, plugin: str) -> bool:
    """Whether ``plugin`` is the core or states contract 2.13 or later (its batches hold images)."""
    if plugin == CORE_PLUGIN:
        return True
    info = host.plugins.get(plugin)
    stated = info.contract if info is not None else None
    return stated is not None and version_key(stated) >= version_key(IMAGES_IN_BATCHES)


def unused_keys(config: Config, registry: Any, chosen: Choice, what: str) -> list[str]:
    """One warning per component of ``registry`` other than ``chosen`` whose section (or owned
    keys) the recipe sets: those keys do nothing. A training backend's section that says
    ``enabled`` (either way) is left alone: selection already says why it was passed over."""
    if config.dialect != "corerl":  # a dialect reports what it did with each of its keys itself
        return []
    warnings = []
    for registration in registry:
        if registration.id == chosen.id:
            continue
        sections = [s for s in (registration.config_section, *registration.section_aliases) if s]
        if any(f"{s}.enabled" in config.origins for s in sections):
            continue
        keys = sorted(k for k in config.origins if any(k.startswith(f"{s}.") for s in sections)
                      or k in registration.owned_keys)
        if keys:
            said = (f"{keys[0]} does nothing here: only {what} {registration.id!r} reads it" if len(keys) == 1 else
                    f"{keys[0]} and {len(keys) - 1} more key(s) there do nothing here: only {what} "
                    f"{registration.id!r} reads them")
            warnings.append(f"{said}, and the {what} is {chosen.id!r} ({origin_of(keys[0], config.origins)})")
    return warnings


def choose_chat_template(config: Config) -> Choice:
    """Whether prompts go through the chat template (:func:`corerl.models.chat_template.resolve_chat_template`:
    as the recipe says, or, unset, whether the policy's tokenizer has one, as NeMo RL and TRL do for
    conversational data), as a choice with its reason."""
    chosen, reason = resolve_chat_template(config)
    return Choice("on" if chosen else "off", reason)


def select(config: Config, host: PluginHost) -> Selection:
    """Select every component, then run the one validation phase: each chosen registration's
    own support check (``check_supported``) and the checks across them (the table of
    :mod:`corerl.config.validation`, which the plugins fill, the core's own first). Every selection
    error is raised together, as :class:`ConfigErrors`; so are the support checks' refusals,
    each with the origin of its key (recipe file or ``override '...'``) as schema errors carry
    it. ``EngineNotAvailable`` (what this machine lacks) is raised as it is, with its origin."""
    errors: list[CorerlError] = []
    warnings: list[str] = []
    choices: dict[str, Choice] = {}
    try:
        choices["algorithm"] = select_algorithm(config, host)
    except SelectionError as exc:
        errors.append(exc)
    algorithm = choices["algorithm"].registration if "algorithm" in choices else None
    errors += run_checks(config, Chosen(host, dict(choices)), "algorithm")  # the table's checks of the algorithm
    for name, pick in (
        ("training_backend", select_training_backend),
        ("generation_backend", select_generation_backend),
        ("sequence_packer", select_sequence_packer),
        ("offload_policy", select_offload_policy),
        ("task", lambda config, host: select_task(config, host, algorithm)),
        ("environment", lambda config, host: select_environment(config, host, algorithm)),
    ):
        try:
            result = pick(config, host)
        except SelectionError as exc:
            errors.append(exc)
            continue
        choice, found = result if isinstance(result, tuple) else (result, [])
        choices[name] = choice
        warnings.extend(found)
    reward_fn = None
    try:
        choices["reward"], reward_fn = select_reward(config, host)
    except SelectionError as exc:
        errors.append(exc)
    critic: tuple[Choice | None, Config | None] = (None, None)
    if algorithm is not None and algorithm.critic and "training_backend" in choices:
        try:
            critic = select_critic_backend(config, host, choices["training_backend"])
        except SelectionError as exc:
            errors.append(exc)
    training = choices["training_backend"].registration if "training_backend" in choices else None
    if algorithm is not None and algorithm.value_model and training is not None and not training.value_model:
        errors.append(SelectionError(
            f"training backend {training.id!r} (plugin {training.plugin!r}) does not train value models, which "
            f"algorithm {algorithm.id!r} trains", key="policy.training_backend",
            source=origin_of("algorithm.name", config.origins),
            hint="set policy.training_backend to one that does (corerl plugins lists them)"))
    if errors:
        raise ConfigErrors(errors)
    warnings += unused_keys(config, host.training_backends, choices["training_backend"], "training backend")
    if choices["algorithm"].registration is None or choices["algorithm"].registration.generation:
        warnings += unused_keys(config, host.generation_backends, choices["generation_backend"], "generation backend")
    # the one validation phase: each registration's own check, once (run refuses nothing else at start-up)
    checked = ["algorithm", "training_backend"]
    if choices["algorithm"].registration is None or choices["algorithm"].registration.generation:
        checked += ["generation_backend", "offload_policy"]
    if config.core.policy.sequence_packing.enabled:
        checked.append("sequence_packer")
    checked += [name for name in ("task", "reward", "environment") if choices[name].registration is not None]
    with origins_said(config):
        from corerl.models.facts import check_model_limits

        choices["chat_template"] = choose_chat_template(config)
        check_model_limits(config, choices["algorithm"].registration)
        check_reads_images(config, host, choices["training_backend"].registration)
    checks = [(choices[name].registration, config, SELECTING_KEYS[name]) for name in checked]
    if critic[0] is not None and critic[0].registration is not None:
        checks.append((critic[0].registration, critic[1], "critic.training_backend"))
    refused: list[CorerlError] = []
    for registration, on, key in checks:
        try:
            said = [(e.key, e.message) for e in refused]  # one check shared by several components says it once
            refused += [e for e in (support_check(registration, on, key) if registration is not None else [])
                        if (e.key, e.message) not in said]
        except CorerlError:  # what this machine lacks: said after the refusals of the checks before it
            if refused:
                raise ConfigErrors(refused) from None
            raise
    if refused:
        raise ConfigErrors(refused)
    with origins_said(config):  # the table's checks across the chosen components (LoRA, MoE, placement, ...)
        run_checks(config, Chosen(host, choices), "chosen")
    for name in ("sequence_packer", "offload_policy"):  # what the backends and the algorithm build
        config.components[name] = choices[name].registration
    if critic[1] is not None:
        critic[1].components.update(config.components)
    return Selection(**choices, reward_fn=reward_fn, warnings=warnings, critic_backend=critic[0],
                     critic_config=critic[1])
