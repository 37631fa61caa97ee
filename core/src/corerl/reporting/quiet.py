"""A quiet terminal for ``corerl run``: corerl's own lines, progress bars and summary on the
terminal; everything else (third-party warnings and loggers, engines' chatter, C++ libraries'
lines, Ray actors' output) in the run directory's ``run.log``. ``corerl run -v`` keeps it all on
the terminal too.

Why file descriptors and not only :mod:`logging`: most of the chatter is not Python logging
(torch's C++ warnings, vLLM's loading bars, Triton's notice, child processes of engines), so the
run points descriptors 1 and 2 at the log file and gives corerl's console a stream of its own on
the terminal. Ray's workers of a local runtime are started after that and inherit
``CORERL_RUN_LOG``; corerl's actors point their own descriptors at that file as they start
(:func:`corerl.distributed.run_log.write_output_to_run_log`, re-exported here with the log file's
variable and :func:`ray_options`). Why not Ray's ``worker_process_setup_hook``: any
``runtime_env`` makes every actor wait for Ray's runtime-environment agent (measured: 4 actors
start in 2.1 s instead of 0.9 s), which the test suite's hundred runs would pay."""

from __future__ import annotations

import logging
import os
import sys
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import TextIO

from corerl.distributed.run_log import (
    RUN_LOG_VARIABLE,
    ray_options,
    set_active_log,
    write_output_to_run_log,
)

__all__ = ["LOG_NAME", "RUN_LOG_VARIABLE", "QuietTerminal", "last_log", "ray_options", "write_output_to_run_log"]

LOG_NAME = "run.log"
#: the log file of the last run this process started (the CLI names it with a failure)
_last_log: Path | None = None


class QuietTerminal:
    """While entered, descriptors 1 and 2 write to ``log_path``; ``sys.stdout`` (corerl's console
    and prints) and the ``corerl`` loggers' warnings write to the terminal. ``verbose``: nothing
    moves; Python's logging goes to the file as well."""

    def __init__(self, log_path: Path, verbose: bool = False) -> None:
        self.log_path, self.verbose = log_path, verbose
        self._undo = ExitStack()

    def __enter__(self) -> QuietTerminal:
        global _last_log
        _last_log = self.log_path
        undo = self._undo
        log_file = undo.enter_context(self.log_path.open("a", buffering=1, encoding="utf-8"))
        to_file = logging.StreamHandler(log_file)
        to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        _add_handler(undo, logging.getLogger(), to_file, level=logging.INFO)
        ours = logging.getLogger("corerl")
        undo.callback(ours.setLevel, ours.level)
        ours.setLevel(logging.INFO)
        if self.verbose:  # the terminal keeps everything, Python's warnings and errors too
            _add_handler(undo, logging.getLogger(), logging.StreamHandler(sys.stderr), handler_level=logging.WARNING)
            return self
        sys.stdout.flush()
        sys.stderr.flush()
        terminal = undo.enter_context(_stream_on_copy_of(1, sys.stdout.encoding))
        terminal_err = undo.enter_context(_stream_on_copy_of(2, sys.stderr.encoding))
        # corerl's own warnings stay on the terminal's stderr (and propagate to the file)
        _add_handler(undo, ours, logging.StreamHandler(terminal_err), handler_level=logging.WARNING)
        for fd in (1, 2):
            undo.callback(_restore_fd, fd, os.dup(fd))
            os.dup2(log_file.fileno(), fd)
        undo.callback(setattr, sys, "stdout", sys.stdout)
        sys.stdout = terminal
        undo.callback(set_active_log, None)
        set_active_log(self.log_path)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self._undo.close()


def _add_handler(undo: ExitStack, logger: logging.Logger, handler: logging.Handler, level: int | None = None,
                 handler_level: int | None = None) -> None:
    """Add ``handler`` to ``logger`` (lowering the logger to ``level``), undone with ``undo``."""
    if handler_level is not None:
        handler.setLevel(handler_level)
    logger.addHandler(handler)
    undo.callback(logger.removeHandler, handler)
    if level is not None and logger.level > level:
        undo.callback(logger.setLevel, logger.level)
        logger.setLevel(level)


def _stream_on_copy_of(fd: int, encoding: str | None) -> TextIO:
    """A line-buffered text stream on a copy of ``fd`` (the terminal, once ``fd`` itself moves)."""
    return os.fdopen(os.dup(fd), "w", buffering=1, encoding=encoding or "utf-8", errors="replace")


def _restore_fd(fd: int, copy: int) -> None:
    os.dup2(copy, fd)
    os.close(copy)


def last_log() -> Path | None:
    """The log file of the last run this process started (None: none started)."""
    return _last_log
