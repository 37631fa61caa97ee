"""Moved to :mod:`corerl.run.record` (issue 74: the run layer's package); this old path re-exports it, so imports from it keep working."""

from corerl.run.record import *  # noqa: F403
