"""The SDK's futures: each submitted request gets an id at once, runs later on the engine's
thread, and its outcome is fetched by long-polling ``retrieve_future`` (issue 76).

Requests on one training model carry ``seq_id = 1, 2, 3, ...`` in the order the client made them,
and the SDK may send them out of that order (a large ``forward_backward``'s first chunk goes
last); :class:`Scheduler` runs each model's requests in ``seq_id`` order and everything else in
arrival order, one at a time on a single worker thread (the engine holds one base model). A
request resent with a ``(model, seq_id)`` already seen gets the first one's future back. A missing
``seq_id`` holds the model's later requests for ``gap_seconds`` at most (a request its client never
managed to send), then they go on without it.

No HTTP here: :mod:`corerl.run.tinker.server` answers with what :meth:`FutureTable.wait` returns.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from corerl.failures import first_line
from corerl.run.tinker.engine import SERVER, ServiceError

log = logging.getLogger("corerl.serve")

JSON, PROTO, ERROR = "json", "proto", "error"


@dataclass(frozen=True)
class Outcome:
    """A finished request: JSON (a dict), protobuf bytes, or an error (``{"error", "category"}``)."""

    kind: str
    payload: Any


@dataclass
class _Entry:
    owner: str
    kind: str
    created: float
    loop: asyncio.AbstractEventLoop | None
    event: asyncio.Event = field(default_factory=asyncio.Event)
    outcome: Outcome | None = None
    finished: float = 0.0


def outcome_of(call: Callable[[], Outcome]) -> Outcome:
    """Run ``call``; a :class:`ServiceError` or any other exception becomes the error outcome
    (``server`` and the exception's first line for anything but a ServiceError)."""
    try:
        return call()
    except ServiceError as exc:
        return Outcome(ERROR, {"error": exc.message, "category": exc.category})
    except Exception as exc:
        log.exception("a request failed")
        return Outcome(ERROR, {"error": f"the server failed this request: {first_line(exc)}", "category": SERVER})


class FutureTable:
    """Request id -> outcome. Created and awaited on the event loop, resolved from any thread.
    A finished outcome is kept ``keep_seconds`` (a client may ask again after a lost answer)."""

    def __init__(self, keep_seconds: float = 900.0) -> None:
        self.keep_seconds = keep_seconds
        self.created: Counter[str] = Counter()  # requests taken since the start, by kind
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()

    def create(self, owner: str, kind: str) -> str:
        """A new pending future of ``owner`` (the API key's tenant); its request id."""
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        request_id = uuid.uuid4().hex
        with self._lock:
            self._prune()
            self._entries[request_id] = _Entry(owner, kind, time.monotonic(), loop)
            self.created[kind] += 1
        return request_id

    def resolve(self, request_id: str, outcome: Outcome) -> None:
        """Finish a future (any thread); waiters wake."""
        with self._lock:
            entry = self._entries.get(request_id)
            if entry is None or entry.outcome is not None:
                return
            entry.outcome, entry.finished = outcome, time.monotonic()
        if entry.loop is None or entry.loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is entry.loop:
            entry.event.set()
        else:
            entry.loop.call_soon_threadsafe(entry.event.set)

    def owner(self, request_id: str) -> str | None:
        with self._lock:
            entry = self._entries.get(request_id)
            return None if entry is None else entry.owner

    def kind(self, request_id: str) -> str | None:
        with self._lock:
            entry = self._entries.get(request_id)
            return None if entry is None else entry.kind

    async def wait(self, request_id: str, timeout: float) -> Outcome | None:
        """The outcome, waiting up to ``timeout`` seconds; None if still pending (or unknown)."""
        with self._lock:
            entry = self._entries.get(request_id)
        if entry is None:
            return None
        if entry.outcome is None:
            try:
                await asyncio.wait_for(entry.event.wait(), timeout)
            except TimeoutError:
                return None
        return entry.outcome

    def pending(self) -> int:
        with self._lock:
            return sum(1 for e in self._entries.values() if e.outcome is None)

    def _prune(self) -> None:
        now = time.monotonic()
        stale = [rid for rid, e in self._entries.items()
                 if e.outcome is not None and now - e.finished > self.keep_seconds]
        for rid in stale:
            del self._entries[rid]


@dataclass
class _Job:
    request_id: str
    call: Callable[[], Outcome]


@dataclass
class _ModelQueue:
    next_seq: int
    waiting: dict[int, _Job] = field(default_factory=dict)
    seen: dict[int, str] = field(default_factory=dict)  # seq_id -> request id, for resends
    blocked_since: float | None = None


class Scheduler:
    """Runs jobs one at a time on a worker thread: each training model's in ``seq_id`` order,
    the others as they come. :meth:`ordered` and :meth:`unordered` return the request id at once."""

    #: how many (model, seq_id) -> request id pairs a model keeps for deduplicating resends
    SEEN_KEPT = 4096

    def __init__(self, table: FutureTable, *, gap_seconds: float = 60.0) -> None:
        self.table = table
        self.gap_seconds = gap_seconds
        self._ready: deque[_Job] = deque()
        self._models: dict[str, _ModelQueue] = {}
        self._keyed: dict[tuple[str, int], str] = {}  # (sampler, seq_id) -> request id
        self._cond = threading.Condition()
        self._stopped = False
        self._running: str | None = None
        self._thread = threading.Thread(target=self._work, name="corerl-serve-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def queued(self) -> int:
        """Jobs not yet started (ready or waiting for an earlier seq_id)."""
        with self._cond:
            return len(self._ready) + sum(len(q.waiting) for q in self._models.values())

    def open_model(self, model_id: str, first_seq: int = 1) -> None:
        """A model's queue, expecting ``first_seq`` next (the SDK's first request on a model is 1)."""
        with self._cond:
            self._models.setdefault(model_id, _ModelQueue(next_seq=first_seq))

    def close_model(self, model_id: str) -> list[str]:
        """Forget a model's queue; its waiting requests are returned (the caller fails them)."""
        with self._cond:
            queue = self._models.pop(model_id, None)
            return [] if queue is None else [job.request_id for job in queue.waiting.values()]

    def unordered(self, owner: str, kind: str, call: Callable[[], Outcome], key: tuple[str, int] | None = None) -> str:
        """Run ``call`` after what is queued; with ``key``, a resend of the same key gets the same id."""
        with self._cond:
            if key is not None and key in self._keyed:
                return self._keyed[key]
            request_id = self.table.create(owner, kind)
            if key is not None:
                if len(self._keyed) >= self.SEEN_KEPT * 4:
                    self._keyed.pop(next(iter(self._keyed)))
                self._keyed[key] = request_id
            self._ready.append(_Job(request_id, call))
            self._cond.notify_all()
        return request_id

    def ordered(self, owner: str, kind: str, model_id: str, seq_id: int, call: Callable[[], Outcome]) -> str:
        """Run ``call`` once every earlier ``seq_id`` of ``model_id`` has run (the model's queue
        must be open). A ``seq_id`` already seen returns that request's id; one that comes after
        its turn passed fails."""
        with self._cond:
            queue = self._models.get(model_id)
            if queue is None:
                raise ServiceError("user", f"{kind}.model_id: {model_id} is not open here")
            if seq_id in queue.seen:
                return queue.seen[seq_id]
            request_id = self.table.create(owner, kind)
            queue.seen[seq_id] = request_id
            if len(queue.seen) > self.SEEN_KEPT:
                queue.seen.pop(min(queue.seen))
            if seq_id < queue.next_seq:
                self.table.resolve(request_id, Outcome(ERROR, {
                    "error": f"{kind}.seq_id: {seq_id} arrived after {model_id}'s requests up to {queue.next_seq - 1} "
                             "had run (requests on a model run in seq_id order)", "category": "user"}))
                return request_id
            queue.waiting[seq_id] = _Job(request_id, call)
            self._release(queue)
            self._cond.notify_all()
        return request_id

    def _release(self, queue: _ModelQueue) -> None:
        """Move a model's jobs whose turn has come to the ready queue (lock held)."""
        while queue.next_seq in queue.waiting:
            self._ready.append(queue.waiting.pop(queue.next_seq))
            queue.next_seq += 1
        queue.blocked_since = time.monotonic() if queue.waiting else None

    def _skip_gaps(self) -> None:
        """Give up on a missing seq_id held longer than ``gap_seconds`` (lock held)."""
        now = time.monotonic()
        for model_id, queue in self._models.items():
            if queue.waiting and queue.blocked_since is not None and now - queue.blocked_since > self.gap_seconds:
                first = min(queue.waiting)
                log.warning("%s: seq_id %d..%d never arrived in %.0f s; running %d on", model_id, queue.next_seq,
                            first - 1, self.gap_seconds, first)
                queue.next_seq = first
                self._release(queue)

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._ready and not self._stopped:
                    self._skip_gaps()
                    if self._ready:
                        break
                    self._cond.wait(timeout=min(1.0, self.gap_seconds))
                if self._stopped:
                    pending = list(self._ready) + [j for q in self._models.values() for j in q.waiting.values()]
                    self._ready.clear()
                    for queue in self._models.values():
                        queue.waiting.clear()
                    break
                job = self._ready.popleft()
                self._running = job.request_id
            self.table.resolve(job.request_id, outcome_of(job.call))
            with self._cond:
                self._running = None
        for job in pending:
            self.table.resolve(job.request_id, Outcome(ERROR, {"error": "the server is shutting down",
                                                               "category": SERVER}))
