"""Moved to :mod:`corerl.run.steps` (issue 74: the run layer's package); this old path re-exports it, so imports from it keep working."""

from corerl.run.steps import *  # noqa: F403
