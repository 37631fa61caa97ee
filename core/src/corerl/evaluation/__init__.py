"""Evaluation: a policy's held-out figures (:mod:`corerl.evaluation.figures`, re-exported here,
where it lived as one module), the evaluations a run makes beside its steps
(:mod:`corerl.evaluation.during_run`) and the ``corerl eval`` command
(:mod:`corerl.evaluation.command`, a face of the command line).

Light to import: validation calls :func:`check_evaluation` without torch.
"""

from corerl.evaluation.figures import *  # noqa: F403
