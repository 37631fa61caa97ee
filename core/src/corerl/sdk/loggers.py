"""What an experiment logger (``corerl_register_loggers``) needs beyond
:mod:`corerl.sdk.registering`: what its factory gets and the keys of its section."""

from __future__ import annotations

from corerl.reporting.loggers.contract import LoggerContext, LoggerSettings

__all__ = ["LoggerContext", "LoggerSettings"]
