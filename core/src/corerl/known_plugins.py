"""The first-party plugins, so that errors can say how to install what a recipe asks for, and
which of their engines the core picks when a recipe names none.

The core never imports these packages; it only knows their names, what they provide, how to
install them from a checkout of the corerl repository, and the defaults below. This is the one
table of first-party engines: no other core module names one.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class KnownPlugin:
    """A first-party plugin package: what it provides and the line that installs it."""

    name: str
    distribution: str
    install: str
    training_backends: tuple[str, ...] = ()
    generation_backends: tuple[str, ...] = ()
    sections: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()
    environments: tuple[str, ...] = ()


FIRST_PARTY: tuple[KnownPlugin, ...] = (
    KnownPlugin(
        "dtensor", "corerl-dtensor", "pip install ./plugins/dtensor",
        training_backends=("dtensor",), sections=("policy.dtensor_cfg",),
    ),
    KnownPlugin(
        "megatron", "corerl-megatron", "pip install ./plugins/megatron",
        training_backends=("megatron",), generation_backends=("megatron",),
        sections=("policy.megatron_cfg", "policy.generation.mcore_generation_config"),
        commands=("convert",),
    ),
    KnownPlugin(
        "deepspeed", "corerl-deepspeed", "pip install ./plugins/deepspeed",
        training_backends=("deepspeed",), sections=("policy.deepspeed_cfg",),
    ),
    KnownPlugin(
        "vllm", "corerl-vllm", "pip install './plugins/vllm_gen[cpu]' (or [gpu] on CUDA machines)",
        generation_backends=("vllm",), sections=("policy.generation.vllm_cfg",),
    ),
    KnownPlugin(
        "sglang", "corerl-sglang", "pip install './plugins/sglang_gen[gpu]' (a GPU machine)",
        generation_backends=("sglang",), sections=("policy.generation.sglang_cfg",),
    ),
    KnownPlugin(
        "skyrl_gym", "corerl-skyrl-gym", "pip install ./plugins/skyrl_gym",
        environments=("skyrl_gym",), sections=("env.skyrl_gym",),
    ),
)


#: the training backend selection picks when no training backend section is enabled
#: (:func:`corerl.config.selection.select_training_backend`)
DEFAULT_TRAINING_BACKEND = "dtensor"
#: the generation backend selection picks when ``policy.generation.backend`` is unset and it is
#: installed (else the core's own ``hf``)
DEFAULT_GENERATION_BACKEND = "vllm"


def provider_of(kind: str, component_id: str) -> KnownPlugin | None:
    """The first-party plugin that provides ``component_id`` of ``kind`` (a kind's name, such as
    ``"training backend"``, or its registry name, such as ``"training_backends"``), if any."""
    from corerl.component_kinds import KINDS

    name = next((k.registry for k in KINDS if kind in (k.registry, k.registration.kind)), kind)
    if name not in attrs.fields_dict(KnownPlugin) or name in ("name", "distribution", "install"):
        return None
    return next((plugin for plugin in FIRST_PARTY if component_id in getattr(plugin, name)), None)


def owner_of_section(path: str) -> KnownPlugin | None:
    """The first-party plugin that owns the config section at ``path``, if any."""
    for plugin in FIRST_PARTY:
        if path in plugin.sections:
            return plugin
    return None
