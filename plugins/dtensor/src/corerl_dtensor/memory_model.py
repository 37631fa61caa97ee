"""The dtensor backend's memory model for ``corerl plan`` (see :mod:`corerl.planning.memory`).

What a rank holds, as this backend builds it: the model is loaded in float32 and FSDP2 shards
every parameter over the data-parallel ranks (compute runs in ``policy.precision`` through its
mixed-precision policy, one layer unsharded at a time), so parameters and gradients are 4 bytes
each and AdamW's two moments 8, over ``dp``; tensor parallelism divides the decoder layers'
projections over ``tp`` (the embedding, the output projection and the norms are only sharded by
FSDP). ``cpu_offload`` keeps parameters, gradients and optimizer state on the CPU.
"""

from __future__ import annotations

from typing import Any

from corerl.sdk import (
    Layout,
    PlanRequest,
    TrainingMemory,
    activation_bytes,
    cluster_overrides,
    tensor_parallel_sizes,
)

BACKEND = "dtensor"


class DTensorMemory:
    """FSDP2 x tensor parallel, with and without activation checkpointing."""

    def layouts(self, request: PlanRequest) -> list[Layout]:
        out = []
        for tp in tensor_parallel_sizes(request):
            for checkpointing in (False, True):
                out.append(self._layout(request, tp, checkpointing))
        return out

    def _layout(self, request: PlanRequest, tp: int, checkpointing: bool) -> Layout:
        name = f"FSDP2 TP={tp}" + (" +AC" if checkpointing else "")
        overrides = (*cluster_overrides(request), "policy.training_backend=dtensor",
                     f"policy.dtensor_cfg.tensor_parallel_size={tp}",
                     f"policy.dtensor_cfg.activation_checkpointing={'true' if checkpointing else 'false'}")
        return Layout(BACKEND, name, overrides, tp=tp, dp=request.world_size // tp,
                      activation_checkpointing=checkpointing)

    def layout_of(self, config: Any, request: PlanRequest) -> Layout:
        settings = config.section("policy.dtensor_cfg")
        return self._layout(request, settings.tensor_parallel_size, settings.activation_checkpointing)

    def estimate(self, request: PlanRequest, layout: Layout) -> TrainingMemory:
        shape = request.shape
        split = shape.layers * (shape.attention_split + shape.mlp)
        per_rank = (split / layout.tp + (shape.parameters - split)) / layout.dp
        activations = activation_bytes(request, shape.layers, tp=layout.tp, checkpointing=layout.activation_checkpointing)
        return TrainingMemory(parameters=int(4 * per_rank), gradients=int(4 * per_rank), optimizer=int(8 * per_rank),
                              activations=activations, reference=int(4 * per_rank) if request.reference else 0)
