"""The megatron backend's memory model for ``corerl plan`` (see :mod:`corerl.planning.memory`).

As this backend builds megatron-core: parameters in ``policy.precision``, fp32 gradient buffers
(``grad_reduce_in_fp32``), Adam's two fp32 moments plus fp32 master copies of 16-bit weights,
divided over the data-parallel ranks by the distributed optimizer. Tensor parallelism divides
every layer's projections and the (vocabulary-parallel) embedding and output layer over ``tp``,
not the norms; pipeline parallelism gives each stage ``layers / pp`` layers, the first stage the
embedding, the last the output layer (a second copy of tied embeddings when ``pp`` > 1). Under
1F1B the first stage keeps up to ``pp`` micro-batches in flight: about one whole model's layers'
activations, over ``tp``. Megatron generation samples with these weights and adds its KV buffer
(``policy.megatron_cfg.generation.buffer_size_gb``).

A mixture of experts adds expert-parallel layouts (``expert_model_parallel_size`` = ``ep``, within
a node, dividing the routed experts and the ranks of a pipeline stage): this backend runs
``expert_tensor_parallel_size`` 1, so a rank holds ``1 / ep`` of each MoE layer's routed experts,
whole (tensor parallelism does not split them; at ``ep`` 1 every rank holds them all), the
attention, shared experts and dense MLPs split over ``tp``, the router whole. The distributed
optimizer shards the dense parameters over the ``dp`` ranks and the experts over the
expert-data-parallel ones (``tp x dp / ep``). megatron-core trains a MoE with tensor parallelism
only with sequence parallelism, which megatron generation refuses, as it refuses expert
parallelism: a MoE's layouts with ``tp`` or ``ep`` above 1 sample with the default engine.

What this backend is for (``preference``, NeMo RL's backend guide): 10-70B parameters on several
nodes, with the default engine (vLLM) generating; over 70B, with megatron generation (a mixture of
experts: with vLLM, which samples with its experts whole while training keeps them split); a
vision-language model is left to dtensor by preference, and its megatron layouts are one pipeline
stage with the default engine (corerl_megatron.training.vision: the tower's features reach the first
stage only; megatron generation reads no images). The vision tower is not counted (as elsewhere).

Where neither Transformer Engine nor apex is installed, megatron-core steps with torch's AdamW,
whose multi-tensor step makes a temporary the size of the second moment (4 bytes a parameter of
the optimizer's shard) while the moments and gradients are live; counted as the backend's working
buffers. Measured on an H200 (76M parameters, fp32, world size 1): CUDA peak 1,507 MiB against
1,223 MiB of state and activations; the temporary (289 MiB) accounts for the rest within 0.3%.
"""

from __future__ import annotations

from functools import cache
from importlib.util import find_spec
from typing import Any

import attrs

from corerl.sdk import (
    GIB,
    Layout,
    PlanRequest,
    Preference,
    TrainingMemory,
    activation_bytes,
    adam_state_bytes,
    cluster_overrides,
    tensor_parallel_sizes,
)

BACKEND = "megatron"
DEFAULT_GENERATION_BUFFER = 20 * GIB
SMALL, LARGE = 10e9, 70e9  # the backend guide's sizes (parameters)


@attrs.frozen
class MegatronLayout(Layout):
    """A megatron layout with its expert-parallel size (1: every rank holds every routed expert)."""

    ep: int = 1


def expert_parallel_sizes(request: PlanRequest, pp: int) -> list[int]:
    """Expert-parallel sizes above 1 for a mixture of experts: powers of two within a node that
    divide the routed experts and the ranks of one pipeline stage (none for a dense model)."""
    shape, sizes, ep = request.shape, [], 2
    if not shape.is_moe:
        return []
    while ep <= request.gpus_per_node:
        if shape.experts % ep == 0 and (request.world_size // pp) % ep == 0:
            sizes.append(ep)
        ep *= 2
    return sizes


class MegatronMemory:
    """TP x PP x DP (x EP for a mixture of experts) with the distributed optimizer, with the
    default engine or megatron generation."""

    def preference(self, request: PlanRequest) -> Preference | None:
        shape, billions = request.shape, request.shape.parameters / 1e9
        if shape.vision or shape.parameters < SMALL or (shape.parameters <= LARGE and request.nodes == 1):
            return None
        experts = " with expert parallelism" if shape.is_moe else ""
        if shape.parameters <= LARGE:
            return Preference(f"{billions:.1f}B parameters (10-70B) on {request.nodes} nodes: megatron{experts} + vLLM")
        if shape.is_moe:  # megatron generation does not split the experts
            return Preference(f"{billions:.1f}B parameters (> 70B), a mixture of experts: megatron{experts} + vLLM")
        return Preference(f"{billions:.1f}B parameters (> 70B): megatron + megatron generation", generation=BACKEND)

    def layouts(self, request: PlanRequest) -> list[Layout]:
        vision = request.shape.vision  # one stage, the default engine (corerl_megatron.training.vision)
        moe = request.shape.is_moe
        out: list[Layout] = []
        for tp in tensor_parallel_sizes(request):
            for pp in range(1, request.shape.layers + 1):
                if request.shape.layers % pp or request.world_size % (tp * pp) or pp > 16 or (vision and pp > 1):
                    continue
                # a MoE with TP needs sequence parallelism, which megatron generation refuses
                for generation in ((None,) if (moe and tp > 1) or vision else (None, BACKEND)):
                    for checkpointing in (False, True):
                        out.append(self._layout(request, tp, pp, checkpointing, generation, distributed=True))
                for ep in expert_parallel_sizes(request, pp):  # megatron generation refuses expert parallelism
                    for checkpointing in (False, True):
                        out.append(self._layout(request, tp, pp, checkpointing, None, distributed=True, ep=ep))
        return out

    def _layout(self, request: PlanRequest, tp: int, pp: int, checkpointing: bool, generation: str | None,
                distributed: bool, ep: int = 1) -> Layout:
        moe = request.shape.is_moe
        name = (f"TP={tp} PP={pp}" + (f" EP={ep}" if ep > 1 else "") + (" +AC" if checkpointing else "")
                + ("" if distributed else " (optimizer not distributed)"))
        overrides = (*cluster_overrides(request), "policy.training_backend=megatron", "policy.megatron_cfg.enabled=true",
                     f"policy.megatron_cfg.tensor_model_parallel_size={tp}",
                     f"policy.megatron_cfg.pipeline_model_parallel_size={pp}",
                     *((f"policy.megatron_cfg.expert_model_parallel_size={ep}",) if moe else ()),
                     *(("policy.megatron_cfg.sequence_parallel=true",) if moe and tp > 1 else ()),
                     f"policy.megatron_cfg.optimizer.use_distributed_optimizer={'true' if distributed else 'false'}",
                     f"policy.megatron_cfg.activation_checkpointing={'true' if checkpointing else 'false'}",
                     *((f"policy.generation.backend={generation}",) if generation else ()))
        return MegatronLayout(BACKEND, name, overrides, tp=tp, pp=pp, dp=request.world_size // (tp * pp),
                              activation_checkpointing=checkpointing, generation=generation, ep=ep)

    def layout_of(self, config: Any, request: PlanRequest) -> Layout:
        s = config.section("policy.megatron_cfg")
        generation = BACKEND if config.core.policy.generation.backend == BACKEND else None
        return self._layout(request, s.tensor_model_parallel_size, s.pipeline_model_parallel_size,
                            s.activation_checkpointing, generation, distributed=s.optimizer.use_distributed_optimizer,
                            ep=getattr(s, "expert_model_parallel_size", 1))

    def stage_split(self, request: PlanRequest, tp: int, pp: int, ep: int = 1) -> tuple[int, int]:
        """Parameters of the largest rank, as (dense, experts): its stage's layers and (first or
        last stage) the embedding or output layer, split over ``tp`` where megatron splits them;
        ``1 / ep`` of its MoE layers' routed experts, whole."""
        shape = request.shape
        layers = shape.layers // pp
        routed = shape.moe_layers * shape.routed_experts / shape.layers  # an average layer's
        router = shape.moe_layers * shape.router / shape.layers if shape.is_moe else 0
        split = shape.attention_split + shape.mlp - routed - router  # attention, dense MLPs, shared experts
        body = layers * split / tp + layers * (shape.layer_norms + router)
        experts = layers * routed / ep
        if pp == 1:
            return int(body + (shape.embedding + shape.output_layer) / tp + shape.hidden), int(experts)
        first = shape.embedding / tp
        last = shape.hidden + (shape.embedding if shape.tied else shape.output_layer) / tp  # tied: a copy there
        return int(body + max(first, last)), int(experts)

    def stage_parameters(self, request: PlanRequest, tp: int, pp: int, ep: int = 1) -> int:
        """Parameters of the largest rank (:meth:`stage_split`'s two parts together)."""
        return sum(self.stage_split(request, tp, pp, ep))

    def estimate(self, request: PlanRequest, layout: Layout) -> TrainingMemory:
        ep = getattr(layout, "ep", 1)
        dense, experts = self.stage_split(request, layout.tp, layout.pp, ep)
        p = dense + experts
        distributed = "policy.megatron_cfg.optimizer.use_distributed_optimizer=true" in layout.overrides
        # the distributed optimizer shards the dense parameters over dp, the experts over tp x dp / ep
        dense_shard = layout.dp if distributed else 1
        expert_shard = max(1, layout.tp * layout.dp // ep) if distributed else 1
        optimizer = (adam_state_bytes(dense, request.precision) / dense_shard
                     + adam_state_bytes(experts, request.precision) / expert_shard)
        activations = activation_bytes(request, request.shape.layers, tp=layout.tp,
                                       checkpointing=layout.activation_checkpointing, vocab_split=layout.tp)
        weights = p * request.dtype_bytes
        step_temporary = 0 if fused_adam_installed() else 4 * dense / dense_shard + 4 * experts / expert_shard
        return TrainingMemory(parameters=weights, gradients=4 * p, optimizer=int(optimizer), activations=activations,
                              reference=weights if request.reference else 0, buffers=int(step_temporary),
                              own_generation=DEFAULT_GENERATION_BUFFER if layout.generation == BACKEND else 0)


@cache
def fused_adam_installed() -> bool:
    """Whether megatron-core finds a fused Adam (Transformer Engine's or apex's), which steps
    without a temporary; looked up (once), not imported, so that ``corerl plan`` stays fast."""
    return find_spec("transformer_engine") is not None or find_spec("apex") is not None
