"""What validation can know of the policy model before anything starts, from its ``config.json``
(or a built-in model's spec) with ``policy.hf_config_overrides`` laid over it: the longest
sequence it takes, whether its heads divide a tensor-parallel size, whether it is a mixture of
experts and how many experts an expert-parallel size must divide. Read once per check, without
torch or transformers; a model that is not local (or not a decoder the shape reader knows) is not
checked here."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

from corerl.errors import ConfigError


def model_shape(config: Any) -> Any | None:
    """The :class:`~corerl.models.shape.ModelShape` of ``policy.model_name`` where it can be read
    here (a built-in model, or a local folder whose ``config.json`` describes a dense decoder);
    None otherwise. The checks of one validation share one read of ``config.json``."""
    name = local_model_name(config)
    try:
        stamp = os.stat(Path(name) / "config.json").st_mtime_ns
    except OSError:
        stamp = None  # a built-in model, or nothing local to read
    overrides = config.core.policy.hf_config_overrides or {}
    return _shape_of(name, stamp, json.dumps(dict(overrides), sort_keys=True, default=str))


def local_model_name(config: Any) -> str:
    """``policy.model_name``, or for a GGUF file (or a packaged model) the Hugging Face folder it
    is converted into, once, in corerl's model cache."""
    from corerl.models.gguf import ensure_converted, gguf_source

    policy = config.core.policy
    source = gguf_source(policy.model_name, policy.gguf_file)
    return policy.model_name if source is None else str(ensure_converted(source))


@functools.lru_cache(maxsize=8)
def _shape_of(name: str, stamp: int | None, overrides: str) -> Any | None:
    """``name``'s shape as its ``config.json`` stood at modification time ``stamp``, with the
    ``overrides`` (JSON) laid over it."""
    from corerl.models.shape import ModelShape

    try:
        return ModelShape.of_model(name, json.loads(overrides))
    except (ConfigError, OSError, ValueError, TypeError, AttributeError):
        return None


def source_of(config: Any) -> str:
    """Where the model's facts were read: its ``config.json``, or the built-in model's spec."""
    name = local_model_name(config)
    return name if name.startswith("builtin:") else f"{name}/config.json"


def tensor_parallel_fits(shape: Any, size: int) -> bool:
    """Whether ``size`` ranks can split the model's attention and key-value heads evenly."""
    return shape.heads % size == 0 and shape.kv_heads % size == 0


def check_tensor_parallel(config: Any, size: int, key: str) -> None:
    """Refuse, at ``key``, a tensor-parallel ``size`` that does not divide the local model's heads."""
    shape = model_shape(config)
    if size > 1 and shape is not None and not tensor_parallel_fits(shape, size):
        fitting = [n for n in range(1, size + 1) if tensor_parallel_fits(shape, n)]
        raise ConfigError(f"{size} ranks cannot split the model's {shape.heads} attention heads and {shape.kv_heads} "
                          f"key-value heads evenly ({source_of(config)})", key=key,
                          hint=f"use one of {', '.join(map(str, fitting))}")


def check_expert_parallel(config: Any, size: int, key: str) -> None:
    """Refuse, at ``key``, an expert-parallel ``size`` above 1 on a dense local model, or one that
    does not divide the model's routed experts or the training world size."""
    if size <= 1:
        return
    world = config.core.cluster.world_size
    if world % size:
        raise ConfigError(f"expert parallelism over {size} ranks does not divide the {world} training ranks",
                          key=key, hint=f"use a divisor of {world}")
    shape = model_shape(config)
    if shape is None:
        return
    if not shape.is_moe:
        raise ConfigError(f"expert parallelism needs a mixture-of-experts model; {source_of(config)} is a dense model "
                          "(no routed experts)", key=key, hint="set it to 1")
    if shape.experts % size:
        fitting = [n for n in range(1, shape.experts + 1) if shape.experts % n == 0 and world % n == 0]
        raise ConfigError(f"{size} ranks cannot hold the model's {shape.experts} experts evenly ({source_of(config)})",
                          key=key, hint=f"use one of {', '.join(map(str, fitting))}")


def check_moe_settings(config: Any) -> None:
    """Refuse router settings (``policy.moe``) that mean nothing for the local model: any of them
    on a dense model, a top-k above the number of experts, and a load-balancing weight with no
    load-balancing loss to weigh."""
    moe = config.core.policy.moe
    if moe.aux_loss_coeff > 0 and moe.load_balancing_type == "none":
        raise ConfigError(f"aux_loss_coeff={moe.aux_loss_coeff} weighs the load-balancing loss, and "
                          "policy.moe.load_balancing_type is 'none'", key="policy.moe.aux_loss_coeff",
                          hint="set policy.moe.load_balancing_type to aux_loss or seq_aux_loss, or remove the key")
    shape = model_shape(config)
    if shape is None:
        return
    if not shape.is_moe:
        for key, value, default in (("router_replay", moe.router_replay, "none"),
                                    ("load_balancing_type", moe.load_balancing_type, "none"),
                                    ("aux_loss_coeff", moe.aux_loss_coeff, 0.0),
                                    ("z_loss_coeff", moe.z_loss_coeff, 0.0),
                                    ("expert_bias", moe.expert_bias, None),
                                    ("expert_bias_update_rate", moe.expert_bias_update_rate, 0.0)):
            if value != default:
                raise ConfigError(f"{key}={value} acts on a mixture-of-experts router; {source_of(config)} is a dense "
                                  "model", key=f"policy.moe.{key}", hint=f"remove the key (default {default})")
        return
    check_expert_bias(config, shape)
    if shape.experts_per_token > shape.experts:
        overridden = "num_experts_per_tok" in (config.core.policy.hf_config_overrides or {})
        raise ConfigError(f"each token is routed to {shape.experts_per_token} experts but the model has "
                          f"{shape.experts} ({source_of(config)})",
                          key="policy.hf_config_overrides.num_experts_per_tok" if overridden else "policy.model_name",
                          hint=f"set num_experts_per_tok to {shape.experts} or less")


def check_expert_bias(config: Any, shape: Any) -> None:
    """Refuse a per-expert router bias (``policy.moe.expert_bias``, ``expert_bias_update_rate``)
    the mixture of experts ``shape`` has no place for, and routing without the bias its router has."""
    moe = config.core.policy.moe
    if shape.router_bias:
        if moe.expert_bias is False:
            raise ConfigError(f"the model's router picks experts with a per-expert bias (e_score_correction_bias in "
                              f"{source_of(config)}); routing without it is not built", key="policy.moe.expert_bias",
                              hint="remove the key (unset: as the model's router)")
        return
    wanted = [(key, value) for key, value in (("expert_bias", moe.expert_bias), ("expert_bias_update_rate",
                                                                                moe.expert_bias_update_rate)) if value]
    if wanted:
        key, value = wanted[0]
        raise ConfigError(f"{key}={value} needs a router with a per-expert bias (GLM-4.5's e_score_correction_bias); "
                          f"{source_of(config)}'s routes by softmax without one, and its Hugging Face layout has no "
                          "place to export one", key=f"policy.moe.{key}",
                          hint="remove the key, or train a model whose router has the bias (e.g. Glm4MoeForCausalLM)")


def check_hf_router(config: Any, backend: str, otherwise: str) -> None:
    """Refuse, for a backend training a transformers model (``backend``: its name, for the line),
    router settings that would not act on a router picking experts by sigmoid scores plus a
    per-expert bias (GLM-4.5's): corerl's router hooks there know the softmax routers (Qwen3-MoE,
    Mixtral) only, and such a backend does not move the bias. ``otherwise`` ends the hint (where
    the settings do act)."""
    shape = model_shape(config)
    if shape is None or not shape.router_bias:
        return
    moe = config.core.policy.moe
    for key, value, default in (("expert_bias_update_rate", moe.expert_bias_update_rate, 0.0),
                                ("router_replay", moe.router_replay, "none"),
                                ("aux_loss_coeff", moe.aux_loss_coeff, 0.0), ("z_loss_coeff", moe.z_loss_coeff, 0.0)):
        if value != default:
            raise ConfigError(f"{key}={value}: the {backend} backend trains {source_of(config)}'s sigmoid router with "
                              "its per-expert bias as transformers runs it, without router losses, replay or bias "
                              "updates", key=f"policy.moe.{key}",
                              hint=f"remove the key, or {otherwise}")


def check_router_replay(config: Any) -> None:
    """Deprecated (contract 2.18), to go in 3.0: it refused r3, which every training backend now
    replays; whether the generation backend reports its experts is the core's validation
    (:func:`corerl.generation.routes.check_routes_reported`). It refuses nothing."""
    import warnings

    warnings.warn("corerl.sdk.check_router_replay is deprecated and refuses nothing since contract 2.18 (r3 is "
                  "served; the core checks the generation backend): remove the call", DeprecationWarning, stacklevel=2)


def check_vision_settings(config: Any, algorithm: Any = None) -> None:
    """Refuse what corerl does not do with a vision-language policy: sequence packing (a packed row
    would hold several rows' images, and Qwen-VL's rotary positions follow each row's images) and
    an ``algorithm`` with a critic (PPO's is a token classifier, which transformers builds for
    text-only models)."""
    shape = model_shape(config)
    if shape is None or not shape.vision:
        return
    if config.core.policy.sequence_packing.enabled:
        raise ConfigError(f"sequence packing does not take a vision-language model's images ({source_of(config)})",
                          key="policy.sequence_packing.enabled",
                          hint="set policy.sequence_packing.enabled=false (policy.dynamic_batching.enabled=true "
                               "also cuts padding)")
    if algorithm is not None and algorithm.critic:
        raise ConfigError(f"algorithm {algorithm.id!r} trains a critic (a token-classification model), which cannot "
                          f"be built from a vision-language model ({source_of(config)})", key="algorithm.name",
                          hint="train a vision-language model with grpo, sft or distillation")


def check_model_limits(config: Any, algorithm: Any = None) -> None:
    """Refuse a ``policy.max_seq_length`` beyond the local model's ``max_position_embeddings``,
    router settings the model cannot take (:func:`check_moe_settings`) and settings a
    vision-language model cannot take with ``algorithm`` (its registration; :func:`check_vision_settings`)."""
    check_moe_settings(config)
    check_vision_settings(config, algorithm)
    shape = model_shape(config)
    longest = config.core.policy.max_seq_length
    if shape is not None and longest > shape.max_positions:
        raise ConfigError(f"{longest} tokens is longer than the model takes (max_position_embeddings "
                          f"{shape.max_positions} in {source_of(config)})",
                          key="policy.max_seq_length", hint=f"set policy.max_seq_length={shape.max_positions} or less")

