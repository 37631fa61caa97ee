"""Serving an ASGI application (FastAPI) with uvicorn: the one HTTP stack of corerl's servers (the
agent endpoint, :mod:`corerl.environments.endpoint`; ``corerl serve-generation``; ``corerl serve``).

FastAPI and uvicorn are the core's ``serve`` extra (vLLM brings both too), imported only when a
server starts: :func:`require_server_stack` says in one line which is missing. A command serves in
the foreground with :func:`serve`; a run or a test serves on a thread of its own with
:class:`BackgroundServer`, which listens before it returns and stops when told.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

#: how to install what :func:`require_server_stack` asks for
STACK_HINT = "pip install fastapi uvicorn"


def require_server_stack(what: str, *, key: str | None = None) -> None:
    """Raise one line when FastAPI or uvicorn cannot be imported: a
    :class:`~corerl.errors.ConfigError` naming ``key`` when a setting asked for the server, else a
    :class:`~corerl.errors.UsageError` (a command did)."""
    from corerl.errors import ConfigError, UsageError

    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        message = f"{what} serves over HTTP with FastAPI and uvicorn, and {exc.name} is not installed"
        if key is None:
            raise UsageError(message, hint=STACK_HINT) from None
        raise ConfigError(message, key=key, hint=STACK_HINT) from None


def serve(app: Any, *, host: str, port: int) -> None:
    """Serve ``app`` on ``host:port`` in this thread until interrupted (Ctrl-C, SIGTERM). SIGTERM
    ends it as :class:`SystemExit`: uvicorn shuts down on it and then raises it again with the
    handler it found, and with the default one the process would die before the caller's
    ``finally`` blocks (a command's scratch folders) ran."""
    import uvicorn

    with _sigterm_exits():
        uvicorn.run(app, host=host, port=port, log_level="warning")


@contextlib.contextmanager
def _sigterm_exits() -> Iterator[None]:
    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread: nothing to set up
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class BackgroundServer:
    """``app`` served by uvicorn on a daemon thread of its own, listening on ``host:port`` (0: a free
    port, then :attr:`port`) once the constructor returns; :meth:`stop` ends it.

    ``backlog``, ``limit_concurrency`` and ``timeout_keep_alive`` are uvicorn's: connections the
    kernel queues before they are accepted, connections and tasks at once before uvicorn answers
    503 (None: no limit), and seconds an idle keep-alive connection stays open. A request still in
    progress when :meth:`stop` is called has ``grace_s`` seconds to end before it is cancelled.
    Nothing is logged below warnings, and the process's logging configuration is left as it is.
    """

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0, backlog: int = 2048,
                 limit_concurrency: int | None = None, timeout_keep_alive: int = 5, grace_s: int = 1,
                 name: str = "corerl-http", start_timeout_s: float = 30.0) -> None:
        import uvicorn

        # bound and listening before uvicorn starts: the port is known now, and a client that
        # connects while the thread starts waits in the backlog (uvicorn listens again with it)
        self.socket = socket.create_server((host, port), backlog=backlog)
        self.host, self.port, self.name = host, self.socket.getsockname()[1], name
        config = uvicorn.Config(app, log_config=None, log_level="warning", access_log=False, backlog=backlog,
                                limit_concurrency=limit_concurrency, timeout_keep_alive=timeout_keep_alive,
                                timeout_graceful_shutdown=grace_s)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + start_timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{name}: the HTTP server on {host}:{self.port} did not start (uvicorn's "
                                   "log says why)")
            time.sleep(0.005)

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self.socket])
        except SystemExit:  # uvicorn's way to say it could not start (logged): the constructor reports it
            pass

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop taking connections, give requests in progress ``grace_s``, and end the thread."""
        self.server.should_exit = True
        self.thread.join(timeout_s)
        self.socket.close()

    def __enter__(self) -> BackgroundServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
