"""What the dtensor backend refuses for a validated config: called by selection (its registration's
``check_supported``), so ``corerl validate`` refuses what ``corerl run`` would at start-up. Config
logic only: nothing heavy is imported."""

from __future__ import annotations

from typing import Any

from corerl.sdk import (
    Config,
    ConfigError,
    check_expert_parallel,
    check_hf_router,
    check_tensor_parallel,
    model_shape,
)


def check_supported(config: Config) -> None:
    """Refuse, in one line each, the options this platform or this backend cannot run."""
    settings = config.section("policy.dtensor_cfg")
    section = "policy.dtensor_cfg"
    check_context_parallel(config, settings, section)
    check_fp8_training(config, settings, section)
    if settings.sequence_parallel and settings.custom_parallel_plan:
        raise ConfigError(
            "sequence_parallel applies to the built-in plan; a custom_parallel_plan lays out sequences itself",
            key=f"{section}.sequence_parallel", hint="drop one of the two",
        )
    if settings.fsdp_version == 1 and settings.tensor_parallel_size > 1:
        raise ConfigError(
            "fsdp_version 1 (FullyShardedDataParallel) cannot be combined with tensor parallelism",
            key=f"{section}.fsdp_version", hint="use fsdp_version 2 with tensor_parallel_size > 1",
        )
    check_hybrid_shard(settings, section)
    if config.core.policy.lora.enabled and config.role != "critic" and settings.tensor_parallel_size > 1:
        for key in ("sequence_parallel", "custom_parallel_plan"):
            if getattr(settings, key):
                raise ConfigError(f"with LoRA the tensor-parallel plan is the built-in one, adapted to PEFT's wrapped "
                                  f"projections; {key} lays out modules that LoRA has wrapped",
                                  key=f"{section}.{key}", hint=f"unset {key}, or set policy.lora.enabled=false")
    shape = model_shape(config)
    if settings.tensor_parallel_size > 1 and shape is not None and shape.vision:
        raise ConfigError("the dtensor backend's tensor-parallel plan lays out a text decoder's layers; a "
                          "vision-language model trains with FSDP2 over its vision tower and language model",
                          key=f"{section}.tensor_parallel_size",
                          hint="set it to 1 (FSDP2 shards the vision blocks and the decoder layers over the ranks)")
    check_tensor_parallel(config, settings.tensor_parallel_size, f"{section}.tensor_parallel_size")
    if settings.tensor_parallel_size > 1 and shape is not None and shape.is_moe:
        raise ConfigError("the dtensor backend's tensor-parallel plan splits dense MLPs; a mixture-of-experts "
                          "model's experts are split by expert parallelism",
                          key=f"{section}.tensor_parallel_size",
                          hint="set it to 1 and use expert_parallel_size (or the megatron backend for TP x EP)")
    check_expert_parallel_layout(config, settings, section)
    check_hf_router(config, "dtensor", "train on the megatron backend (policy.megatron_cfg.enabled=true)")
    if config.core.policy.precision == "float16":
        raise ConfigError(
            "the dtensor backend trains in float32 or bfloat16", key="policy.precision", hint="use bfloat16",
        )


def check_expert_parallel_layout(config: Config, settings: Any, section: str) -> None:
    """``expert_parallel_size``: the model and world must take it (the SDK's check), and the
    layouts this backend does not combine with it are refused in one line each (tensor
    parallelism is refused for any MoE model before this)."""
    ep = settings.expert_parallel_size
    key = f"{section}.expert_parallel_size"
    check_expert_parallel(config, ep, key)
    if ep == 1:
        return
    refusals = (
        (settings.fsdp_version == 1,
         "expert parallelism shards experts as DTensors, which the legacy FSDP1 wrapper cannot hold",
         "use fsdp_version 2"),
        (config.core.policy.lora.enabled,
         "LoRA adapters on expert-parallel experts are not implemented (PEFT wraps the fused experts as a whole)",
         "set expert_parallel_size=1 with LoRA, or policy.lora.enabled=false"),
        (bool(settings.custom_parallel_plan),
         "a custom_parallel_plan lays out modules itself; expert parallelism applies to the built-in layout",
         "unset custom_parallel_plan"),
    )
    for refused, message, hint in refusals:
        if refused:
            raise ConfigError(message, key=key, hint=hint)


def check_hybrid_shard(settings: Any, section: str) -> None:
    """``dp_replicate_size`` > 1 (HSDP: FSDP2's ``fully_shard`` over a 2-D data-parallel mesh):
    the layouts this backend does not combine with it are refused in one line each."""
    if settings.dp_replicate_size == 1:
        return
    key = f"{section}.dp_replicate_size"
    refusals = (
        (settings.fsdp_version == 1,
         "hybrid sharding (dp_replicate_size > 1) is built with FSDP2's fully_shard over a 2-D mesh; "
         "the legacy FSDP1 wrapper is not",
         "use fsdp_version 2, or set dp_replicate_size=1"),
        (settings.expert_parallel_size > 1,
         "hybrid sharding (dp_replicate_size > 1) is not combined with expert parallelism "
         "(the experts are sharded over their own mesh)",
         "set dp_replicate_size=1 or expert_parallel_size=1"),
    )
    for refused, message, hint in refusals:
        if refused:
            raise ConfigError(message, key=key, hint=hint)


def check_fp8_training(config: Config, settings: Any, section: str) -> None:
    """``fp8_training`` (torchao's float8 linear layers, :mod:`corerl_dtensor.float8`): torchao must
    be installed, and it is not combined with tensor parallelism (its layers need float8 plans of
    their own), FSDP1 or LoRA (PEFT's adapters wrap the linear layers it would swap)."""
    if not settings.fp8_training:
        return
    from importlib.util import find_spec

    key = f"{section}.fp8_training"
    refusals = (
        (find_spec("torchao") is None, "FP8 training runs torchao's float8 linear layers, and torchao is not "
         "installed here", "pip install 'corerl-dtensor[fp8]' (torchao), or turn it off"),
        (settings.tensor_parallel_size > 1, "FP8 training is not combined with tensor parallelism yet (torchao's "
         "float8 layers need float8 tensor-parallel plans)", "set tensor_parallel_size=1, or turn it off"),
        (settings.fsdp_version == 1, "FP8 training shards torchao's float8 layers with FSDP2, not the legacy FSDP1 "
         "wrapper", "use fsdp_version 2"),
        (config.core.policy.lora.enabled, "FP8 training swaps the linear layers PEFT's adapters wrap",
         "turn policy.lora or FP8 training off"),
    )
    for refused, message, hint in refusals:
        if refused:
            raise ConfigError(message, key=key, hint=hint)


def check_context_parallel(config: Config, settings: Any, section: str) -> None:
    """``context_parallel_size`` > 1 (ring attention over the policy's sequences,
    :mod:`corerl_dtensor.context_parallel`): what it is not combined with yet, one line each."""
    if settings.context_parallel_size == 1:
        return
    key = f"{section}.context_parallel_size"
    core = config.core
    shape = model_shape(config)
    refusals = (
        (core.policy.sequence_packing.enabled,
         "context parallelism splits right-padded rows; packed rows (policy.sequence_packing) are not split yet",
         "set policy.sequence_packing.enabled=false"),
        (settings.sequence_parallel,
         "context parallelism splits sequences itself; sequence parallelism would split them again inside the "
         "tensor-parallel regions", "set sequence_parallel=false"),
        (settings.expert_parallel_size > 1,
         "context parallelism is not combined with expert parallelism yet", "set expert_parallel_size=1"),
        (settings.dp_replicate_size > 1,
         "context parallelism is not combined with hybrid sharding (dp_replicate_size > 1) yet",
         "set dp_replicate_size=1"),
        (settings.fsdp_version == 1,
         "context parallelism shards the model with FSDP2 over the data- and context-parallel ranks; the legacy "
         "FSDP1 wrapper is not", "use fsdp_version 2"),
        (shape is not None and shape.vision,
         "context parallelism splits a text decoder's sequences; a vision-language model's image tokens are not "
         "split yet", "set it to 1"),
    )
    for refused, message, hint in refusals:
        if refused:
            raise ConfigError(message, key=key, hint=hint)
