"""The example backend's memory model for ``corerl plan`` and ``corerl validate``'s fit check.

What the backend holds (:mod:`corerl_example.worker`): one process, the whole model in float32
(4 bytes a parameter), its float32 gradients (4), AdamW's two moments (8), and one micro-batch's
activations; the frozen reference, where the recipe keeps one, in float32 too. It runs one process
only, so it has one layout, on a world of one GPU. The generation engine's share is the engine's
own memory model's: the planner adds it.

A memory model may also say which requests its backend is the one for,
``preference(request) -> Preference | None`` (contract 2.16): the planner then ranks the fitting
layouts of the strongest preference first. This one states none: it is ranked with the others by
what fits and how simple it is.
"""

from __future__ import annotations

from typing import Any

from corerl.sdk import Layout, PlanRequest, TrainingMemory, activation_bytes, cluster_overrides

BACKEND = "example"


class ExampleMemory:
    """One float32 process with AdamW: 4 + 4 + 8 bytes a parameter, plus activations."""

    def layouts(self, request: PlanRequest) -> list[Layout]:
        if request.world_size != 1:  # the backend refuses more than one process (ExampleBackend)
            return []
        return [self._layout(request)]

    def _layout(self, request: PlanRequest) -> Layout:
        return Layout(BACKEND, "one process", (*cluster_overrides(request), f"policy.training_backend={BACKEND}"))

    def layout_of(self, config: Any, request: PlanRequest) -> Layout:
        return self._layout(request)

    def estimate(self, request: PlanRequest, layout: Layout) -> TrainingMemory:
        p = request.shape.parameters
        return TrainingMemory(parameters=4 * p, gradients=4 * p, optimizer=8 * p,
                              activations=activation_bytes(request, request.shape.layers),
                              reference=4 * p if request.reference else 0)
