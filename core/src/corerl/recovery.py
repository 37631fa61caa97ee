"""Moved to :mod:`corerl.run.recovery` (issue 74: the run layer's package); this old path re-exports it, so imports from it keep working."""

from corerl.run.recovery import *  # noqa: F403
