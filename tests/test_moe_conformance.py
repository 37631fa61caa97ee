"""The conformance suite's MoE checks on a third-party training backend that does not say
``moe=True`` (fast tier, in process): selection refuses a MoE policy on it in one line, at
``policy.training_backend``, and the engine checks are skipped."""

from __future__ import annotations

from corerl import TrainingBackend, hookimpl
from corerl.testing.conformance import MoeConformance


class _DenseOnly:
    """A backend registered before contract 2.7: it takes dense models only."""

    @hookimpl
    def corerl_register_training_backends(self, register):
        register(TrainingBackend(id="dense-only", factory="builtins:dict", description="dense models only"))


class TestDenseOnlyBackendMoe(MoeConformance):
    backend_id = "dense-only"
    plugin = _DenseOnly()
