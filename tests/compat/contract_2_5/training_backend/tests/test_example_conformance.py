"""The template backend through corerl's training-backend conformance suite."""

from __future__ import annotations

import corerl_example.plugin
from corerl.testing.conformance import TrainingBackendConformance


class TestExampleBackendConformance(TrainingBackendConformance):
    backend_id = "example"
    plugin = corerl_example.plugin
    overrides = ["cluster.gpus_per_node=1", "policy.example_cfg.enabled=true"]
