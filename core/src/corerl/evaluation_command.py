"""Moved to :mod:`corerl.evaluation.command` (issue 74: the evaluation package); this old path re-exports it, so imports from it keep working."""

from corerl.evaluation.command import *  # noqa: F403
