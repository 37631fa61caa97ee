"""An executor whose calls run on daemon threads, for calls that may never return.

An environment's ``step`` or an agent harness that hangs past its ``timeout_s`` is abandoned by
the rollout; the standard library's ``ThreadPoolExecutor`` would still join its thread when the
interpreter exits (its workers are not daemon threads), so one step that never returns kept a
failed run alive until the step ended. Here each call gets a daemon thread of its own, at most
``max_threads`` running at once (the others wait for a free slot on their own thread), and the
process exits as soon as its main thread is done.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any


class DaemonThreadExecutor(Executor):
    """``submit`` runs each call on a new daemon thread, at most ``max_threads`` at once."""

    def __init__(self, max_threads: int, name: str) -> None:
        self.slots = threading.BoundedSemaphore(max_threads)
        self.name = name
        self.closed = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        if self.closed:
            raise RuntimeError(f"{self.name}: cannot take calls after shutdown")
        future: Future[Any] = Future()

        def run() -> None:
            with self.slots:
                if not future.set_running_or_notify_cancel():
                    return
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # handed to whoever waits on the future
                    future.set_exception(exc)

        threading.Thread(target=run, name=self.name, daemon=True).start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more calls; threads still running are not waited for (they are daemons)."""
        self.closed = True
