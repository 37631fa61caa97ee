"""``policy.dtensor_cfg`` (alias ``policy.dtensor_config``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import attrs

from corerl.sdk import parallel_sizes_divide_world, setting


@attrs.define(kw_only=True)
class DTensorConfig:
    """Settings of the dtensor training backend."""

    enabled: bool = setting(False, help="train with torch's FSDP2/DTensor (the default training backend)")
    tensor_parallel_size: int = setting(1, min=1, help="ranks a layer's weights are split over (the rest shard with FSDP)")
    context_parallel_size: int = setting(1, min=1, help="ranks each sequence is split over (ring attention over load-"
                                         "balanced chunks; FSDP2 shards over them too)")
    sequence_parallel: bool = setting(False, help="split activations along the sequence in tensor-parallel regions")
    activation_checkpointing: bool = setting(False, help="recompute activations in the backward pass (less memory, more compute)")
    cpu_offload: bool = setting(False, help="keep parameters and gradients in CPU memory between uses (FSDP's CPUOffloadPolicy)")
    fp8_training: bool = setting(
        False, help="torchao's float8 training: the decoder's linear layers multiply in FP8 (dynamic tensorwise "
                    "scales, e4m3 forward, e5m2 gradients), the LM head and the weights, gradients and optimizer "
                    "state as before; through torch._scaled_mm, on CPU too (the fp8 extra: pip install "
                    "'corerl-dtensor[fp8]'); not with tensor parallelism, FSDP1 or policy.lora")
    custom_parallel_plan: str | None = setting(None, help="import path of a tensor-parallel plan")
    fsdp_version: Literal[1, 2] = setting(2, help="2: fully_shard (FSDP2); 1: legacy FullyShardedDataParallel")
    expert_parallel_size: int = setting(1, min=1, help="ranks a mixture-of-experts layer's routed experts are split over "
                                        "(tokens sent to their experts by all-to-all; the rest shards with FSDP)")
    dp_replicate_size: int = setting(1, min=1, help="hybrid sharding (HSDP): data-parallel groups the model is replicated "
                                     "over; FSDP shards it within each group of data-parallel ranks / dp_replicate_size "
                                     "and gradients are all-reduced across the groups (1: shard over every data-parallel rank)")

    def check(self, config: Any) -> Iterator[tuple[str, str]]:
        """TP x CP must divide the world size, and so must the expert-parallel size; ``dp_replicate_size`` must divide
        the data-parallel ranks (world / (TP x CP)); the plan's import path may not lead into a module that runs
        commands or code."""
        from corerl.sdk import code_runner_problem

        if self.custom_parallel_plan and (problem := code_runner_problem(self.custom_parallel_plan,
                                                                         wanted="tensor-parallel plan")):
            yield ("custom_parallel_plan", problem)
        yield from parallel_sizes_divide_world(
            # named where it was set: context parallelism alone names its own key
            "context_parallel_size" if self.tensor_parallel_size == 1 else "tensor_parallel_size",
            {"tensor_parallel_size": self.tensor_parallel_size, "context_parallel_size": self.context_parallel_size},
            config,
        )
        world, model_parallel = config.cluster.world_size, self.tensor_parallel_size * self.context_parallel_size
        if world % model_parallel == 0 and (world // model_parallel) % self.dp_replicate_size:
            yield ("dp_replicate_size", f"must divide the data-parallel ranks, world size / (tensor_parallel_size x "
                                        f"context_parallel_size) ({world // model_parallel})")
        yield from parallel_sizes_divide_world(
            "expert_parallel_size", {"expert_parallel_size": self.expert_parallel_size}, config,
        )
        if self.sequence_parallel and self.tensor_parallel_size == 1:
            yield ("sequence_parallel", "needs tensor_parallel_size > 1")
