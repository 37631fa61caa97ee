"""The vLLM engine's memory model for ``corerl plan`` (a generation engine's, see
:class:`corerl.planning.memory.GenerationMemory`).

Colocated with training, vLLM reserves ``gpu_memory_utilization`` of each GPU for its weights and
KV cache (``policy.generation.vllm_cfg``). It serves 16-bit weights, split over its tensor-parallel
size; the plan asks for the smallest size (within a node, dividing the attention and key-value
heads) whose weights take at most half of the engine's share, leaving the rest for the KV cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corerl.sdk import PlanRequest

ENGINE = "vllm"
SECTION = "policy.generation.vllm_cfg"


class VllmMemory:
    """What vLLM takes of each GPU beside a training layout, and the overrides that select it."""

    def share(self, request: PlanRequest) -> int:
        return int(request.generation_memory_fraction * request.gpu_memory)

    def tensor_parallel(self, request: PlanRequest, reserved: int) -> int | None:
        shape = request.shape
        weights = shape.parameters * 2  # vLLM serves 16-bit weights
        tp = 1
        while tp <= request.gpus_per_node:
            if shape.heads % tp == 0 and shape.kv_heads % tp == 0 and weights / tp <= reserved / 2:
                return tp
            tp *= 2
        return None

    def overrides(self, tp: int) -> list[str]:
        return [f"policy.generation.backend={ENGINE}", f"{SECTION}.tensor_parallel_size={tp}"]

    def label(self, tp: int) -> str:
        return f"vLLM TP={tp}"

    def memory_fraction(self, config: Any) -> float | None:
        """``gpu_memory_utilization`` of the recipe's section (a schema instance, or a mapping
        where the section was validated without this plugin)."""
        section = config.section(SECTION)
        if section is None:
            return None
        value = section.get("gpu_memory_utilization") if isinstance(section, Mapping) else \
            getattr(section, "gpu_memory_utilization", None)
        return None if value is None else float(value)
