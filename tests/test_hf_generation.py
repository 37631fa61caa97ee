"""The core's ``hf`` generation backend through the generation conformance suite."""

from __future__ import annotations

from corerl.testing.generation_conformance import GenerationBackendConformance


class TestHFGenerationConformance(GenerationBackendConformance):
    backend_id = "hf"


class TestHFGenerationStaticCache(GenerationBackendConformance):
    """generate() with a static KV cache (the default on a GPU) gives the same outputs."""

    backend_id = "hf"
    overrides = ["policy.generation.hf_kv_cache=static"]
