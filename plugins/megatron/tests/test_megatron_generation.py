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
