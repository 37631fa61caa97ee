"""An executor whose calls run on daemon threads, for calls that may never return.

An environment's ``step`` or an agent harness that hangs past its ``timeout_s`` is abandoned by
the rollout; the standard library's ``ThreadPoolExecutor`` would still join its thread when the
interpreter exits (its workers are not daemon threads), so one step that never returns kept a
failed run alive until the step ended. Here at most ``max_threads`` daemon worker threads take the
calls from a queue (started as calls arrive, as ``ThreadPoolExecutor`` does), and the process exits
as soon as its main thread is done.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

_Work = tuple[Future, Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class DaemonThreadExecutor(Executor):
    """Calls queued for at most ``max_threads`` daemon worker threads."""

    def __init__(self, max_threads: int, name: str) -> None:
        self.max_threads, self.name = max_threads, name
        self.work: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self.threads: list[threading.Thread] = []
        self.idle = 0  # workers waiting for a call
        self.lock = threading.Lock()
        self.closed = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        with self.lock:
            if self.closed:
                raise RuntimeError(f"{self.name}: cannot take calls after shutdown")
            self.work.put((future, fn, args, kwargs))
            if self.idle:  # a waiting worker takes it
                self.idle -= 1
            elif len(self.threads) < self.max_threads:  # every worker busy (or hung): one more
                thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
                self.threads.append(thread)
                thread.start()
        return future

    def _serve(self) -> None:
        while True:
            item = self.work.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():  # skipped when cancelled while queued
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # handed to whoever waits on the future
                    future.set_exception(exc)
            with self.lock:
                self.idle += 1

    def shutdown(self, wait: bool = False, *, cancel_futures: bool = False) -> None:
        """Take no more calls; queued calls are cancelled when ``cancel_futures``; workers still
        running a call are never waited for (they are daemons, whatever ``wait`` says)."""
        with self.lock:
            self.closed = True
        while cancel_futures:
            try:
                item = self.work.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in self.threads:
            self.work.put(None)  # idle workers end; busy ones end after their call
