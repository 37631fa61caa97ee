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

from corerl.sdk import (
    GIB,
    Layout,
    PlanRequest,
    TrainingMemory,
    activation_bytes,
    adam_state_bytes,
    cluster_overrides,
    tensor_parallel_sizes,
)

BACKEND = "megatron"
DEFAULT_GENERATION_BUFFER = 20 * GIB


class MegatronMemory:
    """TP x PP x DP with the distributed optimizer, with vLLM or megatron generation."""

    def layouts(self, request: PlanRequest) -> list[Layout]:
        if request.shape.vision:  # megatron does not train a vision-language model (corerl_megatron.support)
            return []
        out = []
        for tp in tensor_parallel_sizes(request):
            for pp in range(1, request.shape.layers + 1):
                if request.shape.layers % pp or request.world_size % (tp * pp) or pp > 16:
                    continue
                for generation in ("vllm", "megatron"):
                    for checkpointing in (False, True):
                        out.append(self._layout(request, tp, pp, checkpointing, generation, distributed=True))
        return out

    def _layout(self, request: PlanRequest, tp: int, pp: int, checkpointing: bool, generation: str,
                distributed: bool) -> Layout:
        name = f"TP={tp} PP={pp}" + (" +AC" if checkpointing else "") + ("" if distributed else " (optimizer not distributed)")
        overrides = (*cluster_overrides(request), "policy.training_backend=megatron", "policy.megatron_cfg.enabled=true",
                     f"policy.megatron_cfg.tensor_model_parallel_size={tp}",
                     f"policy.megatron_cfg.pipeline_model_parallel_size={pp}",
                     f"policy.megatron_cfg.optimizer.use_distributed_optimizer={'true' if distributed else 'false'}",
                     f"policy.megatron_cfg.activation_checkpointing={'true' if checkpointing else 'false'}",
                     f"policy.generation.backend={generation}")
        return Layout(BACKEND, name, overrides, tp=tp, pp=pp, dp=request.world_size // (tp * pp),
                      activation_checkpointing=checkpointing, generation=generation)

    def layout_of(self, config: Any, request: PlanRequest) -> Layout:
        s = config.section("policy.megatron_cfg")
        generation = config.core.policy.generation.backend or "vllm"
        return self._layout(request, s.tensor_model_parallel_size, s.pipeline_model_parallel_size,
                            s.activation_checkpointing, "megatron" if generation == "megatron" else "vllm",
                            distributed=s.optimizer.use_distributed_optimizer)

    def stage_parameters(self, request: PlanRequest, tp: int, pp: int) -> int:
        """Parameters of the largest rank: its stage's layers and (first or last stage) the
        embedding or output layer, split over ``tp`` where megatron splits them."""
        shape = request.shape
        layers = shape.layers // pp
        body = layers * (shape.attention_split + shape.mlp) / tp + layers * shape.layer_norms
        if pp == 1:
            return int(body + (shape.embedding + shape.output_layer) / tp + shape.hidden)
        first = shape.embedding / tp
        last = shape.hidden + (shape.embedding if shape.tied else shape.output_layer) / tp  # tied: a copy there
        return int(body + max(first, last))

    def estimate(self, request: PlanRequest, layout: Layout) -> TrainingMemory:
        p = self.stage_parameters(request, layout.tp, layout.pp)
        distributed = "policy.megatron_cfg.optimizer.use_distributed_optimizer=true" in layout.overrides
        optimizer = adam_state_bytes(p, request.precision) / (layout.dp if distributed else 1)
        activations = activation_bytes(request, request.shape.layers, tp=layout.tp,
                                       checkpointing=layout.activation_checkpointing, vocab_split=layout.tp)
        weights = p * request.dtype_bytes
        step_temporary = 0 if fused_adam_installed() else 4 * p / (layout.dp if distributed else 1)
        return TrainingMemory(parameters=weights, gradients=4 * p, optimizer=int(optimizer), activations=activations,
                              reference=weights if request.reference else 0, buffers=int(step_temporary),
                              own_generation=DEFAULT_GENERATION_BUFFER if layout.generation == "megatron" else 0)


@cache
def fused_adam_installed() -> bool:
    """Whether megatron-core finds a fused Adam (Transformer Engine's or apex's), which steps
    without a temporary; looked up (once), not imported, so that ``corerl plan`` stays fast."""
    return find_spec("transformer_engine") is not None or find_spec("apex") is not None
