"""How the dtensor backend lays a Hugging Face causal LM over its device mesh.

One function per technique, applied in this order: tensor parallel (DTensor plans), expert
parallel (:mod:`corerl_dtensor.expert_parallel`), activation checkpointing, then FSDP2
(``fully_shard`` per decoder layer, then the root; over a 2-D mesh for hybrid sharding) or the
legacy FSDP1 wrapper.

A Qwen-VL vision-language model (``model.model.visual`` beside ``model.model.language_model``)
is sharded the same way, its vision tower too: one unit per vision block, one for the rest of
the tower (patch embedding, position embedding, mergers), one per language decoder layer, then
the root. Under FSDP every rank must run every unit's forward in the same order (each is an
all-gather), so a rank whose micro-batch holds no image runs the vision tower on a blank one
(:func:`run_vision_on_every_rank`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from corerl.sdk import run_vision_on_every_rank, vision_tower
from corerl_dtensor.decoder import decoder_layers
from corerl_dtensor.expert_parallel import apply_expert_parallel, shard_experts_fsdp2


def vision_blocks(model: nn.Module) -> list[nn.Module]:
    """The vision tower's transformer blocks (``visual.blocks``); none for a text-only model."""
    blocks = getattr(vision_tower(model), "blocks", None)
    return list(blocks) if isinstance(blocks, nn.ModuleList) else []


def default_tp_plan() -> dict[str, Any]:
    """Llama/Qwen2 decoder layer: q/k/v/gate/up split by output features, o/down by input features."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(),
    }


def lora_tp_plan(plan: dict[str, Any]) -> dict[str, Any]:
    """``plan`` for layers whose projections PEFT wrapped with a LoRA adapter (``base_layer``,
    ``lora_A``, ``lora_B``): a column-split projection splits its base and B by output features (A,
    rank-wide, is replicated); a row-split one splits its base and A by input features (their
    outputs summed over the ranks) and B is replicated. The adapter's output is then laid out as
    the base's, and PEFT adds the two as it does unsplit."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    out: dict[str, Any] = {}
    for path, style in plan.items():
        if not isinstance(style, (ColwiseParallel, RowwiseParallel)):
            out[path] = style
            continue
        split = "lora_B" if isinstance(style, ColwiseParallel) else "lora_A"
        out[f"{path}.base_layer"] = style
        out[f"{path}.{split}.default"] = type(style)()
    return out


def sequence_parallel_tp_plan() -> dict[str, Any]:
    """The decoder-layer plan with sequence parallelism: norms and residuals sharded on the
    sequence dimension, gathered before attention and MLP, reduce-scattered after."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    plan = default_tp_plan()
    plan.update({
        "input_layernorm": SequenceParallel(),
        "self_attn": PrepareModuleInput(
            input_kwarg_layouts={"hidden_states": Shard(1)}, desired_input_kwarg_layouts={"hidden_states": Replicate()}
        ),
        "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
        "post_attention_layernorm": SequenceParallel(),
        "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
    })
    return plan


def apply_tensor_parallel(
    model: nn.Module, tp_mesh: Any, custom_plan: Any | None = None, sequence_parallel: bool = False
) -> None:
    """Shard projections over ``tp_mesh`` (and, with ``sequence_parallel``, the residual stream).

    ``custom_plan`` (from ``custom_parallel_plan``) is either a dict ``{module path: ParallelStyle}``
    applied to the whole model, or a callable ``plan(model, tp_mesh)`` that parallelizes it itself.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        PrepareModuleInput,
        PrepareModuleOutput,
        parallelize_module,
    )

    if callable(custom_plan):
        custom_plan(model, tp_mesh)
        return
    if isinstance(custom_plan, dict):
        parallelize_module(model, tp_mesh, custom_plan)
        return
    config = model.config
    tp = tp_mesh.size()
    for name in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(config, name)
        if heads % tp:
            raise ValueError(f"{name}={heads} of the model is not divisible by tensor_parallel_size={tp}")
    layers = decoder_layers(model)
    plan = sequence_parallel_tp_plan() if sequence_parallel else default_tp_plan()
    if hasattr(model, "disable_adapter"):  # a LoRA policy (sequence parallelism is refused with it)
        plan = lora_tp_plan(plan)
    for layer in layers:
        parallelize_module(layer, tp_mesh, plan)
    if sequence_parallel:
        # The residual stream enters the first layer sequence-sharded and leaves the last one whole.
        parallelize_module(layers[0], tp_mesh, PrepareModuleInput(
            input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=False))
        parallelize_module(layers[-1], tp_mesh, PrepareModuleOutput(
            output_layouts=Shard(1), desired_output_layouts=Replicate(), use_local_output=True))


def apply_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each decoder layer's activations in backward (non-reentrant checkpoint wrapper)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
    )

    layers = decoder_layers(model)
    for index, layer in enumerate(layers):
        layers[index] = checkpoint_wrapper(layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT)


def apply_fsdp2(model: nn.Module, dp_mesh: Any, param_dtype: torch.dtype, cpu_offload: bool,
                experts: list[nn.Module] | None = None, edp_mesh: Any = None) -> None:
    """``fully_shard`` each decoder layer, then the root (which holds embeddings, norm, head).
    Expert-parallel ``experts`` are sharded first over ``edp_mesh`` (the ranks holding the same
    experts), so each layer's unit leaves them to theirs. A vision-language model's vision tower
    is sharded first: each of its blocks, then the tower (a frozen tower's units hold frozen
    parameters only, so they reduce no gradients)."""
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
    )

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    offload = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if cpu_offload else OffloadPolicy()
    if experts:
        shard_experts_fsdp2(experts, edp_mesh, mp, offload)
    visual = vision_tower(model)
    if visual is not None:
        for block in vision_blocks(model):
            fully_shard(block, mesh=dp_mesh, mp_policy=mp, offload_policy=offload)
        fully_shard(visual, mesh=dp_mesh, mp_policy=mp, offload_policy=offload)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=dp_mesh, mp_policy=mp, offload_policy=offload)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, offload_policy=offload)


def apply_fsdp1(model: nn.Module, param_dtype: torch.dtype, cpu_offload: bool, device: torch.device) -> nn.Module:
    """The legacy ``FullyShardedDataParallel`` wrapper, one unit per decoder layer (and per vision
    block, and the vision tower, of a vision-language model); returns the wrapper."""
    from torch.distributed.fsdp import CPUOffload, MixedPrecision
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    layer_types = {type(layer) for layer in [*decoder_layers(model), *vision_blocks(model)]}
    visual = vision_tower(model)
    if visual is not None:
        layer_types.add(type(visual))
    mixed = None
    if param_dtype != torch.float32:
        mixed = MixedPrecision(param_dtype=param_dtype, reduce_dtype=torch.float32, buffer_dtype=param_dtype)
    return FSDP(
        model,
        auto_wrap_policy=ModuleWrapPolicy(layer_types),
        mixed_precision=mixed,
        cpu_offload=CPUOffload(offload_params=cpu_offload),
        device_id=device,
        use_orig_params=True,
    )


def data_parallel_mesh(mesh: Any) -> Any:
    """The mesh FSDP2 shards over: the 1-D ``dp`` axis, or with ``dp_replicate_size`` > 1 the 2-D
    ``(dp_replicate, dp_shard)`` one, which ``fully_shard`` takes as HSDP (parameters sharded over
    ``dp_shard`` and replicated over ``dp_replicate``; gradients reduce-scattered within a shard
    group, then all-reduced across the replicas)."""
    names = mesh.mesh_dim_names or ()
    return mesh["dp_replicate", "dp_shard"] if "dp_replicate" in names else mesh["dp"]


def parallelize(model: nn.Module, mesh: Any, settings: Any, param_dtype: torch.dtype,
                device: torch.device, expert_mesh: Any = None) -> tuple[nn.Module, bool, bool]:
    """``model`` with the recipe's parallelisms applied in order (after torchao's float8 linear
    layers where ``fp8_training``, :mod:`corerl_dtensor.float8`): tensor parallelism over the
    mesh's ``tp`` axis, expert parallelism over ``expert_mesh``'s ``ep`` axis (where given),
    activation checkpointing, then FSDP2 (or FSDP1) over ``dp`` (FSDP2 as HSDP over
    ``(dp_replicate, dp_shard)`` where ``dp_replicate_size`` > 1); a vision-language model's tower
    then runs on every rank in every forward pass (:func:`run_vision_on_every_rank`). Returns (the
    model, whether forward passes need autocast to ``param_dtype``, whether it is FSDP1)."""
    if getattr(settings, "fp8_training", False):  # before FSDP2 wraps the layers (torchao's float8 linear layers shard as any)
        from corerl_dtensor.float8 import apply_float8_training

        apply_float8_training(model)
    if mesh is not None and settings.tensor_parallel_size > 1:
        from corerl.sdk import resolve

        plan = resolve(settings.custom_parallel_plan) if settings.custom_parallel_plan else None
        apply_tensor_parallel(model, mesh["tp"], plan, settings.sequence_parallel)
    experts: list[nn.Module] = []
    if expert_mesh is not None:
        experts = apply_expert_parallel(model, expert_mesh["ep"])
    if settings.activation_checkpointing:
        apply_activation_checkpointing(model)
    if mesh is None:  # world size 1: plain module, autocast where the compute dtype is not float32
        return model, param_dtype != torch.float32, False
    run_vision_on_every_rank(model)  # sharded: every rank runs every unit's forward, images or not
    if settings.fsdp_version == 2:
        apply_fsdp2(model, data_parallel_mesh(mesh), param_dtype, settings.cpu_offload,
                    experts, expert_mesh["edp"] if expert_mesh is not None else None)
        return model, False, False
    return apply_fsdp1(model, param_dtype, settings.cpu_offload, device), False, True


def fsdp1_full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full weights of an FSDP1 model on rank 0 (torch's generic full-state-dict path
    crashes FSDP1 on CPU; this is FSDP1's own)."""
    import warnings

    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with warnings.catch_warnings():  # "state_dict_type is being deprecated": still FSDP1's own way
        warnings.simplefilter("ignore", FutureWarning)
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=True)):
            return model.state_dict()
