"""The engine behind ``corerl serve RECIPE``: the recipe's selected training backend builds the base
model, the service's adapter engine trains its many LoRA adapters on it.

The recipe is loaded and selected as ``corerl run`` does (:func:`corerl.config.load_config`, then
:func:`corerl.config.selection.select`: the same priority rules, warnings and one-line refusals,
exit 2). The selected training backend's registration names its ``adapter_model``
(:class:`corerl.registry.TrainingBackend`): ``build(config, model_path)`` returns the base model
built that backend's way (precision, activation checkpointing, wrapping) and the context its
forward passes run under; :class:`~corerl.run.tinker.peft_engine.PeftEngine` holds the adapters on
it (an optimizer and step count each, the Tinker losses, sampling). A backend without one is
refused in one line naming the key that picked it. Sampling is the selected generation backend's
where its registration names an ``adapter_sampler`` (:class:`corerl.registry.GenerationBackend`:
vllm's, one engine on the base model taking each request's adapter), built on the same model
folder in the recipe's ``policy.precision`` for ``max_adapters`` adapters of rank up to
``max_rank``; otherwise (hf) the adapter engine's own, with torch in this process. A line says which.

Without a recipe (``--base-model`` alone) the engine loads the model itself, as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corerl.config.tree import origin_of
from corerl.errors import ConfigError
from corerl.import_paths import resolve


@dataclass
class Opened:
    """The engine and what the command says about it: the base model, its precision, and a line
    per choice (training backend, sampling) and per warning of selection."""

    engine: Any
    base_model: str
    precision: str
    training_backend: str | None = None
    lines: list[str] = field(default_factory=list)
    #: the generation backend sampling the adapters; None: the adapter engine, in this process
    sampling_backend: str | None = None


def select_recipe(config_path: str, overrides: list[str], base_model: str | None = None,
                  precision: str | None = None) -> tuple[Any, Any, Any]:
    """(host, config, selection) of the recipe as ``corerl run`` loads and selects it, ``--base-model``
    and ``--precision`` applied as overrides of ``policy.model_name`` and ``policy.precision``; then
    the selected training backend's ``adapter_model``, or one line refusing the backend."""
    from corerl.config import load_config
    from corerl.config.selection import select
    from corerl.plugin_manager import process_host

    host = process_host()
    extra = [*([f"policy.model_name={base_model}"] if base_model else []),
             *([f"policy.precision={precision}"] if precision else [])]
    config = load_config(config_path, [*overrides, *extra], host)
    selection = select(config, host)
    training = selection.training_backend.registration
    if training.adapter_model is None:
        raise refusal(config, host, training)
    world = config.core.cluster.world_size
    if world != 1:  # an adapter_model builds at world size 1: the service runs in its own process
        raise ConfigError(f"corerl serve runs the {training.id} backend in its own process, one rank, and the recipe "
                          f"asks for {world}", key="cluster.gpus_per_node",
                          source=origin_of("cluster.gpus_per_node", config.origins),
                          hint="set cluster.num_nodes=1 cluster.gpus_per_node=1 for corerl serve")
    return host, config, selection


def refusal(config: Any, host: Any, training: Any) -> ConfigError:
    """One line: the selected training backend serves no adapters, and the key that would select one
    that does (``policy.training_backend``, or the backend's own ``enabled``)."""
    serving = sorted(b.id for b in host.training_backends if b.adapter_model is not None)
    others = f" ({', '.join(serving)})" if serving else " (none is installed)"
    named = config.core.policy.training_backend is not None
    section = training.config_section
    if named or section is None:
        key, change = "policy.training_backend", f"set policy.training_backend to one that serves them{others}"
    else:
        key = f"{section}.enabled"
        change = f"use {key}=false, or set policy.training_backend to one that serves them{others}"
    return ConfigError(f"the {training.id} training backend serves no Tinker adapters (its plugin "
                       f"{training.plugin!r} registers no adapter_model)", key=key,
                       source=origin_of(key, config.origins), hint=change)


#: the adapter rank a sampling engine is sized for unless ``corerl serve --max-lora-rank`` says otherwise
DEFAULT_MAX_RANK = 32


def open_engine(config_path: str, overrides: list[str], *, base_model: str | None, precision: str | None,
                max_adapters: int, work_dir: Path, max_rank: int = DEFAULT_MAX_RANK) -> Opened:
    """The adapter engine for ``corerl serve RECIPE``: selection, then the selected training backend's
    base model under :class:`~corerl.run.tinker.peft_engine.PeftEngine`, sampling with the selected
    generation backend's ``adapter_sampler`` where it registers one."""
    from corerl.run.directory import resolve_policy_model

    _, config, selection = select_recipe(config_path, overrides, base_model, precision)
    training = selection.training_backend.registration
    policy = config.core.policy
    model_path = resolve_policy_model(policy, work_dir)
    build = resolve(training.adapter_model, what="adapter_model",
                    owner=f"training backend {training.id!r} (plugin {training.plugin!r})",
                    hint="install the engine the plugin needs, or pick another backend")
    model, forward_context = build(config, model_path)
    from corerl.run.tinker.peft_engine import PeftEngine

    generation = selection.generation_backend
    sampler = open_sampler(config, generation.registration, model_path, max_adapters, max_rank)
    engine = PeftEngine(policy.model_name, precision=policy.precision, max_adapters=max_adapters,
                        work_dir=work_dir, model=model, model_path=model_path, forward_context=forward_context,
                        sampler=sampler, max_rank=max_rank if sampler is not None else None)
    if sampler is not None:
        sampling = (f"sampling: by generation backend {generation.id} ({generation.reason}), each request with its "
                    f"client's adapter, at most {max_adapters} adapters of rank {max_rank} held at once, in "
                    f"{policy.precision}")
        if not getattr(sampler, "takes_unembed", False):
            sampling += (f"; an adapter on the output projection (train_unembed, the SDK's default) is sampled in "
                         f"this process with torch: {generation.id} takes adapters on the decoder layers only")
    else:
        sampling = (f"sampling: in this process, by the adapter engine with torch in {policy.precision} (generation "
                    f"backend {generation.id} takes no adapter per request: its plugin "
                    f"{generation.registration.plugin!r} registers no adapter_sampler)")
    lines = [*config.warnings, *selection.warnings,
             f"training backend {training.id}: {selection.training_backend.reason}", sampling]
    return Opened(engine, policy.model_name, policy.precision, training.id, lines, generation.id if sampler else None)


def open_sampler(config: Any, generation: Any, model_path: Path, max_adapters: int, max_rank: int) -> Any:
    """The selected generation backend's adapter sampler on ``model_path``, or None where its
    registration names no ``adapter_sampler``."""
    if generation.adapter_sampler is None:
        return None
    build = resolve(generation.adapter_sampler, what="adapter_sampler",
                    owner=f"generation backend {generation.id!r} (plugin {generation.plugin!r})",
                    hint="install the engine the plugin needs, or pick another generation backend")
    return build(config, str(model_path), max_adapters, max_rank)
