"""The deepspeed backend's memory model for ``corerl plan`` (see :mod:`corerl.planning.memory`).

As this backend drives DeepSpeed: the module's parameters and gradients in ``policy.precision``,
and the optimizer's fp32 master partition plus Adam's two moments (12 bytes a parameter, kept in
fp32 runs too), data parallel over every rank. ZeRO-1 partitions the optimizer state over the
ranks, ZeRO-2 the gradients as well (the reduced partitions are what a step keeps), ZeRO-3 the
parameters too; ``offload_optimizer=cpu`` moves the optimizer state to the CPU and
``offload_param=cpu`` (ZeRO-3) the parameters.

Every stage also holds working buffers beyond that state. ZeRO-1 and ZeRO-2 reduce gradients
through one contiguous bucket of ``reduce_bucket_size`` elements in the gradients' dtype
(``contiguous_gradients``, on by default), allocated whole in the first backward pass even where
the model is smaller. Measured on an H200 (the same 76M model, fp32, world size 1, the second step
so that Adam's moments exist): a bare DeepSpeed engine peaks at 3,420 MiB at both stages, during the
backward pass (scripts/probe_zero_memory.py), corerl's step at 3,498 (ZeRO-1) and 3,705 MiB (ZeRO-2);
state, activations and the bucket (1,907 MiB) come to 3,419 MiB (ratios 0.98 and 0.92).
ZeRO-3's buffers: the gradient reduce bucket
(``reduce_bucket_size`` elements, allocated whole up front) and, during a step, the full parameters
it gathers for the forward and their full gradients before they are reduced. Measured on an H200
(76M parameters, fp32, world size 1): CUDA peak 3,992 MiB against 1,511 MiB of state and activations;
the bucket (1,907 MiB) and twice the parameters (577 MiB) account for the rest within 0.2%. The
estimate uses DeepSpeed's defaults (a bucket of 5e8 elements, at most 1e9 live parameters); a
``policy.deepspeed_cfg.config`` that changes them is not read here.
"""

from __future__ import annotations

from typing import Any

from corerl.sdk import Layout, PlanRequest, TrainingMemory, activation_bytes, cluster_overrides

BACKEND = "deepspeed"
REDUCE_BUCKET_ELEMENTS = 500_000_000  # DeepSpeed's default reduce_bucket_size
MAX_LIVE_PARAMETERS = 1_000_000_000  # DeepSpeed's default stage3_max_live_parameters


class DeepSpeedMemory:
    """ZeRO stages 1-3, with the optimizer (and, at stage 3, the parameters) offloaded or not."""

    def layouts(self, request: PlanRequest) -> list[Layout]:
        out = []
        for stage in (1, 2, 3):
            for offload_optimizer in (False, True):
                for offload_param in ((False, True) if stage == 3 and offload_optimizer else (False,)):
                    out.append(self._layout(request, stage, offload_optimizer, offload_param))
        return out

    def _layout(self, request: PlanRequest, stage: int, offload_optimizer: bool, offload_param: bool) -> Layout:
        name = f"ZeRO-{stage}" + (" +optimizer offload" if offload_optimizer else "") + (
            " +param offload" if offload_param else "")
        overrides = (*cluster_overrides(request), "policy.training_backend=deepspeed",
                     "policy.deepspeed_cfg.enabled=true", f"policy.deepspeed_cfg.zero_stage={stage}",
                     f"policy.deepspeed_cfg.offload_optimizer={'cpu' if offload_optimizer else 'none'}",
                     f"policy.deepspeed_cfg.offload_param={'cpu' if offload_param else 'none'}")
        return Layout(BACKEND, name, overrides, dp=request.world_size)

    def layout_of(self, config: Any, request: PlanRequest) -> Layout:
        s = config.section("policy.deepspeed_cfg")
        return self._layout(request, s.zero_stage, s.offload_optimizer != "none", s.offload_param != "none")

    def estimate(self, request: PlanRequest, layout: Layout) -> TrainingMemory:
        overrides = dict(o.split("=", 1) for o in layout.overrides)
        stage = int(overrides["policy.deepspeed_cfg.zero_stage"])
        p, dp, width = request.shape.parameters, layout.dp, request.dtype_bytes
        parameters = 0 if overrides["policy.deepspeed_cfg.offload_param"] != "none" else p * width / (dp if stage == 3 else 1)
        gradients = p * width / (dp if stage >= 1 else 1)
        optimizer = 0 if overrides["policy.deepspeed_cfg.offload_optimizer"] != "none" else 12 * p / (dp if stage >= 1 else 1)
        reference = p * width / (dp if stage == 3 else 1) if request.reference else 0
        return TrainingMemory(parameters=int(parameters), gradients=int(gradients), optimizer=int(optimizer),
                              activations=activation_bytes(request, request.shape.layers), reference=int(reference),
                              buffers=working_buffer_bytes(p, width, stage))


def working_buffer_bytes(parameters: int, width: int, stage: int) -> int:
    """ZeRO's working buffers on a rank: the gradient reduce bucket at every stage; at stage 3 also
    the gathered full parameters (at most the live-parameter limit) and their full gradients before
    the reduce (at most a bucket)."""
    bucket = REDUCE_BUCKET_ELEMENTS * width
    if stage < 3:
        return bucket
    gathered = min(parameters, MAX_LIVE_PARAMETERS) * width
    unreduced = min(parameters, REDUCE_BUCKET_ELEMENTS) * width
    return bucket + gathered + unreduced
