"""deepspeed through the training-backend conformance suite: ZeRO stages 1, 2 and 3 at world
size 1, ZeRO-2 and ZeRO-3 at world size 2 (ZeRO-1's partitioned optimizer state is ZeRO-2's
without its gradients partitioned), and ZeRO-2 / ZeRO-3 with the optimizer offloaded to the CPU."""

from __future__ import annotations

import pytest

from corerl.testing.conformance import TrainingBackendConformance


class _DeepSpeed(TrainingBackendConformance):
    backend_id = "deepspeed"


def _layout(stage: int, world: int, *extra: str) -> list[str]:
    return [f"cluster.gpus_per_node={world}", f"policy.deepspeed_cfg.zero_stage={stage}", *extra]


class TestZero1World1(_DeepSpeed):
    algorithm_checks = False  # the GRPO loss variants and top-k distillation: under ZeRO-3 at world size 1 and 2
    lora_checks = False  # LoRA runs under ZeRO-3 at world size 1 and 2
    micro_batch_layouts = ()  # token budgets: checked under ZeRO-3 (partitioning leaves the forward unchanged)
    adam_overrides: list[str] = []  # Adam's state across a save and bf16: checked under ZeRO-3
    bf16_tolerance = None
    critic_checks = False  # the critic runs under ZeRO-3 at world size 1 and 2
    overrides = _layout(1, 1)


class TestZero2World1(_DeepSpeed):
    algorithm_checks = False  # the GRPO loss variants and top-k distillation: under ZeRO-3 at world size 1 and 2
    lora_checks = False  # LoRA runs under ZeRO-3 at world size 1 and 2
    micro_batch_layouts = ()  # token budgets: checked under ZeRO-3 (partitioning leaves the forward unchanged)
    adam_overrides: list[str] = []  # Adam's state across a save and bf16: checked under ZeRO-3
    bf16_tolerance = None
    critic_checks = False  # the critic runs under ZeRO-3 at world size 1 and 2
    overrides = _layout(2, 1)


class TestZero2World2(_DeepSpeed):
    algorithm_checks = False  # the GRPO loss variants and top-k distillation: under ZeRO-3 at world size 1 and 2
    lora_checks = False  # LoRA runs under ZeRO-3 at world size 1 and 2
    micro_batch_layouts = ()  # token budgets: checked under ZeRO-3 (partitioning leaves the forward unchanged)
    critic_checks = False  # the critic runs under ZeRO-3 at world size 1 and 2
    overrides = _layout(2, 2)


class TestZero3World1(_DeepSpeed):
    micro_batch_layouts = ()  # token budgets: at world size 2 (each rank's micro-batches cut as at world size 1)
    # the GRPO loss variants, top-k distillation, LoRA and the critic: under ZeRO-3 at world size 2, the same
    # engine partitioned over two ranks (this class keeps what only world size 1 checks: Adam's state, bf16)
    algorithm_checks = lora_checks = critic_checks = False
    overrides = _layout(3, 1)


class TestZero3World2(_DeepSpeed):
    overrides = _layout(3, 2)


class TestZero2OptimizerOffloadWorld2(_DeepSpeed):
    algorithm_checks = False  # the GRPO loss variants and top-k distillation: under ZeRO-3 at world size 1 and 2
    lora_checks = False  # LoRA runs under ZeRO-3 at world size 1 and 2
    micro_batch_layouts = ()  # token budgets: checked under ZeRO-3 (partitioning leaves the forward unchanged)
    critic_checks = False  # the critic runs under ZeRO-3 at world size 1 and 2
    overrides = _layout(2, 2, "policy.deepspeed_cfg.offload_optimizer=cpu")


class TestZero3OptimizerOffloadWorld2(_DeepSpeed):
    algorithm_checks = False  # the GRPO loss variants and top-k distillation: under ZeRO-3 at world size 1 and 2
    lora_checks = False  # LoRA runs under ZeRO-3 at world size 1 and 2
    micro_batch_layouts = ()  # token budgets: checked under ZeRO-3 (partitioning leaves the forward unchanged)
    critic_checks = False  # the critic runs under ZeRO-3 at world size 1 and 2
    overrides = _layout(3, 2, "policy.deepspeed_cfg.offload_optimizer=cpu")


@pytest.mark.gpu
@pytest.mark.xdist_group("deepspeed-conformance-gpu")  # its backend is built once, in one worker (-n with --dist loadgroup)
class TestZero3World1OnGpu(_DeepSpeed):
    """The gpu tier: ZeRO-3 at world size 1 on the machine's GPU, in the bundle Ray gave the rank."""

    overrides = _layout(3, 1)
