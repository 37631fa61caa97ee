"""``corerl serve``'s state and operations, apart from HTTP: :class:`Service` holds the sessions,
training models, sampling sessions and saved weights on disk of every tenant (an API key), and
turns each request's fields into engine calls run by the :class:`~corerl.run.tinker.futures.Scheduler`;
:mod:`corerl.run.tinker.server` is the FastAPI application around it (issue 76; docs/serve.md).

Errors come back in the SDK's shape, one line each: a failed future is ``{"error", "category"}``
(``RequestFailedError`` in the SDK), ``user`` for a request this server refuses and ``server`` for
a failure of its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corerl.run.tinker import wire
from corerl.run.tinker.engine import SERVER, USER, LoraSpec, ServiceError, TinkerEngine
from corerl.run.tinker.futures import ERROR, JSON, PROTO, FutureTable, Outcome, Scheduler

log = logging.getLogger("corerl.serve")

API = "/api/v1"
#: the sidecar beside each saved state or sampler export: which model, base model and spec
SIDECAR = "tinker.json"


@dataclass(frozen=True)
class Limits:
    """What one server takes at most (docs/serve.md, "Limits")."""

    max_body_bytes: int = 64 * 1024 * 1024
    poll_seconds: float = 20.0  # how long retrieve_future holds a pending request (the SDK waits 45 s)
    max_queued: int = 256  # requests waiting for the engine; more are answered 429 (the SDK backs off)
    max_sample_tokens: int = 2048  # max_tokens when a sample leaves it out, and its most
    session_timeout: float = 600.0  # a session silent this long (no heartbeat) ends: its adapters are freed
    live_samplers_kept: int = 8  # per model: save_weights_and_get_sampling_client's unnamed exports kept
    gap_seconds: float = 60.0  # how long a missing seq_id holds a model's later requests


@dataclass
class _Session:
    tenant: str
    session_id: str
    last_seen: float
    models: set[str] = field(default_factory=set)


@dataclass
class _Model:
    tenant: str
    session_id: str
    model_id: str
    base_model: str
    spec: LoraSpec
    ready: bool = False
    created_by: str | None = None  # the request id of its create_model or load_weights (a resend gets it again)
    live_samplers: list[tuple[str, Path]] = field(default_factory=list)  # (sampling session id, folder)


@dataclass
class _Sampler:
    tenant: str
    sampler_id: str
    base_model: str
    model_path: str | None
    weights: Path | None  # the exported sampler folder; None samples the base model


def tenant_of(key: str) -> str:
    """A key's tenant: a name for its folder that does not reveal the key."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


class Service:
    """Sessions, models and samplers of every tenant over one engine; no HTTP here."""

    def __init__(self, engine: TinkerEngine, state_dir: Path, limits: Limits = Limits(),
                 base_names: tuple[str, ...] = ()) -> None:
        self.engine = engine
        self.state_dir = Path(state_dir)
        self.limits = limits
        self.table = FutureTable()
        self.scheduler = Scheduler(self.table, gap_seconds=limits.gap_seconds)
        model_path = getattr(engine, "model_path", None)
        self.tokenizer_id = str(model_path) if model_path is not None else \
            getattr(engine.tokenizer, "name_or_path", None) or None
        self.base_names = {engine.base_model, *base_names} | ({str(model_path)} if model_path is not None else set())
        self.sessions: dict[str, _Session] = {}
        self.models: dict[str, _Model] = {}
        self.samplers: dict[str, _Sampler] = {}
        self._lock = threading.RLock()

    # -- life --

    def start(self) -> None:
        self.scheduler.start()

    def stop(self) -> None:
        self.scheduler.stop()

    def reap(self, now: float | None = None) -> list[str]:
        """End the sessions silent longer than ``session_timeout``; their ids."""
        now = time.monotonic() if now is None else now
        with self._lock:
            stale = [s.session_id for s in self.sessions.values() if now - s.last_seen > self.limits.session_timeout]
        for session_id in stale:
            log.warning("session %s sent nothing for %.0f s: ended, its adapters freed", session_id,
                        self.limits.session_timeout)
            self.end_session(session_id)
        return stale

    def end_session(self, session_id: str) -> None:
        with self._lock:
            session = self.sessions.pop(session_id, None)
            if session is None:
                return
            models = [self.models.pop(m) for m in session.models if m in self.models]
            for sampler in [s for s in self.samplers.values() if s.sampler_id.startswith(session_id + ":")]:
                del self.samplers[sampler.sampler_id]
        for model in models:
            for request_id in self.scheduler.close_model(model.model_id):
                self.table.resolve(request_id, _error(USER, f"{model.model_id}'s session ended"))

            def delete(model_id: str = model.model_id) -> Outcome:
                with contextlib.suppress(ServiceError):
                    self.engine.delete(model_id)
                return Outcome(JSON, {})

            self.scheduler.unordered(session.tenant, "delete_model", delete)

    # -- lookups (each refuses another tenant's object as if it did not exist) --

    def session(self, tenant: str, session_id: Any, where: str) -> _Session:
        with self._lock:
            session = self._owned(self.sessions, session_id, tenant)
            if session is None:
                raise wire.refuse(where, f"no session {session_id!r} for this API key (it ended, or the server "
                                         "restarted); make a new ServiceClient")
            self._seen(session_id)
            return session

    def model(self, tenant: str, model_id: Any, where: str) -> _Model:
        with self._lock:
            model = self._owned(self.models, model_id, tenant)
            if model is None:
                raise wire.refuse(where, f"no training model {model_id!r} for this API key")
            self._seen(model.session_id)
            return model

    def sampler(self, tenant: str, sampler_id: Any, where: str) -> _Sampler:
        with self._lock:
            sampler = self._owned(self.samplers, sampler_id, tenant)
            if sampler is None:
                raise wire.refuse(where, f"no sampling session {sampler_id!r} for this API key (it ended, or its "
                                         "weights were replaced by newer ones); make a new sampling client")
            self._seen(sampler_id.split(":", 1)[0])
            return sampler

    @staticmethod
    def _owned(table: dict[str, Any], key: Any, tenant: str) -> Any:
        """``table[key]`` where ``key`` is a string naming an object of ``tenant``, else None (another
        tenant's object is not found, as one that does not exist)."""
        found = table.get(key) if isinstance(key, str) else None
        return found if found is not None and found.tenant == tenant else None

    def _seen(self, session_id: str) -> None:
        """The session (where it is still open) was used now (under :attr:`_lock`)."""
        if session_id in self.sessions:
            self.sessions[session_id].last_seen = time.monotonic()

    def checked_base(self, name: Any, where: str) -> str:
        if name not in self.base_names:
            raise wire.refuse(where, f"{name!r} is not served here; this server trains and samples "
                                     f"{self.engine.base_model!r}")
        return str(name)

    # -- saved weights on disk: <state dir>/<tenant>/<session>/train-<n>/<kind>/<name>/ --

    def folder(self, tenant: str, path: wire.CheckpointPath) -> Path:
        return self.state_dir / tenant / path.session_id / f"train-{path.model_seq}" / path.kind / path.name

    def saved(self, tenant: str, text: Any, where: str, kind: str) -> tuple[wire.CheckpointPath, Path, dict[str, Any]]:
        """A tinker:// path of this tenant: the parsed path, its folder, its sidecar."""
        path = wire.parse_path(text, where)
        if path.kind != kind:
            wanted = "save_state" if kind == "weights" else "save_weights_for_sampler"
            raise wire.refuse(where, f"{path} is a {path.kind.replace('_', ' ')} path; this takes a path "
                                     f"{wanted} returned (tinker://<model id>/{kind}/<name>)")
        folder = self.folder(tenant, path)
        try:
            sidecar = json.loads((folder / SIDECAR).read_text())
        except (OSError, ValueError):
            raise wire.refuse(where, f"{path} is not this client's: nothing was saved under that name with "
                                     "this API key") from None
        return path, folder, sidecar

    def _write_saved(self, tenant: str, path: wire.CheckpointPath, model: _Model,
                     write: Callable[[Path], None], overwrite: bool, where: str) -> None:
        """Write a save into a scratch folder beside its place, then move it there (a crash leaves
        no half save under the name)."""
        target = self.folder(tenant, path)
        if target.exists() and not overwrite:
            raise wire.refuse(where, f"{path} exists; save under another name, or pass overwrite=True")
        scratch = target.parent / f".partial-{uuid.uuid4().hex}"
        scratch.mkdir(parents=True)
        try:
            write(scratch / "engine")
            (scratch / SIDECAR).write_text(json.dumps({
                "path": str(path), "model_id": model.model_id, "base_model": model.base_model,
                "lora": {"rank": model.spec.rank, "train_mlp": model.spec.train_mlp,
                         "train_attn": model.spec.train_attn, "train_unembed": model.spec.train_unembed,
                         "seed": model.spec.seed}}, indent=1))
            if target.exists():
                shutil.rmtree(target)
            scratch.rename(target)
        finally:
            if scratch.exists():
                shutil.rmtree(scratch, ignore_errors=True)

    # -- submitting --

    def _submit_check(self) -> None:
        if self.scheduler.queued() >= self.limits.max_queued:
            raise Backpressure(f"{self.limits.max_queued} requests are waiting for the engine, this server's "
                               "most; the SDK retries")

    def failed(self, tenant: str, kind: str, exc: ServiceError) -> dict[str, Any]:
        request_id = self.table.create(tenant, kind)
        self.table.resolve(request_id, _error(exc.category, exc.message))
        return {"request_id": request_id}

    def on_model(self, tenant: str, kind: str, body: wire.Fields, call: Callable[[_Model, wire.Fields], Outcome]
                 ) -> dict[str, Any]:
        """A request on a training model (``model_id``, ``seq_id``), run in its seq_id turn."""
        self._submit_check()
        try:
            model = self.model(tenant, body.str("model_id"), f"{kind}.model_id")
            seq_id = body.int("seq_id", minimum=0)
        except ServiceError as exc:
            return self.failed(tenant, kind, exc)
        request_id = self.scheduler.ordered(tenant, kind, model.model_id, seq_id,
                                            lambda: call(model, body))
        return {"request_id": request_id, "model_id": model.model_id}

    # -- endpoints --

    def create_session(self, tenant: str, body: Any) -> dict[str, Any]:
        wire.Fields(body, "create_session")
        session_id = uuid.uuid4().hex
        with self._lock:
            self.sessions[session_id] = _Session(tenant, session_id, time.monotonic())
        log.info("session %s opened", session_id)
        return {"session_id": session_id}

    def heartbeat(self, tenant: str, body: Any) -> dict[str, Any]:
        fields = wire.Fields(body, "session_heartbeat")
        self.session(tenant, fields.str("session_id"), "session_heartbeat.session_id")
        return {}

    def create_model(self, tenant: str, body: Any) -> dict[str, Any]:
        self._submit_check()
        fields = wire.Fields(body, "create_model")
        try:
            session = self.session(tenant, fields.str("session_id"), "create_model.session_id")
            seq = fields.int("model_seq_id", minimum=0)
            base = self.checked_base(fields.str("base_model"), "create_model.base_model")
            spec = wire.lora_spec(fields)
        except ServiceError as exc:
            return self.failed(tenant, "create_model", exc)
        model_id = wire.model_id(session.session_id, seq)
        with self._lock:
            if model_id in self.models:
                return self._again(tenant, "create_model", self.models[model_id])
            model = _Model(tenant, session.session_id, model_id, base, spec)
            self.models[model_id] = model
            session.models.add(model_id)
        self.scheduler.open_model(model_id)

        def create() -> Outcome:
            try:
                self.engine.create(model_id, spec)
            except BaseException:
                self._forget_model(model_id)
                raise
            model.ready = True
            log.info("%s: a rank-%d adapter on %s", model_id, spec.rank, base)
            return Outcome(JSON, {"model_id": model_id})

        model.created_by = self.scheduler.unordered(tenant, "create_model", create)
        return {"request_id": model.created_by, "model_id": model_id}

    def _again(self, tenant: str, kind: str, model: _Model) -> dict[str, Any]:
        """A create or load resent for a model that exists: its first request's future (the SDK
        resends a request whose answer it lost), or a refusal if it was made some other way."""
        if model.tenant == tenant and model.created_by is not None and self.table.kind(model.created_by) == kind:
            return {"request_id": model.created_by, "model_id": model.model_id}
        return self.failed(tenant, kind, wire.refuse(f"{kind}.model_seq_id", f"{model.model_id} exists already"))

    def _forget_model(self, model_id: str) -> None:
        with self._lock:
            model = self.models.pop(model_id, None)
            if model is not None and model.session_id in self.sessions:
                self.sessions[model.session_id].models.discard(model_id)
        for request_id in self.scheduler.close_model(model_id):
            self.table.resolve(request_id, _error(USER, f"{model_id} was not created"))

    def get_info(self, tenant: str, body: Any) -> dict[str, Any]:
        fields = wire.Fields(body, "get_info")
        model = self.model(tenant, fields.str("model_id"), "get_info.model_id")
        model_data: dict[str, Any] = {"model_name": model.base_model}
        if self.tokenizer_id:
            model_data["tokenizer_id"] = self.tokenizer_id
        return {"model_id": model.model_id, "model_data": model_data, "is_lora": True, "lora_rank": model.spec.rank,
                "optimizer_config": {"type": "adamw"}, "type": "get_info"}

    def forward_backward(self, tenant: str, raw: bytes, content_encoding: str | None) -> dict[str, Any]:
        self._submit_check()
        message = wire.read_forward_backward(raw, content_encoding)
        kind = "forward" if message.forward_only else "forward_backward"
        try:
            model = self.model(tenant, message.model_id, f"{kind}.model_id")
        except ServiceError as exc:
            return self.failed(tenant, kind, exc)

        def run() -> Outcome:
            call = wire.forward_backward_call(message)
            step = self.engine.forward if call.forward_only else self.engine.forward_backward
            return Outcome(PROTO, wire.forward_output_bytes(step(model.model_id, call.data, call.loss_fn,
                                                                 call.loss_fn_config)))

        request_id = self.scheduler.ordered(tenant, kind, model.model_id, int(message.seq_id), run)
        return {"request_id": request_id, "model_id": model.model_id}

    def optim_step(self, tenant: str, body: Any) -> dict[str, Any]:
        def run(model: _Model, fields: wire.Fields) -> Outcome:
            metrics = self.engine.optim_step(model.model_id, wire.adam_params(fields))
            return Outcome(JSON, {"metrics": {k: float(v) for k, v in metrics.items()}, "type": "optim_step"})

        return self.on_model(tenant, "optim_step", wire.Fields(body, "optim_step"), run)

    def save_weights(self, tenant: str, body: Any) -> dict[str, Any]:
        def run(model: _Model, fields: wire.Fields) -> Outcome:
            name = wire.checked_name(fields.str("path"), "save_weights.path")
            path = wire.checkpoint_path(model.model_id, "weights", name)
            self._write_saved(tenant, path, model, lambda folder: self.engine.save_state(model.model_id, folder, True),
                              fields.bool("overwrite", False), "save_weights.path")
            return Outcome(JSON, {"path": str(path), "type": "save_weights"})

        return self.on_model(tenant, "save_weights", wire.Fields(body, "save_weights"), run)

    def load_weights(self, tenant: str, body: Any) -> dict[str, Any]:
        fields = wire.Fields(body, "load_weights")
        if fields.body.get("session_id") is None:  # into an existing model (TrainingClient.load_state)
            def run(model: _Model, fields: wire.Fields) -> Outcome:
                path, folder, sidecar = self.saved(tenant, fields.str("path"), "load_weights.path", "weights")
                self.engine.load_state(model.model_id, folder / "engine", fields.bool("optimizer", False))
                model.spec = _spec_of(sidecar)
                return Outcome(JSON, {"path": str(path), "model_id": model.model_id, "type": "load_weights"})

            return self.on_model(tenant, "load_weights", fields, run)
        # a new model from a saved state (ServiceClient.create_training_client_from_state[_with_optimizer])
        self._submit_check()
        try:
            session = self.session(tenant, fields.str("session_id"), "load_weights.session_id")
            seq = fields.int("model_seq_id", minimum=0)
            path, folder, sidecar = self.saved(tenant, fields.str("path"), "load_weights.path", "weights")
            optimizer = fields.bool("optimizer", False)
            wire.optimizer_type(fields, "optimizer_config")
        except ServiceError as exc:
            return self.failed(tenant, "load_weights", exc)
        model_id = wire.model_id(session.session_id, seq)
        with self._lock:
            if model_id in self.models:
                return self._again(tenant, "load_weights", self.models[model_id])
            model = _Model(tenant, session.session_id, model_id, str(sidecar.get("base_model")), _spec_of(sidecar))
            self.models[model_id] = model
            session.models.add(model_id)
        self.scheduler.open_model(model_id)

        def load() -> Outcome:
            try:
                self.engine.load_state(model_id, folder / "engine", optimizer)
            except BaseException:
                self._forget_model(model_id)
                raise
            model.ready = True
            log.info("%s: loaded from %s%s", model_id, path, " with its optimizer" if optimizer else "")
            return Outcome(JSON, {"path": str(path), "model_id": model_id, "type": "load_weights"})

        model.created_by = self.scheduler.unordered(tenant, "load_weights", load)
        return {"request_id": model.created_by, "model_id": model_id}

    def save_weights_for_sampler(self, tenant: str, body: Any) -> dict[str, Any]:
        def run(model: _Model, fields: wire.Fields) -> Outcome:
            name = fields.body.get("path")
            if name is not None:  # named: a tinker:// path for create_sampling_client
                name = wire.checked_name(name, "save_weights_for_sampler.path")
                path = wire.checkpoint_path(model.model_id, "sampler_weights", name)
                self._write_saved(tenant, path, model, lambda f: self.engine.export_sampler(model.model_id, f), True,
                                  "save_weights_for_sampler.path")
                return Outcome(JSON, {"path": str(path), "type": "save_weights_for_sampler"})
            # unnamed (save_weights_and_get_sampling_client): a sampling session on these weights
            seq = fields.int("sampling_session_seq_id", minimum=0)
            sampler_id = wire.sampler_id(model.session_id, seq)
            folder = (self.state_dir / tenant / model.session_id / f"train-{model.model_id.rsplit(':', 1)[1]}"
                      / "live_samplers" / str(seq))
            if folder.exists():
                shutil.rmtree(folder)
            self.engine.export_sampler(model.model_id, folder)
            with self._lock:
                self.samplers[sampler_id] = _Sampler(tenant, sampler_id, model.base_model, None, folder)
                model.live_samplers.append((sampler_id, folder))
                while len(model.live_samplers) > self.limits.live_samplers_kept:
                    old_id, old_folder = model.live_samplers.pop(0)
                    self.samplers.pop(old_id, None)
                    shutil.rmtree(old_folder, ignore_errors=True)
            return Outcome(JSON, {"sampling_session_id": sampler_id, "type": "save_weights_for_sampler"})

        return self.on_model(tenant, "save_weights_for_sampler", wire.Fields(body, "save_weights_for_sampler"), run)

    def create_sampling_session(self, tenant: str, body: Any) -> dict[str, Any]:
        fields = wire.Fields(body, "create_sampling_session")
        session = self.session(tenant, fields.str("session_id"), "create_sampling_session.session_id")
        seq = fields.int("sampling_session_seq_id", minimum=0)
        model_path = fields.str("model_path", required=False)
        if model_path is not None:
            path, folder, sidecar = self.saved(tenant, model_path, "create_sampling_session.model_path",
                                               "sampler_weights")
            sampler = _Sampler(tenant, wire.sampler_id(session.session_id, seq), str(sidecar.get("base_model")),
                               str(path), folder / "engine")
        else:
            base = self.checked_base(fields.str("base_model"), "create_sampling_session.base_model")
            sampler = _Sampler(tenant, wire.sampler_id(session.session_id, seq), base, None, None)
        with self._lock:
            self.samplers[sampler.sampler_id] = sampler
        return {"sampling_session_id": sampler.sampler_id, "type": "create_sampling_session"}

    def get_sampler(self, tenant: str, sampler_id: str) -> dict[str, Any]:
        sampler = self.sampler(tenant, sampler_id, "samplers")
        answer = {"sampler_id": sampler.sampler_id, "base_model": sampler.base_model}
        if sampler.model_path is not None:
            answer["model_path"] = sampler.model_path
        return answer

    def asample(self, tenant: str, body: Any) -> dict[str, Any]:
        self._submit_check()
        fields = wire.Fields(body, "asample")
        count = body.get("num_samples", 1) if isinstance(body, dict) else 1
        ids = [uuid.uuid4().hex for _ in range(count if isinstance(count, int) and 0 < count <= 4096 else 1)]
        try:
            sampler_id = fields.str("sampling_session_id", required=False)
            if sampler_id is not None:
                sampler = self.sampler(tenant, sampler_id, "asample.sampling_session_id")
            elif fields.body.get("model_path") is not None:
                path, folder, sidecar = self.saved(tenant, fields.str("model_path"), "asample.model_path",
                                                   "sampler_weights")
                sampler = _Sampler(tenant, "", str(sidecar.get("base_model")), str(path), folder / "engine")
            else:
                sampler = _Sampler(tenant, "", self.checked_base(fields.str("base_model"), "asample.base_model"),
                                   None, None)
            num_samples = fields.int("num_samples", required=False, minimum=1) or 1
            prompt = wire.prompt_tokens(fields)
            params = wire.sample_params(fields, max_tokens_limit=self.limits.max_sample_tokens)
        except ServiceError as exc:
            return {**self.failed(tenant, "asample", exc), "sample_sequence_ids": ids}

        def run() -> Outcome:
            sequences = self.engine.sample(sampler.weights, prompt, num_samples, params)
            if len(sequences) != num_samples:
                raise ServiceError(SERVER, f"the engine returned {len(sequences)} samples for {num_samples}")
            return Outcome(PROTO, wire.sample_response_bytes(sequences))

        seq_id = fields.body.get("seq_id")
        key = (sampler_id, seq_id) if sampler_id is not None and isinstance(seq_id, int) else None
        request_id = self.scheduler.unordered(tenant, "asample", run, key=key)
        return {"request_id": request_id, "sample_sequence_ids": ids}

    def finish_session(self, tenant: str, session_id: str) -> dict[str, Any]:
        """End a session of this key; one that ended already (or is not this key's) is left as it is."""
        try:
            self.session(tenant, session_id, "sessions.finish")
        except ServiceError:
            return {}
        self.end_session(session_id)
        log.info("session %s finished", session_id)
        return {}

    async def retrieve(self, tenant: str, body: Any) -> Outcome:
        fields = wire.Fields(body, "retrieve_future")
        request_id = fields.str("request_id")
        if self.table.owner(request_id) != tenant:
            return _error(USER, f"retrieve_future.request_id: no request {request_id!r} for this API key (it "
                                "finished long ago, or the server restarted)")
        outcome = await self.table.wait(request_id, self.limits.poll_seconds)
        if outcome is None:
            return Outcome(JSON, {"type": "try_again", "request_id": request_id, "queue_state": "active"})
        return outcome

    def capabilities(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"model_name": self.engine.base_model, "trainable": True, "sampleable": True}
        length = getattr(self.engine, "max_length", None)
        if isinstance(length, int) and length < 1 << 30:
            entry["max_context_length"] = length
        return {"supported_models": [entry]}


class Backpressure(Exception):
    """Too many requests are queued: answered 429, which the SDK retries after a pause."""


def _error(category: str, message: str) -> Outcome:
    return Outcome(ERROR, wire.error_body(category, message))


def _spec_of(sidecar: dict[str, Any]) -> LoraSpec:
    lora = sidecar.get("lora") or {}
    return LoraSpec(rank=int(lora.get("rank", 1)), train_mlp=bool(lora.get("train_mlp", True)),
                    train_attn=bool(lora.get("train_attn", True)), train_unembed=bool(lora.get("train_unembed", False)),
                    seed=lora.get("seed"))
