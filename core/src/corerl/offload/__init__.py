"""Offload policies: what leaves the accelerator at each phase boundary of an RL step.

An :class:`corerl.registry.OffloadPolicy` factory is called as
``factory(training=..., generation=..., config=...)`` and returns an object with the
methods of :class:`corerl.offload.schedule.PhaseOffload`; the algorithms call them at the
boundaries. The frozen reference model has its own switch (``policy.reference.cpu_offload``,
:class:`corerl.offload.reference.ReferenceOffload`).
"""

from corerl.offload.reference import ReferenceOffload
from corerl.offload.schedule import (
    OPTIMIZER,
    PARAMETERS,
    FullOffload,
    NoOffload,
    OptimizerOffload,
    PhaseOffload,
)

__all__ = ["OPTIMIZER", "PARAMETERS", "FullOffload", "NoOffload", "OptimizerOffload", "PhaseOffload", "ReferenceOffload"]
