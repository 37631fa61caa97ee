"""vllm through the generation conformance suite (one engine per class, in a Ray actor)."""

from __future__ import annotations

from corerl.testing.generation_conformance import GenerationBackendConformance


class TestVllmInProcess(GenerationBackendConformance):
    backend_id = "vllm"
