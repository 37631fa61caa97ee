"""What an experiment logger is: the keys every ``logger.<id>`` section has, what its factory is
given, and the two methods the run calls. Imports nothing heavy (the built-in plugin registers
the loggers when ``corerl --help`` runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import attrs

from corerl.config.fields import setting


@attrs.define(kw_only=True)
class LoggerSettings:
    """The keys every ``logger.<id>`` section has; a logger's own schema subclasses this."""

    enabled: bool = setting(False, help="log the run's metrics here")
    optional: bool = setting(False, help="when the logger cannot start (no package, no server, no login), say so "
                                         "in one line and run on without it; false: the run stops there")


@attrs.frozen(kw_only=True)
class LoggerContext:
    """What a logger's factory is called with."""

    run_dir: Path
    #: the run directory's name (``run.name`` or its timestamp)
    run_name: str
    #: the recipe as flat ``key.path -> value`` (what the logger records as the run's parameters)
    params: dict[str, Any]
    #: the ``logger.<id>`` section, an instance of the registration's ``config_schema``
    settings: Any
    #: True when the run resumes from a checkpoint (a logger may continue its earlier run)
    resumed: bool = False


class ExperimentLoggerProtocol(Protocol):
    """What a logger's factory returns."""

    def log(self, metrics: dict[str, float | list[float]], step: int) -> None:
        """One step's metrics, named ``<phase>/<metric>`` (``grpo/reward_mean``); a list is one
        value per item (a histogram, where the logger has them); ``step`` counts every phase's steps."""

    def close(self) -> None:
        """The run ended (finished, interrupted or failed): flush and let go of files and services."""
