"""The check that a training backend's offload between phases moves its state and brings it back
unchanged (a helper of :mod:`corerl.testing.conformance`, and of a plugin's own tests).

On a CPU the core parks a rank's state in host memory (:mod:`corerl.training.parking`), so the
check can fail there too: an offload that moves nothing, a reload that does not bring a part back,
or one that brings back other bytes than left, are each caught.

One offload and reload is measured once (:func:`offload_round_trip`) and asserted on in parts, so
that the conformance suite's check (k) holds every backend to what the round trip must leave as it
was (:meth:`OffloadRoundTrip.assert_unchanged`) and a backend of contract 2.15 or later, in the same
pass, to the state having moved (:meth:`OffloadRoundTrip.assert_state_moved`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

PARTS = ("optimizer", "parameters")


@dataclass(frozen=True)
class OffloadRoundTrip:
    """What one ``offload(parts)`` then ``reload(parts)`` of a backend showed: ``state_bytes()``
    before, while offloaded and after (None where the backend has no ``state_bytes``), the ranks'
    ``accelerator_memory()`` before and while offloaded (None where it has none, or none of its
    ranks computes on a GPU), and how far ``logprobs(batch)`` after the reload are from those before."""

    parts: tuple[str, ...]
    held: list[dict[str, int]] | None
    away: list[dict[str, int]] | None
    back: list[dict[str, int]] | None
    memory: list[dict[str, int]] | None
    memory_away: list[dict[str, int]] | None
    logprobs_diff: float

    def assert_unchanged(self, tolerance: float) -> None:
        """The reload left the engine computing the same logprobs (within ``tolerance``)."""
        assert self.logprobs_diff <= tolerance, (
            f"logprobs after offload and reload differ from those before by {self.logprobs_diff:.3g}")

    def assert_state_moved(self) -> None:
        """Where the backend reports ``state_bytes()``: every rank held something of each part
        before (otherwise there was nothing to check), 0 bytes of it while offloaded, and what it
        held before after the reload; where the ranks compute on a GPU: the offload freed at least
        half the bytes ``state_bytes()`` reported for the parts (or, without ``state_bytes``, some)."""
        parts = list(self.parts)
        if self.held is not None:
            empty = [(rank, part) for rank, figures in enumerate(self.held) for part in parts if figures[part] <= 0]
            assert not empty, f"ranks held nothing of (rank, part) {empty} before the offload: {self.held}"
            assert self.away is not None
            kept = {(rank, part): figures[part] for rank, figures in enumerate(self.away) for part in parts
                    if figures[part] != 0}
            assert not kept, f"after offload({parts}) ranks still hold bytes of (rank, part): {kept}"
        if self.memory is not None:
            assert self.memory_away is not None
            for rank, (b, a) in enumerate(zip(self.memory, self.memory_away, strict=True)):
                freed = b["allocated"] - a["allocated"]
                wanted = sum(self.held[rank][part] for part in parts) // 2 if self.held is not None else 1
                assert freed >= wanted, (f"rank {rank}: offload({parts}) freed {freed} bytes of GPU memory, "
                                         f"expected at least {wanted}")
        if self.held is not None:
            assert self.back is not None
            changed = {(rank, part): (self.held[rank][part], figures[part]) for rank, figures in enumerate(self.back)
                       for part in parts if figures[part] != self.held[rank][part]}
            assert not changed, f"after reload({parts}) (rank, part): (bytes before, bytes now) {changed}"


def offload_round_trip(backend: Any, batch: dict[str, Any], parts: Sequence[str] = PARTS) -> OffloadRoundTrip:
    """Offload ``parts`` of ``backend`` (a training backend with its model loaded, best after a
    train step, so that the optimizer holds state) and reload them, once, measuring what
    :class:`OffloadRoundTrip` holds. The backend is reloaded also when a measurement while it is
    offloaded fails."""
    from corerl.testing.reference import max_diff

    parts = tuple(parts)
    before = backend.logprobs(batch)
    held = backend.state_bytes() if hasattr(backend, "state_bytes") else None
    memory = backend.accelerator_memory() if hasattr(backend, "accelerator_memory") else None
    if memory is not None and not any(rank["allocated"] > 0 for rank in memory):
        memory = None  # no rank computes on a GPU: nothing for the offload to free there
    backend.offload(list(parts))
    try:
        away = backend.state_bytes() if held is not None else None
        memory_away = backend.accelerator_memory() if memory is not None else None
    finally:
        backend.reload(list(parts))
    back = backend.state_bytes() if held is not None else None
    # an empty batch's logprobs have nothing that could differ
    diff = max_diff(backend.logprobs(batch), before, empty=0.0)
    return OffloadRoundTrip(parts, held, away, back, memory, memory_away, diff)


def check_offload_keeps_state(backend: Any, batch: dict[str, Any], tolerance: float,
                              parts: Sequence[str] = PARTS) -> None:
    """Offload ``parts`` of ``backend`` (a training backend with its model loaded, best after a
    train step, so that the optimizer holds state), then reload them, asserting that:

    - where the backend reports ``state_bytes()``: while offloaded, every rank holds 0 bytes of
      each part on its device; after the reload, each rank holds what it held before (and held
      something of each part before: otherwise there was nothing to check);
    - where the ranks compute on a GPU (``accelerator_memory()``, allocated bytes above 0): the
      offload freed at least half the bytes ``state_bytes()`` reported for the parts (or, without
      ``state_bytes``, some);
    - ``logprobs(batch)`` after the reload equal those before within ``tolerance``.

    The backend is reloaded also when a measurement of its offloaded state fails."""
    trip = offload_round_trip(backend, batch, parts)
    trip.assert_state_moved()
    trip.assert_unchanged(tolerance)
