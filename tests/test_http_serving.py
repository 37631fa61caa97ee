"""The core's one HTTP stack (corerl.environments.http_serving): an app served on a thread answers on
its port once started and frees it when stopped, a server whose app fails to start says so, and a
missing FastAPI or uvicorn is one line naming it."""

from __future__ import annotations

import json
import socket
import urllib.request
from contextlib import asynccontextmanager

import pytest

from corerl.environments.http_serving import STACK_HINT, BackgroundServer, require_server_stack


def test_an_app_on_a_thread_answers_once_started_and_stop_frees_its_port():
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/ping")
    async def ping() -> dict[str, bool]:
        return {"ok": True}

    server = BackgroundServer(app, name="test-http")
    assert server.url == f"http://127.0.0.1:{server.port}" and server.port > 0
    with urllib.request.urlopen(f"{server.url}/ping", timeout=10) as answer:  # answered as soon as constructed
        assert json.loads(answer.read()) == {"ok": True}
    server.stop()
    assert not server.thread.is_alive()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=5)


def test_an_app_whose_start_fails_is_an_error_not_a_silent_thread():
    from fastapi import FastAPI

    @asynccontextmanager
    async def broken(app):
        raise OSError("no model here")
        yield

    with pytest.raises(RuntimeError, match="test-broken: the HTTP server on 127.0.0.1:[0-9]+ did not start"):
        BackgroundServer(FastAPI(lifespan=broken), name="test-broken")


def test_a_missing_stack_is_one_line_naming_the_package(monkeypatch):
    from corerl.errors import ConfigError, UsageError

    monkeypatch.setitem(__import__("sys").modules, "uvicorn", None)  # as if not installed
    with pytest.raises(UsageError) as usage:
        require_server_stack("corerl serve-generation")
    assert str(usage.value) == (f"corerl serve-generation serves over HTTP with FastAPI and uvicorn, and uvicorn is "
                                f"not installed; {STACK_HINT}")
    with pytest.raises(ConfigError) as config:
        require_server_stack("the agent endpoint", key="data.env_name")
    assert config.value.key == "data.env_name" and "uvicorn is not installed" in config.value.message
