"""Moved to :mod:`corerl.run.out_of_memory` (issue 74: the run layer's package); this old path re-exports it, so imports from it keep working."""

from corerl.run.out_of_memory import *  # noqa: F403
