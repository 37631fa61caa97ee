"""An OpenAI-compatible chat-completions endpoint served from the generation engine during
rollouts, so that any agent harness that speaks the OpenAI API is an environment.

Each episode gets its own base URL (``http://127.0.0.1:<port>/episodes/<id>/v1``) and the run's
token (``Authorization: Bearer <token>``; anything else is refused with 401); the server
listens on loopback only. Every call is recorded in token ids: the messages are rendered with the
tokenizer's chat template; when a call's messages extend the episode's previous call (its
messages, then the assistant message this endpoint returned, then new ones), the new messages
are appended as tokens after the exact ids sampled before (the assistant's text is never
re-tokenized), so the episode's trajectory is one token sequence whose model tokens are exactly
those sampled, with their logprobs. A call that does not extend the previous one starts a new
chain (counted); the episode's trajectory is its last chain.

Concurrent calls are answered in batches: a single thread owns the generation engine and
answers every call waiting when it is free with one ``generate`` call. Once a call is waiting, the
thread waits up to :data:`GATHER_S` more for the other open episodes' calls (it stops waiting as
soon as every open episode has one queued), so episodes that call at about the same time share a
batch even on a busy machine, where their HTTP requests are parsed one after another.

Served with FastAPI and uvicorn (:mod:`corerl.environments.http_serving`) on a thread of the
run's process. Limits (docs/security.md): a request body over ``max_request_bytes`` is refused
with 413 before it is read (neither library limits a body's size: the route checks it); a body
that is not a JSON object is refused with 400; uvicorn's listen backlog is :data:`LISTEN_BACKLOG`,
so a burst of calls waits rather than being reset. Each call in progress has a thread of its own
(it waits there for the engine's next batch); rendering and tokenizing a call's messages happen
under its episode's own lock (an episode's calls stay in order), never under one all episodes share.
"""

from __future__ import annotations

import json
import queue
import secrets
import threading
import time
from collections.abc import Sequence
from typing import Any

import attrs

from corerl.environments.daemon_threads import DaemonThreadExecutor
from corerl.environments.encoding import ObservationEncoder
from corerl.environments.http_serving import BackgroundServer, require_server_stack
from corerl.generation.contract import Sample, SamplingSettings
from corerl.reporting.lost_text import check_observation

MODEL_NAME = "corerl-policy"
LISTEN_BACKLOG = 1024  # connections the kernel queues before the server accepts them (uvicorn's backlog)
CALL_THREADS = 1024  # calls in progress at once, each waiting in a thread for its answer; more wait for a thread
GATHER_S = 0.05  # after a batch's first call, how long the engine waits for the other open episodes' calls
KEEP_ALIVE_S = 30  # an idle connection of a harness (between its calls, tools running) stays open this long


def default_max_request_bytes(max_seq_length: int) -> int:
    """The largest request body taken: room for ``max_seq_length`` tokens of JSON-escaped text
    (64 bytes a token) plus 64 KiB of tool schemas and fields; no larger body fits the episode."""
    return 64 * 1024 + 64 * max_seq_length


@attrs.define
class Chain:
    """One token sequence of an episode: the first call's prompt, then everything after it."""

    prompt: list[int]
    messages: list[dict[str, Any]]
    ids: list[int] = attrs.field(factory=list)
    mask: list[int] = attrs.field(factory=list)
    logprobs: list[float] = attrs.field(factory=list)
    finish: str = "stop"
    routes: Any = None  # the last call's routed experts (r3): its prompt is every token before it

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.ids

    def sample(self) -> Sample:
        return Sample(prompt_ids=tuple(self.prompt), completion_ids=tuple(self.ids), logprobs=tuple(self.logprobs),
                      finish_reason="stop" if self.finish == "stop" else "length", completion_mask=tuple(self.mask),
                      routed_experts=self.routes)


@attrs.define
class EpisodeRecord:
    """What the endpoint recorded of one episode's calls."""

    chains: list[Chain] = attrs.field(factory=list)
    calls: int = 0
    hit_length_limit: bool = False
    lost_text: int = 0  # messages whose encoding lost text (corerl.reporting.lost_text)
    lock: threading.Lock = attrs.field(factory=threading.Lock, eq=False, repr=False)  # one call of the episode at a time
    closed: bool = False  # set under lock by close_episode: a late call changes nothing after it


@attrs.define
class _Call:
    episode: str
    tokens: list[int]
    max_new_tokens: int
    done: threading.Event = attrs.field(factory=threading.Event)
    sample: Sample | None = None
    error: BaseException | None = None


def _strip(message: dict[str, Any]) -> dict[str, Any]:
    return {k: message[k] for k in ("role", "content", "tool_calls", "name", "tool_call_id") if k in message}


class ChatEndpoint:
    """The endpoint over ``generation`` (see the module's docstring); ``sampling`` is the run's
    (a request's own temperature is not used: training samples on-policy), each call's
    ``max_tokens`` is honoured within it and within ``max_seq_length``. ``name`` says whose
    messages lost text in encoding, in the one warning about it (``environment 'x'``)."""

    def __init__(self, generation: Any, tokenizer: Any, sampling: SamplingSettings, max_seq_length: int,
                 max_request_bytes: int | None = None, name: str = "the agent endpoint") -> None:
        require_server_stack("the agent endpoint (an environment that plays an agent harness)", key="data.env_name")
        if not getattr(tokenizer, "chat_template", None):
            from corerl.errors import ConfigError

            raise ConfigError("the OpenAI-compatible endpoint renders chat messages with the tokenizer's chat template, "
                              "and this tokenizer has none", key="policy.chat_template",
                              hint="set policy.chat_template (a Jinja template), or use a model whose tokenizer has one")
        self.generation, self.tokenizer, self.sampling = generation, tokenizer, sampling
        self.max_seq_length = max_seq_length
        self.max_request_bytes = max_request_bytes  # None: default_max_request_bytes(max_seq_length)
        self.name = name
        self.encoder = ObservationEncoder(tokenizer)
        self.token = secrets.token_urlsafe(24)
        self.episodes: dict[str, EpisodeRecord] = {}
        self.lock = threading.Lock()  # guards the episodes' dict only
        self.calls: queue.Queue[_Call] = queue.Queue()
        self.batches = 0
        self._stopping = False
        self._engine_thread = threading.Thread(target=self._generate_loop, name="corerl-endpoint-engine", daemon=True)
        self._engine_thread.start()
        # daemon threads: a call still waiting when the run ends never keeps the process alive
        self._call_threads = DaemonThreadExecutor(CALL_THREADS, "corerl-endpoint-call")
        # no limit_concurrency (uvicorn's 503 past it): a burst is queued in the backlog, never refused
        self.server = BackgroundServer(_app(self), backlog=LISTEN_BACKLOG, timeout_keep_alive=KEEP_ALIVE_S,
                                       name="corerl-endpoint")
        self.port = self.server.port

    # -- episodes ----------------------------------------------------------------------------

    def open_episode(self) -> str:
        """A new episode id; its base URL is :meth:`base_url`."""
        episode = secrets.token_hex(8)
        with self.lock:
            self.episodes[episode] = EpisodeRecord()
        return episode

    def base_url(self, episode: str) -> str:
        return f"http://127.0.0.1:{self.port}/episodes/{episode}/v1"

    def close_episode(self, episode: str) -> EpisodeRecord:
        """The episode's record, final: a call of it still in progress ends first, later ones get 404."""
        with self.lock:
            record = self.episodes.pop(episode)
        with record.lock:
            record.closed = True
        return record

    def body_limit(self) -> int:
        """The largest request body this endpoint reads, in bytes."""
        return self.max_request_bytes or default_max_request_bytes(self.max_seq_length)

    # -- answering a call --------------------------------------------------------------------

    def chat(self, episode: str, request: dict[str, Any]) -> dict[str, Any]:
        """Answer one chat-completions request of ``episode`` (OpenAI's response shape)."""
        raw = request.get("messages")
        if not isinstance(raw, list) or not raw or not all(isinstance(m, dict) for m in raw):
            raise ValueError("messages must be a non-empty list of message objects")
        messages = [_strip(m) for m in raw]
        with self.lock:
            record = self.episodes.get(episode)
        if record is None:
            raise KeyError(episode)
        with record.lock:  # this episode's calls in order; other episodes' calls go on meanwhile
            if record.closed:
                raise KeyError(episode)
            return self._answer(episode, record, messages, request)

    def _answer(self, episode: str, record: EpisodeRecord, messages: list[dict[str, Any]],
                request: dict[str, Any]) -> dict[str, Any]:
        chain = self._extend(record, messages)
        record.calls += 1
        room = self.max_seq_length - len(chain.tokens)
        if room < 1:
            record.hit_length_limit = True
            raise OverflowError(f"the conversation is {len(chain.tokens)} tokens, policy.max_seq_length is "
                                f"{self.max_seq_length}")
        wanted = request.get("max_completion_tokens") or request.get("max_tokens") or self.sampling.max_new_tokens
        call = _Call(episode, chain.tokens, max(1, min(int(wanted), self.sampling.max_new_tokens, room)))
        self.calls.put(call)
        call.done.wait()
        if call.error is not None:
            raise call.error
        assert call.sample is not None
        sample = call.sample
        text = self.tokenizer.decode(list(sample.completion_ids), skip_special_tokens=True)
        chain.ids += sample.completion_ids
        chain.mask += [1] * len(sample.completion_ids)
        chain.routes = sample.routed_experts
        chain.logprobs += sample.logprobs
        chain.finish = sample.finish_reason
        chain.messages = [*messages, {"role": "assistant", "content": text}]
        if len(chain.tokens) >= self.max_seq_length:
            record.hit_length_limit = True
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                  "finish_reason": sample.finish_reason}
        if request.get("logprobs"):
            tokens = self.tokenizer.convert_ids_to_tokens(list(sample.completion_ids))
            choice["logprobs"] = {"content": [{"token": t, "logprob": lp, "bytes": None, "top_logprobs": []}
                                              for t, lp in zip(tokens, sample.logprobs, strict=True)]}
        return {"id": f"chatcmpl-{secrets.token_hex(6)}", "object": "chat.completion", "created": int(time.time()),
                "model": MODEL_NAME, "choices": [choice],
                "usage": {"prompt_tokens": len(call.tokens), "completion_tokens": len(sample.completion_ids),
                          "total_tokens": len(call.tokens) + len(sample.completion_ids)}}

    def _extend(self, record: EpisodeRecord, messages: list[dict[str, Any]]) -> Chain:
        """The chain this call continues (its new messages appended as tokens), or a new one."""
        last = record.chains[-1] if record.chains else None
        if last is not None and len(messages) > len(last.messages) and messages[: len(last.messages)] == last.messages:
            text = self.encoder.text_of(messages[len(last.messages):], ended_with_stop=last.finish == "stop")
            observation = self._encode(record, text)
            last.ids += observation
            last.mask += [0] * len(observation)
            last.logprobs += [0.0] * len(observation)
            return last
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        chain = Chain(prompt=self._encode(record, text), messages=messages)
        record.chains.append(chain)
        return chain

    def _encode(self, record: EpisodeRecord, text: str) -> list[int]:
        """The ids of ``text``, counted in the episode's ``lost_text`` when encoding lost any of it."""
        ids = self.encoder.encode_text(text)
        if check_observation(self.tokenizer, self.name, text, ids):
            record.lost_text += 1
        return ids

    def _generate_loop(self) -> None:
        """The engine's one thread: every call waiting is answered by one ``generate``."""
        while not self._stopping:
            try:
                first = self.calls.get(timeout=0.1)
            except queue.Empty:
                continue
            batch = [first]
            deadline = time.monotonic() + GATHER_S
            while True:
                with self.lock:
                    if len(batch) >= len(self.episodes):
                        break
                try:
                    batch.append(self.calls.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            try:
                settings = attrs.evolve(self.sampling, max_new_tokens=max(c.max_new_tokens for c in batch),
                                        seed=None if self.sampling.seed is None else self.sampling.seed + self.batches)
                self.batches += 1
                groups = self.generation.generate([c.tokens for c in batch], settings, n=1)
                for call, group in zip(batch, groups, strict=True):
                    sample = group[0]
                    if len(sample.completion_ids) > call.max_new_tokens:
                        sample = attrs.evolve(sample, completion_ids=sample.completion_ids[: call.max_new_tokens],
                                              logprobs=sample.logprobs[: call.max_new_tokens], finish_reason="length")
                    call.sample = sample
            except BaseException as exc:  # handed to every waiting request: it fails there, in the agent's episode
                for call in batch:
                    call.error = exc
            for call in batch:
                call.done.set()

    def respond(self, episode: str, body: bytes) -> tuple[int, dict[str, Any]]:
        """The HTTP status and JSON answer to a chat-completions request body of ``episode``."""
        try:
            request = json.loads(body or b"{}")
            if not isinstance(request, dict):
                raise ValueError(f"the request body must be a JSON object, not a JSON {type(request).__name__}")
            if request.get("stream"):
                raise ValueError("streaming is not supported: call with stream=false")
            if int(request.get("n", 1)) != 1:
                raise ValueError("n must be 1: each episode samples one answer per call")
            return 200, self.chat(episode, request)
        except KeyError:
            return _error(404, f"no open episode {episode}", "invalid_request_error")
        except OverflowError as exc:
            return _error(400, f"{exc}: the episode is out of tokens", "context_length_exceeded")
        except (ValueError, TypeError) as exc:
            return _error(400, str(exc), "invalid_request_error")
        except Exception as exc:  # the engine failed: the agent's call fails, the rollout reports it
            return _error(500, f"{type(exc).__name__}: {exc}", "server_error")

    def shutdown(self) -> None:
        self._stopping = True
        self.server.stop()
        self._call_threads.shutdown(cancel_futures=True)


def _error(status: int, message: str, kind: str) -> tuple[int, dict[str, Any]]:
    return status, {"error": {"message": message, "type": kind, "code": status}}


def _app(endpoint: ChatEndpoint) -> Any:
    """The endpoint's FastAPI application: its two routes, behind the run's token."""
    import asyncio

    from fastapi import FastAPI
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import Response

    def answer(status: int, payload: dict[str, Any]) -> Response:
        return Response(json.dumps(payload), status_code=status, media_type="application/json")

    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)  # two routes for harnesses, no schema pages

    @app.exception_handler(HTTPException)
    async def no_route(request: Request, exc: HTTPException) -> Response:  # unknown path, or a route's other method
        return answer(*_error(404, f"no route {request.url.path}", "invalid_request_error"))

    async def models(request: Request) -> Response:
        return answer(200, {"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "owned_by": "corerl"}]})

    async def chat_completions(request: Request) -> Response:
        episode, limit = request.path_params["episode"], endpoint.body_limit()
        # neither uvicorn nor FastAPI limits a body's size. A body announced over the limit is
        # refused before a byte of it is read; uvicorn reads and drops what the client still sends,
        # so the client reads the 413 rather than a reset connection. A body sent without a length
        # (chunked) is counted as it arrives. (uvicorn refuses a Content-Length that is no number.)
        length = request.headers.get("content-length")
        if length is not None and int(length) > limit:
            return answer(*_too_large(f"{length} bytes", limit))
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                return answer(*_too_large(f"at least {len(body)} bytes", limit))
        loop = asyncio.get_running_loop()
        return answer(*await loop.run_in_executor(endpoint._call_threads, endpoint.respond, episode, bytes(body)))

    app.add_route("/episodes/{episode}/v1/models", models, methods=["GET"])
    app.add_route("/episodes/{episode}/v1/chat/completions", chat_completions, methods=["POST"])
    app.add_middleware(_TokenCheck, token=endpoint.token, refusal=answer(
        *_error(401, "missing or wrong API key (the run's token)", "authentication_error")))
    return app


def _too_large(size: str, limit: int) -> tuple[int, dict[str, Any]]:
    return _error(413, f"the request body is {size}, over this endpoint's {limit} (env.openai_agent.max_request_bytes)"
                       ": the conversation cannot fit policy.max_seq_length anyway", "invalid_request_error")


class _TokenCheck:
    """ASGI middleware: a request without the run's token gets ``refusal`` (401), whatever its path."""

    def __init__(self, app: Any, token: str, refusal: Any) -> None:
        self.app, self.expected, self.refusal = app, f"Bearer {token}".encode(), refusal

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = next((value for name, value in scope["headers"] if name == b"authorization"), b"")
            if not secrets.compare_digest(given, self.expected):
                await self.refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


@attrs.frozen
class AgentClient:
    """What an agent harness gets to reach the policy: an OpenAI client's ``base_url``,
    ``api_key`` and ``model``."""

    base_url: str
    api_key: str
    model: str = MODEL_NAME


def trajectories(records: Sequence[EpisodeRecord]) -> list[Chain | None]:
    """Each episode's trajectory: its last chain (None when the harness made no call)."""
    return [record.chains[-1] if record.chains else None for record in records]
