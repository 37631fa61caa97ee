"""The dtensor backend's memory model for ``corerl plan`` (see :mod:`corerl.planning.memory`).

What a rank holds, as this backend builds it: the model is loaded in float32 and FSDP2 shards
every parameter over the data-parallel ranks (compute runs in ``policy.precision`` through its
mixed-precision policy, one layer unsharded at a time), so parameters and gradients are 4 bytes
each and AdamW's two moments 8, over ``dp``; tensor parallelism divides the decoder layers'
projections over ``tp`` (the embedding, the output projection and the norms are only sharded by
FSDP). ``cpu_offload`` keeps parameters, gradients and optimizer state on the CPU. With hybrid
sharding (``dp_replicate_size`` > 1) FSDP shards within groups of ``dp / dp_replicate_size``
ranks and replicates over the groups, so the persistent state is divided by that shard size.

A mixture-of-experts model (tensor parallelism refused) adds expert-parallel layouts: the experts
are sharded over ``ep`` and FSDP over the ranks holding the same experts, so the persistent state
per rank is the FSDP-only one; what expert parallelism saves is the layer FSDP unshards to
compute, whose routed experts are divided by ``ep`` (``ModelShape.mlp_split(ep)``): that working
layer (its weights in the compute precision and their gradients before the reduce-scatter) is
counted for MoE models, where one layer's experts are a large share of the model. Layouts of
equal complexity rank by peak memory, so the expert-parallel ones come first.

Context parallelism (``cp`` > 1, tensor and expert parallelism 1) splits each sequence over
``cp`` ranks: a rank keeps the activations and logits of ``seq_length / cp`` positions, and FSDP
shards the persistent state over all ``dp x cp`` ranks. The planner counts ``cp`` as model-parallel
ranks, so such layouts rank after the simpler ones and win where only they fit (long sequences).

What this backend is for (``preference``, NeMo RL's backend guide): under 10B parameters, with the
default engine (vLLM) generating; 10-70B on one node, with the engine's tensor parallelism over
the node (the training layout whichever fits, FSDP spreading the model over the node); a
vision-language model at any size (megatron does not train one).
"""

from __future__ import annotations

from typing import Any

import attrs

from corerl.sdk import (
    Layout,
    PlanRequest,
    Preference,
    TrainingMemory,
    activation_bytes,
    cluster_overrides,
    tensor_parallel_sizes,
)

BACKEND = "dtensor"
SMALL, LARGE = 10e9, 70e9  # the backend guide's sizes (parameters)


@attrs.frozen
class ExpertLayout(Layout):
    """A dtensor layout with its expert-parallel size (1: experts sharded by FSDP only) and its
    hybrid-sharding replicas (``dp_replicate_size``; 1: FSDP over every data-parallel rank)."""

    ep: int = 1
    dp_replicate: int = 1

    @property
    def shard(self) -> int:
        """The ranks FSDP shards the state over: the data- and context-parallel ranks of one replica."""
        return max(1, self.dp * self.cp // self.dp_replicate)


def context_parallel_sizes(request: PlanRequest) -> list[int]:
    """Context-parallel sizes for the request: 1, and powers of two above it that divide the
    world size (a VLM's sequences are not split: 1 alone, see :mod:`corerl_dtensor.support`)."""
    if request.shape.vision:
        return [1]
    sizes, cp = [1], 2
    while cp <= request.world_size and request.world_size % cp == 0:
        sizes.append(cp)
        cp *= 2
    return sizes


def expert_parallel_sizes(request: PlanRequest) -> list[int]:
    """Expert-parallel sizes for the request's model: 1, and for a MoE model every size above 1
    that divides both its routed experts and the world size."""
    shape = request.shape
    if not shape.is_moe:
        return [1]
    return [n for n in range(1, request.world_size + 1) if request.world_size % n == 0 and shape.experts % n == 0]


class DTensorMemory:
    """FSDP2 x tensor parallel (dense models) or x expert parallel (MoE models), with and
    without activation checkpointing."""

    def preference(self, request: PlanRequest) -> Preference | None:
        shape, billions, gpus = request.shape, request.shape.parameters / 1e9, request.gpus_per_node
        if shape.vision:
            return Preference(f"a vision-language model ({billions:.1f}B in its language model): dtensor + vLLM "
                              "(megatron does not train one)", generation_tp=gpus if shape.parameters >= SMALL else None)
        if shape.parameters < SMALL:
            return Preference(f"{billions:.1f}B parameters (< 10B): dtensor + vLLM")
        if shape.parameters <= LARGE and request.nodes == 1:
            return Preference(f"{billions:.1f}B parameters (10-70B) on one node: dtensor + vLLM (TP={gpus})",
                              generation_tp=gpus)
        return None

    def layouts(self, request: PlanRequest) -> list[Layout]:
        sizes = [(1, ep, 1) for ep in expert_parallel_sizes(request)] if request.shape.is_moe else \
            [(tp, 1, 1) for tp in tensor_parallel_sizes(request)
             if tp == 1 or not request.shape.vision]  # no tensor parallelism on a VLM (corerl_dtensor.support)
        sizes += [(1, 1, cp) for cp in context_parallel_sizes(request)[1:]]  # with TP and EP 1 (none for a VLM)
        return [self._layout(request, tp, ep, checkpointing, cp=cp) for tp, ep, cp in sizes
                for checkpointing in (False, True)]

    def _layout(self, request: PlanRequest, tp: int, ep: int, checkpointing: bool, dp_replicate: int = 1,
                cp: int = 1) -> Layout:
        dp = request.world_size // (tp * cp)
        fsdp = f"HSDP {dp_replicate}x{max(1, dp // dp_replicate)}" if dp_replicate > 1 else "FSDP2"
        name = (f"{fsdp} TP={tp}" + (f" EP={ep}" if request.shape.is_moe else "") + (f" CP={cp}" if cp > 1 else "")
                + (" +AC" if checkpointing else ""))
        overrides = (*cluster_overrides(request), "policy.training_backend=dtensor",
                     f"policy.dtensor_cfg.tensor_parallel_size={tp}",
                     *((f"policy.dtensor_cfg.context_parallel_size={cp}",) if cp > 1 else ()),
                     *((f"policy.dtensor_cfg.dp_replicate_size={dp_replicate}",) if dp_replicate > 1 else ()),
                     *((f"policy.dtensor_cfg.expert_parallel_size={ep}",) if request.shape.is_moe else ()),
                     f"policy.dtensor_cfg.activation_checkpointing={'true' if checkpointing else 'false'}")
        return ExpertLayout(BACKEND, name, overrides, tp=tp, dp=dp, activation_checkpointing=checkpointing,
                            cp=cp, ep=ep, dp_replicate=dp_replicate)

    def layout_of(self, config: Any, request: PlanRequest) -> Layout:
        settings = config.section("policy.dtensor_cfg")
        return self._layout(request, settings.tensor_parallel_size, settings.expert_parallel_size,
                            settings.activation_checkpointing, settings.dp_replicate_size,
                            settings.context_parallel_size)

    def estimate(self, request: PlanRequest, layout: Layout) -> TrainingMemory:
        shape = request.shape
        split = shape.layers * (shape.attention_split + shape.mlp)
        shard = layout.shard if isinstance(layout, ExpertLayout) else layout.dp
        per_rank = (split / layout.tp + (shape.parameters - split)) / shard
        working = 0
        if shape.is_moe:  # one layer unsharded to compute, its routed experts divided by ep
            layer = shape.attention_split / layout.tp + shape.mlp_split(getattr(layout, "ep", 1))
            working = int(layer * request.dtype_bytes)
        # a rank holds the activations and logits of its seq_length / cp positions
        own_positions = attrs.evolve(request, seq_length=-(-request.seq_length // layout.cp))
        activations = activation_bytes(own_positions, shape.layers, tp=layout.tp, checkpointing=layout.activation_checkpointing)
        return TrainingMemory(parameters=int(4 * per_rank) + working, gradients=int(4 * per_rank) + working,
                              optimizer=int(8 * per_rank), activations=activations,
                              reference=int(4 * per_rank) if request.reference else 0)
