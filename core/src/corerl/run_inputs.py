"""Moved to :mod:`corerl.run.inputs` (issue 74: the run layer's package); this old path re-exports it, so imports from it keep working."""

from corerl.run.inputs import *  # noqa: F403
