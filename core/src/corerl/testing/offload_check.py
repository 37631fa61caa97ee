"""The check that a training backend's offload between phases moves its state and brings it back
unchanged (a helper of :mod:`corerl.testing.conformance`, and of a plugin's own tests).

On a CPU the core parks a rank's state in host memory (:mod:`corerl.training.parking`), so the
check can fail there too: an offload that moves nothing, a reload that does not bring a part back,
or one that brings back other bytes than left, are each caught.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PARTS = ("optimizer", "parameters")


def _max_diff(a: Any, b: Any) -> float:
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


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

    The backend is reloaded also when an assertion about its offloaded state fails."""
    before = backend.logprobs(batch)
    held = backend.state_bytes() if hasattr(backend, "state_bytes") else None
    if held is not None:
        empty = [(rank, part) for rank, figures in enumerate(held) for part in parts if figures[part] <= 0]
        assert not empty, f"ranks held nothing of (rank, part) {empty} before the offload: {held}"
    memory = backend.accelerator_memory() if hasattr(backend, "accelerator_memory") else None
    on_gpu = memory is not None and any(rank["allocated"] > 0 for rank in memory)
    backend.offload(list(parts))
    try:
        if held is not None:
            away = backend.state_bytes()
            kept = {(rank, part): figures[part] for rank, figures in enumerate(away) for part in parts
                    if figures[part] != 0}
            assert not kept, f"after offload({list(parts)}) ranks still hold bytes of (rank, part): {kept}"
        if on_gpu:
            assert memory is not None
            after = backend.accelerator_memory()
            for rank, (b, a) in enumerate(zip(memory, after, strict=True)):
                freed = b["allocated"] - a["allocated"]
                wanted = sum(held[rank][part] for part in parts) // 2 if held is not None else 1
                assert freed >= wanted, (f"rank {rank}: offload({list(parts)}) freed {freed} bytes of GPU memory, "
                                         f"expected at least {wanted}")
    finally:
        backend.reload(list(parts))
    if held is not None:
        back = backend.state_bytes()
        changed = {(rank, part): (held[rank][part], figures[part]) for rank, figures in enumerate(back)
                   for part in parts if figures[part] != held[rank][part]}
        assert not changed, f"after reload({list(parts)}) (rank, part): (bytes before, bytes now) {changed}"
    after_logprobs = backend.logprobs(batch)
    diff = _max_diff(after_logprobs, before)
    assert diff <= tolerance, f"logprobs after offload and reload differ from those before by {diff:.3g}"
