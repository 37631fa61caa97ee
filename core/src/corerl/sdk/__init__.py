"""The public plugin API: everything a third-party backend, task or reward needs.

A plugin written against ``corerl.sdk`` alone (and ``corerl.testing.conformance`` in its tests)
keeps working across corerl releases: these names are documented in docs/plugins.md ("The plugin
API") and change only with a deprecation. Everything else under ``corerl`` is internal. Importing
this package imports no engine (no torch): the helpers that need one import it when called.

The names are grouped by what a plugin kind needs, one module per kind, and every one of them is
importable from ``corerl.sdk`` itself too:

- :mod:`corerl.sdk.registering`: what every plugin needs (``hookimpl``, ``CONTRACT_VERSION``, the
  registration classes, ``Config``, ``setting``, ``section``, the errors it raises);
- :mod:`corerl.sdk.training`: a training backend and its memory model;
- :mod:`corerl.sdk.generation`: a generation backend;
- :mod:`corerl.sdk.environments`: an environment, a tool, a tool-call parser, a sandbox;
- :mod:`corerl.sdk.algorithms`: an algorithm;
- :mod:`corerl.sdk.loggers`: an experiment logger.
"""

from __future__ import annotations

from corerl import component_kinds  # noqa: F401  (corerl.sdk.component_kinds, as before)
from corerl.run.context import RunContext  # noqa: F401  what RunServices was typed as before contract 2.15
from corerl.sdk import algorithms, environments, generation, loggers, registering, training
from corerl.sdk.algorithms import *  # noqa: F403
from corerl.sdk.environments import *  # noqa: F403
from corerl.sdk.generation import *  # noqa: F403
from corerl.sdk.loggers import *  # noqa: F403
from corerl.sdk.registering import *  # noqa: F403  (hookimpl, CONTRACT_VERSION, the registration classes)
from corerl.sdk.training import *  # noqa: F403

#: every kind's names once (a name several kinds need is one object), RunContext, and the one list
#: of registering names (corerl.component_kinds.__all__, which `corerl` exports too) last
__all__ = list(dict.fromkeys([
    *loggers.__all__, *environments.__all__, *algorithms.__all__, "RunContext", *training.__all__,
    *generation.__all__, *registering.__all__,
]))
