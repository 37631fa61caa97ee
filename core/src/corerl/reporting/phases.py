"""The ``phase`` names of metrics.jsonl's rows that are not an algorithm's steps: what the run
writes (:mod:`corerl.evaluation`, :mod:`corerl.run.recovery`, which re-export them) and what
reporting reads back (:mod:`corerl.reporting.metrics_log`, :mod:`corerl.reporting.plot`)."""

from __future__ import annotations

#: the ``phase`` of the evaluation rows in metrics.jsonl, and the loggers' prefix of their metrics
EVAL_PHASE = "eval"
#: metrics.jsonl's ``phase`` of a recovery's row.
RECOVERY_PHASE = "recovery"
