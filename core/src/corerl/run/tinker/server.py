"""``corerl serve``'s HTTP server: the part of the Tinker API the official ``tinker`` SDK's
ServiceClient, TrainingClient and SamplingClient use, over one :class:`TinkerEngine` (issue 76;
the reference: docs/serve.md).

:class:`~corerl.run.tinker.service.Service` holds the state (sessions, training models, sampling
sessions, saved weights on disk) and turns each request into engine calls;
:func:`build_app` is the FastAPI application around it. Every request carries an API key
(``X-API-Key``, the SDK's header); the key is the tenant: sessions, models, sampling sessions and
saved weights belong to the key that made them, and another key can neither use nor load them.

Errors come back in the SDK's shape, one line each: a failed future is ``{"error", "category"}``
(``RequestFailedError`` in the SDK), ``user`` for a request this server refuses and ``server`` for
a failure of its own; a refused direct call is the same body under an HTTP error status.
"""

# no `from __future__ import annotations`: FastAPI reads the handlers' annotations (Request) as objects
import asyncio
import contextlib
import hmac
import json
import logging
from collections.abc import Callable
from typing import Any

from corerl.failures import first_line
from corerl.run.tinker import wire
from corerl.run.tinker.engine import SERVER, USER, ServiceError
from corerl.run.tinker.futures import PROTO
from corerl.run.tinker.service import API, Backpressure, Service, tenant_of

log = logging.getLogger("corerl.serve")

# ----------------------------------------------------------------------------------------- ASGI


class Guard:
    """ASGI middleware in front of every route: the API key (``X-API-Key``) and the body size.
    A request without a known key gets 401; a body over ``max_body_bytes`` gets 413; both in the
    SDK's error shape. The tenant goes to ``scope["state"]["tenant"]``."""

    OPEN = (f"{API}/healthz",)

    def __init__(self, app: Any, keys: list[str], max_body_bytes: int) -> None:
        if not keys or not all(keys):
            raise ValueError("the server needs at least one API key")
        self.app = app
        self.keys = [(k.encode(), tenant_of(k)) for k in keys]
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":  # nothing here speaks it: refused before anything reads it
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http" or scope["path"] in self.OPEN:  # lifespan events, the health check
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"x-api-key")
        tenant = None
        if given is not None:
            for key, name in self.keys:  # every key compared, in constant time
                if hmac.compare_digest(given, key):
                    tenant = name
        if tenant is None:
            what = "no X-API-Key header" if given is None else "the X-API-Key is not one this server accepts"
            await _send_json(send, 401, wire.error_body(USER, f"{what}; set TINKER_API_KEY to a key the server was "
                                                              "started with (corerl serve --api-key-env)"))
            return
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await _send_json(send, 413, _too_large(int(declared), self.max_body_bytes))
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await _send_json(send, 413, _too_large(size, self.max_body_bytes))
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        sent = False

        async def replay() -> Any:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        scope.setdefault("state", {})["tenant"] = tenant
        await self.app(scope, replay, send)


def _too_large(size: int, limit: int) -> dict[str, str]:
    return wire.error_body(USER, f"the request body is over {limit} bytes ({size} read), this server's limit; send "
                                 "less at once (corerl serve --max-body-mb)")


async def _send_json(send: Any, status: int, content: Any) -> None:
    body = json.dumps(content).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"x-should-retry", b"false")]})
    await send({"type": "http.response.body", "body": body})


def build_app(service: Service, keys: list[str]) -> Any:
    """The FastAPI application serving ``service``, behind :class:`Guard` (``keys``: the accepted API keys)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import Response

    def answer(content: Any, status: int = 200) -> Response:
        headers = {"x-should-retry": "false"} if status >= 400 and status != 429 else None
        return Response(json.dumps(content), status_code=status, media_type="application/json", headers=headers)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> Any:
        service.start()

        async def reaper() -> None:
            while True:
                await asyncio.sleep(min(30.0, service.limits.session_timeout / 4))
                service.reap()

        task = asyncio.create_task(reaper())
        try:
            yield
        finally:
            task.cancel()
            service.stop()

    app = FastAPI(title="corerl serve (Tinker API)", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)

    @app.exception_handler(ServiceError)
    async def refused(request: Request, exc: ServiceError) -> Response:
        return answer(wire.error_body(exc.category, exc.message), 400 if exc.category == USER else 500)

    @app.exception_handler(Backpressure)
    async def busy(request: Request, exc: Backpressure) -> Response:
        return answer(wire.error_body(USER, str(exc)), 429)

    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception) -> Response:  # a bug here: one line, the server goes on
        log.exception("%s failed", request.url.path)
        return answer(wire.error_body(SERVER, f"the server failed this request: {first_line(exc)}"), 500)

    def tenant(request: Request) -> str:
        return str(request.state.tenant)

    async def body_of(request: Request, where: str) -> Any:
        try:
            return json.loads(await request.body())
        except ValueError:
            raise wire.refuse(where, "the body is not JSON") from None

    def post(name: str, method: Callable[[str, Any], dict[str, Any]]) -> None:
        async def handler(request: Request) -> Response:
            return answer(method(tenant(request), await body_of(request, name)))

        app.post(f"{API}/{name}", name=name)(handler)

    @app.post(f"{API}/client/config")
    async def client_config(request: Request) -> Response:
        return answer({"pjwt_auth_enabled": False, "proto_compress_fwdbwd": False, "custom_loss_server_side": False,
                       "sample_use_retrieve_futures": False, "sample_join_sampling_session": False,
                       "fwdbwd_max_chunk_bytes_count": min(5_000_000, service.limits.max_body_bytes // 2)})

    @app.post(f"{API}/client/dynamic_config")
    async def dynamic_config(request: Request) -> Response:
        return answer({})

    @app.post(f"{API}/telemetry")
    async def telemetry(request: Request) -> Response:  # accepted and dropped
        return answer({"status": "accepted"})

    @app.get(f"{API}/healthz")
    async def healthz(request: Request) -> Response:
        return answer({"status": "ok"})

    @app.get(f"{API}/get_server_capabilities")
    async def capabilities(request: Request) -> Response:
        return answer(service.capabilities())

    @app.post(f"{API}/session_heartbeat")
    async def session_heartbeat(request: Request) -> Response:
        try:
            return answer(service.heartbeat(tenant(request), await body_of(request, "session_heartbeat")))
        except ServiceError as exc:  # 410: the SDK stops the heartbeat of a session that ended
            return answer(wire.error_body(exc.category, exc.message), 410)

    for name, method in (("create_session", service.create_session),
                         ("create_model", service.create_model), ("get_info", service.get_info),
                         ("optim_step", service.optim_step), ("save_weights", service.save_weights),
                         ("load_weights", service.load_weights),
                         ("save_weights_for_sampler", service.save_weights_for_sampler),
                         ("create_sampling_session", service.create_sampling_session),
                         ("asample", service.asample)):
        post(name, method)

    @app.post(f"{API}/forward_backward")
    async def forward_backward(request: Request) -> Response:
        return answer(service.forward_backward(tenant(request), await request.body(),
                                               request.headers.get("content-encoding")))

    @app.get(API + "/samplers/{sampler_id}")
    async def get_sampler(sampler_id: str, request: Request) -> Response:
        return answer(service.get_sampler(tenant(request), sampler_id))

    @app.post(API + "/sessions/{session_id}/finish")
    async def finish(session_id: str, request: Request) -> Response:
        return answer(service.finish_session(tenant(request), session_id))

    @app.post(f"{API}/retrieve_future")
    async def retrieve_future(request: Request) -> Response:
        outcome = await service.retrieve(tenant(request), await body_of(request, "retrieve_future"))
        if outcome.kind == PROTO:
            return Response(outcome.payload, media_type="application/x-protobuf")
        return answer(outcome.payload)

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def unknown(path: str, request: Request) -> Response:
        return answer(wire.error_body(USER, f"/{path} is not served here (corerl serve speaks the part of the "
                                            "Tinker API the SDK's training and sampling clients use)"), 404)

    return Guard(app, keys, service.limits.max_body_bytes)
