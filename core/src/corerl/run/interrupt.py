"""Ctrl-C during a run: the first press asks the run to stop after the current step (it then
saves a checkpoint and exits); a second press stops at once."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType


class StopRequest:
    """Set by the first SIGINT; the run loop checks it between steps."""

    def __init__(self) -> None:
        self.requested = False


@contextmanager
def stop_on_sigint(announce: Callable[[str], None]) -> Iterator[StopRequest]:
    """Within the block, the first SIGINT sets ``requested``; the second raises KeyboardInterrupt."""
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield stop
        return

    def handle(signum: int, frame: FrameType | None) -> None:
        if stop.requested:
            raise KeyboardInterrupt
        stop.requested = True
        announce("interrupted: finishing this step, then saving a checkpoint (Ctrl-C again to stop now)")

    previous = signal.signal(signal.SIGINT, handle)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)
