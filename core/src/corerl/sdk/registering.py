"""What every plugin needs, whatever it registers: the hook marker, the registration classes,
the contract version it is written against, its config section's field helpers and the errors it
raises. A plugin imports these from here (or from :mod:`corerl.sdk`) and the names of its kind from
the kind's module: :mod:`corerl.sdk.training`, :mod:`corerl.sdk.generation`,
:mod:`corerl.sdk.environments`, :mod:`corerl.sdk.algorithms`, :mod:`corerl.sdk.loggers`."""

from __future__ import annotations

from corerl import component_kinds
from corerl.component_kinds import *  # noqa: F403  (hookimpl, CONTRACT_VERSION, the registration classes)
from corerl.config import Config
from corerl.config.fields import section, setting
from corerl.errors import ConfigError, ConfigErrors, EngineNotAvailable, PluginError, RunError
from corerl.import_paths import resolve

__all__ = [
    # a section schema's fields, and what a factory gets as `config`
    "Config", "setting", "section",
    # errors a plugin raises (a user's mistake, a missing engine, a failed run) and validation's list of them
    "ConfigError", "ConfigErrors", "EngineNotAvailable", "PluginError", "RunError",
    # an import path ("module:attr") resolved to its object
    "resolve",
]
# the one list of registering names (hookimpl, CONTRACT_VERSION, the registration classes), which
# `corerl` exports too: a registration class added to corerl.component_kinds comes here by itself
__all__ += component_kinds.__all__
