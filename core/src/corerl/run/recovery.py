"""In-run recovery: ``run.max_restarts`` times, a run whose worker died or hung goes on by itself.

A fault is a rank, an engine actor or a Ray node that died, or a group call that did not
return within ``run.collective_timeout_s`` (:class:`~corerl.distributed.worker_group.WorkerFailed`
with ``how`` ``died`` or ``hung``; a Ray actor's or node's death met outside a worker group).
The runner (:func:`corerl.run.loop.execute`) then shuts every engine down (the worker groups kill
their actors), opens the same run directory again as a rerun of the command would, which resumes
from the last complete checkpoint, and goes on; each recovery is one line on the terminal and a
``recovery`` row in metrics.jsonl (:func:`recovery_row`).

Not a fault, never retried: an exception a rank raised (a bug, or a user's error), a failure of
the driver itself (the run stops; rerunning the command resumes), and the same step failing the
same way twice in a row (a deterministic failure that a restart would only repeat). Past
``run.max_restarts`` the run stops with one line naming the cause and the checkpoint to resume from.

Why our own loop rather than Ray's actor restarts (``max_restarts`` on the actor): the ranks of
a group share process groups and sharded state, so one rank restarting alone cannot rejoin its
peers mid-step; the whole set of engines restarts from a checkpoint, as a rerun of the command does.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from corerl.errors import CorerlError
from corerl.reporting.phases import RECOVERY_PHASE  # re-exported


class RunStopped(CorerlError):
    """A fault the run did not recover from: past ``run.max_restarts``, or the same step failing
    the same way twice in a row."""


@attrs.frozen
class Fault:
    """What died or hung (``who``: ``training worker rank 1 (pid 123)``), ``how`` (``died`` or
    ``hung``), ``during`` which call, and the worker's own line (``message``)."""

    who: str
    how: str
    during: str
    message: str

    def same_as(self, other: Fault | None) -> bool:
        """The same worker kind failing the same way in the same call (pids differ between tries)."""
        return other is not None and (self.who.split(" (pid")[0], self.how, self.during) == (
            other.who.split(" (pid")[0], other.how, other.during)


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or during, once each."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def fault_of(exc: BaseException) -> Fault | None:
    """The fault behind ``exc``, or None when it is not one (see the module docstring)."""
    from corerl.distributed.worker_group import WorkerFailed

    for cause in causes(exc):
        if isinstance(cause, WorkerFailed):
            if cause.how not in ("died", "hung"):
                return None
            who = f"{cause.role} rank {cause.rank}" if cause.rank is not None else cause.role
            return Fault(who + (f" (pid {cause.pid})" if cause.pid else ""), cause.how, cause.during, cause.message)
        if type(cause).__name__ in ("ActorDiedError", "NodeDiedError", "ActorUnavailableError", "RayActorError") and \
                type(cause).__module__.startswith("ray."):
            return Fault("a Ray actor", "died", "", str(cause).splitlines()[0] if str(cause) else type(cause).__name__)
    return None


@attrs.define
class Recovery:
    """The restarts of one ``corerl run``: whether the next failure is recovered, and the record of
    each recovery (``restarts`` so far)."""

    max_restarts: int
    restarts: int = 0
    last: Fault | None = None
    last_step: int | None = None
    #: the rows of the recoveries under way (one more when a recovery fails before the run goes
    #: on), each with the monotonic time of its failure; written once the run's log is open again
    pending: list[tuple[dict[str, Any], float]] = attrs.field(factory=list)
    written: list[dict[str, Any]] = attrs.field(factory=list)  #: the rows of the recoveries done

    def recover_from(self, exc: BaseException, step: int, checkpoint: Path | None) -> Fault | None:
        """The fault to recover from, None when ``exc`` is not one (the caller re-raises it), or
        :class:`RunStopped` when it is one but the run may not recover (``step``: steps done when it
        failed; ``checkpoint``: the newest complete one, named in that line)."""
        fault = fault_of(exc)
        if fault is None or self.max_restarts == 0:
            return None
        resume = (f"the same command resumes from {checkpoint}" if checkpoint is not None else
                  "no complete checkpoint yet: the same command starts over")
        if fault.same_as(self.last) and step == self.last_step:
            raise RunStopped(f"{fault.who} {fault.how} during {fault.during!r} at step {step} again, as before the "
                             f"last restart: a failure that repeats, not a fault a restart mends; {resume}",
                             hint="see run.log for the worker's last words") from exc
        if self.restarts >= self.max_restarts:
            raise RunStopped(f"{fault.who} {fault.how} during {fault.during!r} at step {step}, after "
                             f"{self.restarts} restart(s) (run.max_restarts={self.max_restarts}); {resume}",
                             hint="raise run.max_restarts to let the run recover more often") from exc
        self.restarts += 1
        self.last, self.last_step = fault, step
        self.pending.append(({"phase": RECOVERY_PHASE, "restart": self.restarts, "failed": fault.who, "how": fault.how,
                              "during": fault.during, "failed_at_step": step}, time.monotonic()))
        return fault

    def recovered(self, resumed_step: int, started_over: bool = False) -> list[dict[str, Any]]:
        """The recovery's metrics.jsonl row, once the run goes on from ``resumed_step``: what failed,
        how and during which call, the steps done when it failed (``failed_at_step``: the step under
        way then is lost too), the completed steps it redoes (``steps_redone``) and the seconds from
        the failure to engines ready with the checkpoint loaded (``recover_s``). A recovery cut short
        by another fault has its row too, its seconds counted to the same moment. ``started_over``:
        the run found no complete checkpoint and began a new log, so the earlier recoveries' rows
        come first again."""
        now = time.monotonic()
        rows = [{**row, "step": resumed_step, "steps_redone": row["failed_at_step"] - resumed_step,
                 "recover_s": round(now - failed_at, 3)} for row, failed_at in self.pending]
        self.pending = []
        earlier = list(self.written) if started_over else []
        self.written += rows
        return earlier + rows


def describe(fault: Fault, restart: int, max_restarts: int) -> str:
    """The terminal's line when a recovery starts."""
    during = f" during {fault.during!r}" if fault.during else ""
    return (f"{fault.who} {fault.how}{during}: restarting the run's workers from the last complete checkpoint "
            f"(restart {restart} of run.max_restarts={max_restarts})")
