"""The core's ``hf`` generation backend through the generation conformance suite."""

from __future__ import annotations

from corerl.testing.generation_conformance import GenerationBackendConformance


class TestHFGenerationConformance(GenerationBackendConformance):
    backend_id = "hf"
