"""vllm through the generation conformance suite (one engine per class, in a Ray actor; refits in
buckets through shared memory, which the refit checks therefore cover)."""

from __future__ import annotations

from corerl.testing.generation_conformance import GenerationBackendConformance


class TestVllmInProcess(GenerationBackendConformance):
    backend_id = "vllm"

    def test_refits_reach_the_ray_hosted_engine_through_shared_memory(self, engine):
        # the engine's actor runs on this machine: the refit checks above went through the file
        assert engine.shared is not None
        import os

        assert os.path.exists(engine.shared.path) and engine.shared.size > 0
