"""Shutting a run's backends down after a failure: every backend is shut down, and a backend
whose own shutdown fails neither hides the error that ended the run nor keeps the others up."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from corerl.run.context import RunContext


class _Backend:  # stands in for an engine: what is under test is the runner's shutdown order
    def __init__(self, name: str, calls: list[str], fails: bool = False) -> None:
        self.name, self.calls, self.fails = name, calls, fails

    def shutdown(self) -> None:
        self.calls.append(self.name)
        if self.fails:
            raise RuntimeError(f"{self.name} could not stop")


def _session(calls: list[str]) -> RunContext:
    session = RunContext(config=None, selection=None, console=None, host=None,  # type: ignore[arg-type]
                         run_dir=Path("."), resume=None)  # only its list of started backends matters here
    session.engines.started.extend([_Backend("training", calls), _Backend("generation", calls, fails=True),
                                    _Backend("reference", calls)])
    return session


def test_after_a_failure_every_backend_is_shut_down_and_the_shutdown_error_only_logged(caplog):
    calls: list[str] = []
    with caplog.at_level(logging.WARNING, logger="corerl.run.engines"):
        _session(calls).close(run_failed=True)  # returns: the run's own error is the one that propagates
    assert calls == ["reference", "generation", "training"]
    assert "shutting down _Backend failed: RuntimeError: generation could not stop" in caplog.text


def test_after_a_successful_run_a_failed_shutdown_is_raised_once_all_are_down():
    calls: list[str] = []
    with pytest.raises(RuntimeError, match="generation could not stop"):
        _session(calls).close(run_failed=False)
    assert calls == ["reference", "generation", "training"]
