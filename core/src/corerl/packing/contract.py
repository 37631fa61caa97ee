"""What a sequence packer provides, and the check every packing result must pass."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from corerl.errors import ConfigError


@runtime_checkable
class Packer(Protocol):
    """Groups sequences into bins of at most ``budget`` tokens.

    ``pack(lengths, budget)`` returns bins as lists of indices into ``lengths``: every index
    exactly once, each bin's total length at most ``budget``. The order of bins and of the
    indices inside a bin is the packer's choice (results do not depend on it).
    """

    def pack(self, lengths: Sequence[int], budget: int) -> list[list[int]]:
        """Bins of indices into ``lengths``."""


def check_budget(lengths: Sequence[int], budget: int, key: str) -> None:
    """Refuse a budget below the longest sequence, naming the config key that sets it."""
    longest = max(lengths, default=0)
    if longest > budget:
        raise ConfigError(
            f"a sequence of {longest} tokens does not fit a micro-batch budget of {budget} tokens",
            key=key, hint=f"raise it to at least the longest sequence (policy.max_seq_length), e.g. {key}={longest}",
        )


def check_bins(bins: Sequence[Sequence[int]], lengths: Sequence[int], budget: int, packer: str) -> None:
    """Raise if ``bins`` lose, repeat or invent an index, or overflow ``budget`` (a packer bug)."""
    seen = sorted(i for b in bins for i in b)
    if seen != list(range(len(lengths))):
        raise RuntimeError(f"sequence packer {packer!r} returned bins that do not hold every sequence exactly once")
    for b in bins:
        total = sum(lengths[i] for i in b)
        if total > budget or not b:
            raise RuntimeError(f"sequence packer {packer!r} returned a bin of {total} tokens (budget {budget}, {len(b)} sequences)")
