"""The plain backend, installed, through corerl's generation-backend conformance suite."""

from __future__ import annotations

from corerl.testing.generation_conformance import GenerationBackendConformance


class TestPlainConformance(GenerationBackendConformance):
    backend_id = "plain"
