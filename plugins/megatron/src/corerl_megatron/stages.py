"""How a pipeline's stages share a model's decoder layers (megatron-core's rule), without torch:
validation and the engines both use it."""

from __future__ import annotations


def stage_layers(num_layers: int, stages: int, first: int | None = None, last: int | None = None) -> list[int]:
    """The decoder layers each of ``stages`` pipeline stages holds: ``first`` and ``last`` where
    given, the rest split evenly (megatron-core's rule; it refuses an uneven remainder)."""
    if stages == 1:
        return [num_layers]
    ends = [n for n in (first, last) if n is not None]
    middle = stages - len(ends)
    rest = num_layers - sum(ends)
    each = rest // middle if middle else 0
    counts = [each] * stages
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    return counts
