"""Moved to :mod:`corerl.evaluation.during_run` (issue 74: the evaluation package); this old path re-exports it, so imports from it keep working."""

from corerl.evaluation.during_run import *  # noqa: F403
