"""``corerl serve-generation RECIPE_OR_SCRIPT [KEY=VALUE ...] --port N``: the generation engine a
recipe selects, served over HTTP for trainers elsewhere (the ``remote`` generation backend,
:mod:`corerl.generation.remote`, which states the protocol).

The recipe picks the engine as ``corerl run`` does (``policy.generation.backend``, by priority:
the ``hf`` backend, the vLLM plugin's, ...) and its sampling settings come with each request. A
SkyRL launch script that starts SkyRL's server (``-m skyrl.train.entrypoints.serve``, as
``run_vllm_server.sh`` does) is read as the same keys given to ``main_base``. Served with FastAPI
and uvicorn (``pip install fastapi uvicorn``; :mod:`corerl.environments.http_serving`). Registered by the core's own plugin
(``corerl_register_commands``).

Weights arrive as safetensors chunks (``POST /weights/{update}/{index}``), kept in host memory until
``commit`` loads them all at once; the engine runs generation calls and weight loads one at a time,
in the order they came, so no request mixes two versions; each answer carries the version (the
refits taken so far). ``/pause`` holds new generation requests until ``/resume``.
"""

# no `from __future__ import annotations`: FastAPI reads the handlers' annotations (Request) as objects
import argparse
import logging
from typing import Any

log = logging.getLogger("corerl.serve_generation")

#: SkyRL's server entry point, read as main_base's keys
SKYRL_SERVE = "skyrl.train.entrypoints.serve"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="RECIPE_OR_SCRIPT", nargs="?",
                        help="a corerl recipe, or a SkyRL launch script (its serve or training command's keys)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted-key overrides, as for `corerl run`")
    parser.add_argument("--port", type=int, default=8000, help="the port to listen on (default 8000)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="the address to listen on (default 127.0.0.1; 0.0.0.0 for other machines)")
    parser.add_argument("--proxy-for", metavar="URL,URL", default=None,
                        help="serve no engine: pass each generation request on to one of these generation servers in "
                             "turn (SkyRL's external_proxy_url in front of its external_server_urls)")
    parser.add_argument("--dialect", choices=("corerl", "nemo-rl", "skyrl"), help="the recipe's dialect (unset: "
                                                                                  "recognised as for `corerl run`)")


def run(args: argparse.Namespace) -> int:
    from corerl.environments.http_serving import require_server_stack, serve
    from corerl.errors import UsageError

    require_server_stack("corerl serve-generation")
    if (args.config is None) == (args.proxy_for is None):
        raise UsageError("corerl serve-generation serves a recipe's engine or is a proxy: give RECIPE_OR_SCRIPT or "
                         "--proxy-for, one of them", hint="see `corerl serve-generation --help`")
    if args.proxy_for is not None:
        servers = [u.strip().rstrip("/") for u in args.proxy_for.split(",") if u.strip()]
        print(f"corerl serve-generation: a proxy for {', '.join(servers)} on http://{args.host}:{args.port}",
              flush=True)
        serve(build_proxy(servers), host=args.host, port=args.port)
        return 0
    import tempfile

    with tempfile.TemporaryDirectory(prefix="corerl-serve-") as scratch:
        engine, model, backend = start_engine(args.config, list(args.overrides), args.dialect, scratch)
        app = build_app(engine, model=model, backend=backend)
        print(f"corerl serve-generation: {backend} serving {model} on http://{args.host}:{args.port}", flush=True)
        try:
            serve(app, host=args.host, port=args.port)
        finally:
            app.state.worker.shutdown(wait=False)
            engine.shutdown()
    return 0


def load_serving_config(target: str, overrides: list[str], dialect: str | None, host: Any) -> Any:
    """The validated config of a recipe, or of a SkyRL launch script whose command is SkyRL's
    server (its keys read as ``main_base``'s: the model and the inference engine's)."""
    from corerl.config import load_config

    if target.endswith(".sh") and dialect in (None, "skyrl"):
        from corerl.config.dialects.skyrl.entry_points import DEFAULT_MODULE

        words = _serve_command(target)
        if words is not None:  # the engine runs in this process: no training beside it to place it apart from
            return load_config(DEFAULT_MODULE, [*words, "trainer.placement.colocate_all=true", *overrides], host,
                               dialect="skyrl")
    return load_config(target, overrides, host, dialect=dialect)


def _serve_command(path: str) -> list[str] | None:
    """The ``key=value`` words of a SkyRL script's ``-m skyrl.train.entrypoints.serve`` command
    (None: the script starts none), followed as ``corerl run`` follows a script."""
    import os
    from pathlib import Path

    from corerl.config.dialects.skyrl import script
    from corerl.config.dialects.skyrl.entry_points import DEFAULT_MODULE

    class ServeShell(script._Shell):
        def launch(self, fields: list[tuple[str, str]], line: int) -> bool | None:
            if not any(text == SKYRL_SERVE for text, _ in fields):
                return None
            return super().launch([(DEFAULT_MODULE if t == SKYRL_SERVE else t, o) for t, o in fields], line)

    shell = ServeShell(dict(os.environ))
    shell.run_file(Path(path), path, [])
    return None if shell.training is None else [text for text, _ in shell.training[2]]


def start_engine(target: str, overrides: list[str], dialect: str | None, scratch: str) -> tuple[Any, str, str]:
    """The engine the recipe selects, started on its model (a built-in or packaged model built
    or converted into ``scratch`` or corerl's model cache): (engine, model folder, backend id)."""
    from pathlib import Path

    from corerl.config.selection import select
    from corerl.errors import ConfigError
    from corerl.plugin_manager import process_host
    from corerl.run.directory import resolve_policy_model

    host = process_host()
    config = load_serving_config(target, overrides, dialect, host)
    selection = select(config, host)
    registration = selection.generation_backend.registration
    if registration is None or registration.id == "remote":
        raise ConfigError("a generation server needs an engine of its own, and the recipe sends generation to "
                          "other servers", key="policy.generation.backend",
                          hint="serve with policy.generation.backend=hf, or another engine `corerl plugins` lists")
    policy = config.core.policy
    model = resolve_policy_model(policy, Path(scratch))
    if policy.hf_config_overrides:
        from corerl.models.overrides import with_config_overrides

        model = with_config_overrides(model, policy.hf_config_overrides, Path(scratch) / "model_overridden")
    engine = registration.create(config=config)
    engine.load_hf(str(model))
    return engine, str(model), registration.id


def sampling_of(fields: dict[str, Any]) -> Any:
    """:class:`~corerl.generation.contract.SamplingSettings` from its JSON fields (lists back to tuples)."""
    from corerl.generation.contract import SamplingSettings

    return SamplingSettings(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def build_app(engine: Any, *, model: str, backend: str) -> Any:
    """The FastAPI application serving ``engine`` (the protocol: :mod:`corerl.generation.remote`)."""
    import asyncio
    import json
    import time
    import uuid
    from concurrent.futures import ThreadPoolExecutor

    from fastapi import FastAPI, Request
    from fastapi.responses import Response

    from corerl.failures import first_line
    from corerl.generation.remote import model_fingerprint

    app = FastAPI(title="corerl generation server")
    worker = ThreadPoolExecutor(1, thread_name_prefix="engine")  # one engine call at a time, in order
    # checkpoint: the weights are the checkpoint's as loaded (no refit since the start or a /reset)
    state: dict[str, Any] = {"version": 0, "paused": False, "resumed": None, "checkpoint": True}
    server_id = uuid.uuid4().hex[:12]
    fingerprint = model_fingerprint(model)
    staged: dict[str, dict[int, bytes]] = {}

    def answer(content: Any, status: int = 200) -> Response:
        return Response(json.dumps(content), status_code=status, media_type="application/json")

    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception) -> Response:  # one line back to the trainer
        log.exception("%s failed", request.url.path)
        return answer({"error": first_line(exc)}, 400 if isinstance(exc, (ValueError, KeyError, TypeError)) else 500)

    async def run_in_engine(fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(worker, fn, *args)

    @app.get("/info")
    async def info() -> Response:
        return answer({"server_id": server_id, "version": state["version"], "model": model,
                       "fingerprint": fingerprint, "backend": backend, "paused": state["paused"],
                       "checkpoint": state["checkpoint"]})

    @app.get("/health")
    async def health() -> Response:
        return answer({"ok": True})

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        body = await request.json()
        while state["paused"]:
            await state["resumed"].wait()
        sampling = sampling_of(body["sampling"])

        def sample() -> tuple[Any, int]:  # the version read where the weights are: in the engine's thread
            return engine.generate([list(p) for p in body["prompts"]], sampling, int(body.get("n", 1))), state["version"]

        rows, version = await run_in_engine(sample)
        return answer({"server_id": server_id, "version": version,
                       "samples": [[{"completion_ids": list(s.completion_ids), "logprobs": list(s.logprobs),
                                     "finish_reason": s.finish_reason} for s in row] for row in rows]})

    @app.post("/weights/{update}/{index}")
    async def weights_chunk(update: str, index: str, request: Request) -> Response:
        if index == "commit":
            return await commit(update, await request.json())
        staged.setdefault(update, {})[int(index)] = await request.body()
        return answer({"ok": True})

    async def commit(update: str, body: dict[str, Any]) -> Response:
        chunks = staged.pop(update, {})
        if sorted(chunks) != list(range(int(body["chunks"]))):
            raise ValueError(f"refit {update}: {len(chunks)} chunk(s) arrived of {body['chunks']}")

        def load() -> int:
            from safetensors.torch import load

            started = time.monotonic()
            size = sum(len(chunks[i]) for i in chunks)
            engine.update_weights(pair for i in sorted(chunks) for pair in load(chunks[i]).items())
            state["version"] += 1
            state["checkpoint"] = False
            log.warning("refit %d: %.1f MB in %d chunk(s) loaded in %.2f s", state["version"], size / 1e6,
                        len(chunks), time.monotonic() - started)
            return int(state["version"])

        return answer({"server_id": server_id, "version": await run_in_engine(load)})

    @app.post("/reset")
    async def reset() -> Response:  # back to the checkpoint's weights: a new run starts from them
        def reload() -> int:
            engine.load_hf(model)
            state["version"] += 1
            state["checkpoint"] = True
            log.warning("weights %d: the checkpoint's, reloaded from %s", state["version"], model)
            return int(state["version"])

        return answer({"server_id": server_id, "version": await run_in_engine(reload)})

    @app.post("/pause")
    async def pause() -> Response:
        if not state["paused"]:
            state["paused"], state["resumed"] = True, asyncio.Event()
        return answer({"paused": True})

    @app.post("/resume")
    async def resume() -> Response:
        if state["paused"]:
            state["paused"] = False
            state["resumed"].set()
        return answer({"paused": False})

    app.state.worker = worker
    return app


def build_proxy(servers: list[str]) -> Any:
    """A FastAPI application passing each ``/generate`` on to the next of ``servers`` (their answers
    name the server and its weights' version, as the trainer checks) and ``/pause`` and ``/resume``
    to all; it takes no weights (a trainer refits the servers themselves: ``urls``)."""
    import asyncio
    import itertools
    import json

    from fastapi import FastAPI, Request
    from fastapi.responses import Response

    from corerl.errors import CorerlError
    from corerl.generation.remote import call

    app = FastAPI(title="corerl generation proxy")
    turn = itertools.cycle(range(len(servers)))

    def answer(content: Any, status: int = 200) -> Response:
        return Response(json.dumps(content), status_code=status, media_type="application/json")

    async def forward(url: str, path: str, body: Any) -> Response:
        try:
            return answer(await asyncio.get_running_loop().run_in_executor(None, lambda: call(url, path, body)))
        except CorerlError as exc:
            return answer({"error": exc.message}, 502)

    @app.get("/info")
    async def info() -> Response:
        return answer({"proxy": True, "servers": servers})

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        return await forward(servers[next(turn)], "/generate", await request.json())

    @app.post("/pause")
    async def pause() -> Response:
        return answer({"paused": [json.loads((await forward(url, "/pause", {})).body) for url in servers]})

    @app.post("/resume")
    async def resume() -> Response:
        return answer({"resumed": [json.loads((await forward(url, "/resume", {})).body) for url in servers]})

    return app
