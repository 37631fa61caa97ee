"""megatron through the training-backend conformance suite (megatron's own optimizer and
scheduler replace the generic ones: SGD with momentum and linear warm-up, as the suite's reference)."""

from __future__ import annotations

import pytest

from corerl.testing.conformance import LR, MAX_GRAD_NORM, MOMENTUM, TrainingBackendConformance

MEGATRON = ["policy.megatron_cfg.enabled=true", "policy.megatron_cfg.optimizer.optimizer=sgd",
            f"policy.megatron_cfg.optimizer.lr={LR}", f"policy.megatron_cfg.optimizer.sgd_momentum={MOMENTUM}",
            f"policy.megatron_cfg.optimizer.clip_grad={MAX_GRAD_NORM}", "policy.megatron_cfg.optimizer.weight_decay=0.0",
            "policy.megatron_cfg.scheduler.lr_decay_style=linear", "policy.megatron_cfg.scheduler.lr_warmup_iters=2"]


class _Megatron(TrainingBackendConformance):
    backend_id = "megatron"
    micro_batch_layouts = ()

    # megatron-core's mixed-precision wrappers take CUDA tensors: bf16 is a GPU-only path here
    bf16_tolerance = None
    # megatron's own optimizer section: Adam for (d)'s Adam variant
    adam_overrides = ["policy.megatron_cfg.optimizer.optimizer=adam", "policy.megatron_cfg.optimizer.lr=0.001"]

    def _single_rank_overrides(self) -> list[str]:
        return ["policy.megatron_cfg.tensor_model_parallel_size=1", "policy.megatron_cfg.pipeline_model_parallel_size=1",
                "policy.megatron_cfg.sequence_parallel=false"]


class TestWorld1(_Megatron):
    # LoRA at world size 1 is checked in this process by test_megatron_lora.py (logits and adapter
    # gradients against PEFT's); (l) runs at PP=2 below
    lora_checks = False
    overrides = ["cluster.gpus_per_node=1", *MEGATRON]


class TestTensorParallel2(_Megatron):
    # LoRA at TP=2 is checked on two gloo ranks by test_megatron_lora.py (both adapter layouts, their
    # gradients and the optimizer's gradient norm against PEFT's); (l) runs at PP=2 below
    lora_checks = False
    overrides = ["cluster.gpus_per_node=2", "policy.megatron_cfg.tensor_model_parallel_size=2", *MEGATRON]


class TestPipelineParallel2(_Megatron):
    critic_checks = False  # the critic runs at world size 1 and with tensor parallelism
    # packed rows, padded to one width per call, through the two stages' pipeline schedule (the packed
    # critic and packed against unpacked at world size 1: test_megatron_packing.py)
    micro_batch_layouts = ("packed",)
    overrides = ["cluster.gpus_per_node=2", "policy.megatron_cfg.pipeline_model_parallel_size=2", *MEGATRON]


@pytest.mark.gpu
@pytest.mark.xdist_group("megatron-conformance-gpu")  # its backend is built once, in one worker (-n with --dist loadgroup)
class TestWorld1OnGpu(_Megatron):
    """The gpu tier: megatron-core on CUDA at world size 1 (model built on the GPU, CUDA RNG tracker seeded)."""

    overrides = ["cluster.gpus_per_node=1", *MEGATRON]
