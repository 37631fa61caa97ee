"""deepspeed through the training-backend conformance suite: ZeRO stages 1, 2 and 3 at world
size 1, ZeRO-2 and ZeRO-3 at world size 2 (ZeRO-1's partitioned optimizer state is ZeRO-2's
without its gradients partitioned), and ZeRO-2 / ZeRO-3 with the optimizer offloaded to the CPU."""

from __future__ import annotations

import pytest

from corerl.testing.conformance import TrainingBackendConformance


class _DeepSpeed(TrainingBackendConformance):
    backend_id = "deepspeed"


class _ZeroVariant(_DeepSpeed):
    """A layout checked for what its partitioning changes: the engine's own checks (a)-(f), (h), (k)
    and DPO's step. What reads the model the same under any stage (the GRPO loss variants and top-k
    distillation, LoRA, the critic, the token budgets, whose micro-batches are cut before any
    partitioning) runs under ZeRO-3 at world size 2, every rank holding a part of each weight."""

    algorithm_checks = lora_checks = critic_checks = False
    micro_batch_layouts = ()


def _layout(stage: int, world: int, *extra: str) -> list[str]:
    return [f"cluster.gpus_per_node={world}", f"policy.deepspeed_cfg.zero_stage={stage}", *extra]


class TestZero1World1(_ZeroVariant):
    adam_overrides: list[str] = []  # Adam's state across a save and bf16: checked under ZeRO-3
    bf16_tolerance = None
    overrides = _layout(1, 1)


class TestZero2World1(_ZeroVariant):
    adam_overrides: list[str] = []  # Adam's state across a save and bf16: checked under ZeRO-3
    bf16_tolerance = None
    overrides = _layout(2, 1)


class TestZero2World2(_ZeroVariant):
    overrides = _layout(2, 2)


class TestZero3World1(_ZeroVariant):
    """ZeRO-3 at world size 1 keeps what only world size 1 checks: Adam's state and bf16."""

    overrides = _layout(3, 1)


class TestZero3World2(_DeepSpeed):
    """Every check: the same engine partitioned over two ranks."""

    overrides = _layout(3, 2)


class TestZero2OptimizerOffloadWorld2(_ZeroVariant):
    overrides = _layout(2, 2, "policy.deepspeed_cfg.offload_optimizer=cpu")


class TestZero3OptimizerOffloadWorld2(_ZeroVariant):
    overrides = _layout(3, 2, "policy.deepspeed_cfg.offload_optimizer=cpu")


@pytest.mark.gpu
@pytest.mark.xdist_group("deepspeed-conformance-gpu")  # its backend is built once, in one worker (-n with --dist loadgroup)
class TestZero3World1OnGpu(_DeepSpeed):
    """The gpu tier: ZeRO-3 at world size 1 on the machine's GPU, in the bundle Ray gave the rank."""

    overrides = _layout(3, 1)
