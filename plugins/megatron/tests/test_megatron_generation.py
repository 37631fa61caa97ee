"""megatron generation through the generation conformance suite: on its own engine at world
size 1, and at tp=2 and pp=2 (every rank of the replica runs the decode loop)."""

from __future__ import annotations

import pytest

from corerl.testing.generation_conformance import GenerationBackendConformance


class TestMegatronGeneration(GenerationBackendConformance):
    backend_id = "megatron"


class TestMegatronGenerationTensorParallel2(GenerationBackendConformance):
    backend_id = "megatron"
    overrides = ["cluster.gpus_per_node=2", "policy.megatron_cfg.tensor_model_parallel_size=2"]


class TestMegatronGenerationPipelineParallel2(GenerationBackendConformance):
    backend_id = "megatron"
    overrides = ["cluster.gpus_per_node=2", "policy.megatron_cfg.pipeline_model_parallel_size=2"]


class TestMegatronGenerationOneRowPerKVBudget(GenerationBackendConformance):
    """A KV budget (``buffer_size_gb``) that holds one row's cache: rows decode one at a time."""

    backend_id = "megatron"
    overrides = ["policy.generation.mcore_generation_config.buffer_size_gb=0.0000001"]


@pytest.mark.gpu
@pytest.mark.xdist_group("megatron-generation-gpu")  # its backend is built once, in one worker (-n with --dist loadgroup)
class TestMegatronGenerationOnGpu(GenerationBackendConformance):
    """The gpu tier: megatron decoding with its KV cache on CUDA."""

    backend_id = "megatron"


def _two_gpus_with_transformer_engine() -> bool:
    import importlib.util

    import torch

    return torch.cuda.device_count() >= 2 and importlib.util.find_spec("transformer_engine") is not None


@pytest.mark.gpu
@pytest.mark.skipif(not _two_gpus_with_transformer_engine(),
                    reason="sequence parallelism needs tensor parallelism (2 GPUs) and Transformer Engine's layer spec")
@pytest.mark.xdist_group("megatron-generation-sp-gpu")
class TestMegatronGenerationSequenceParallelOnGpus(GenerationBackendConformance):
    """A model trained with sequence parallelism (TP=2) decodes with it switched off by megatron-core's
    set_model_to_sequence_parallel, and on again for training (NeMo RL's colocated megatron recipes)."""

    backend_id = "megatron"
    overrides = ["cluster.gpus_per_node=2", "policy.megatron_cfg.tensor_model_parallel_size=2",
                 "policy.megatron_cfg.sequence_parallel=true"]
