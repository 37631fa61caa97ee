"""Moved to :mod:`corerl.run.checkpoints` (issue 74: the run layer's package); this old path re-exports it, so imports from it keep working."""

from corerl.run.checkpoints import *  # noqa: F403
