"""The core's packers: first-fit decreasing and its modified form, first fit over a shuffled
order, plain concatenation, and Karmarkar-Karp balancing.

Each class is a factory registered by the core's plugin; :func:`karmarkar_karp` also
balances token counts across data-parallel ranks.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Sequence


def _first_fit(order: Sequence[int], lengths: Sequence[int], budget: int,
               bins: list[list[int]] | None = None, loads: list[int] | None = None) -> list[list[int]]:
    bins = [] if bins is None else bins
    loads = [] if loads is None else loads
    for index in order:
        size = lengths[index]
        for slot, load in enumerate(loads):
            if load + size <= budget:
                bins[slot].append(index)
                loads[slot] += size
                break
        else:
            bins.append([index])
            loads.append(size)
    return bins


def _decreasing(indices: Sequence[int], lengths: Sequence[int]) -> list[int]:
    return sorted(indices, key=lambda i: (-lengths[i], i))


class FirstFitDecreasing:
    """Longest first; each sequence goes into the first bin with room, else a new bin."""

    def pack(self, lengths: Sequence[int], budget: int) -> list[list[int]]:
        return _first_fit(_decreasing(range(len(lengths)), lengths), lengths, budget)


class ModifiedFirstFitDecreasing:
    """Johnson and Garey's modified first-fit decreasing (the default packer).

    Sequences are classed by size relative to the budget: large (> 1/2), medium (1/3, 1/2],
    small (1/6, 1/3] and tiny. Each large sequence opens a bin; the large bins then take the
    biggest medium sequence that fits, going forward, and pairs of small sequences, going
    backward, where no medium one went; everything left is placed by first-fit decreasing.
    Pairing long with short sequences first leaves fewer half-empty bins than plain FFD.
    """

    def pack(self, lengths: Sequence[int], budget: int) -> list[list[int]]:
        order = _decreasing(range(len(lengths)), lengths)
        large = [i for i in order if lengths[i] * 2 > budget]
        medium = [i for i in order if budget < lengths[i] * 3 and lengths[i] * 2 <= budget]
        small = [i for i in order if budget < lengths[i] * 6 and lengths[i] * 3 <= budget]
        rest = [i for i in order if lengths[i] * 6 <= budget]
        bins = [[i] for i in large]
        loads = [lengths[i] for i in large]
        got_medium = [False] * len(bins)
        for slot in range(len(bins)):  # forward: the biggest medium sequence that fits
            room = budget - loads[slot]
            fit = next((i for i in medium if lengths[i] <= room), None)
            if fit is not None:
                medium.remove(fit)
                bins[slot].append(fit)
                loads[slot] += lengths[fit]
                got_medium[slot] = True
        for slot in reversed(range(len(bins))):  # backward: two small sequences where no medium went
            if got_medium[slot] or len(small) < 2:
                continue
            room = budget - loads[slot]
            smallest = small[-1]
            if lengths[smallest] + lengths[small[-2]] > room:
                continue
            partner = next(i for i in small[:-1] if lengths[i] + lengths[smallest] <= room)
            for index in (smallest, partner):
                small.remove(index)
                bins[slot].append(index)
                loads[slot] += lengths[index]
        return _first_fit(_decreasing(medium + small + rest, lengths), lengths, budget, bins, loads)


class FirstFitShuffle:
    """First fit over a shuffled order (seeded, so a run packs the same way every time)."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def pack(self, lengths: Sequence[int], budget: int) -> list[list[int]]:
        order = list(range(len(lengths)))
        self.rng.shuffle(order)
        return _first_fit(order, lengths, budget)


class Concatenative:
    """Sequences in their given order, a new bin whenever the next one does not fit."""

    def pack(self, lengths: Sequence[int], budget: int) -> list[list[int]]:
        bins: list[list[int]] = []
        load = budget + 1
        for index, size in enumerate(lengths):
            if load + size > budget:
                bins.append([])
                load = 0
            bins[-1].append(index)
            load += size
        return bins


def karmarkar_karp(weights: Sequence[int], parts: int) -> list[list[int]]:
    """Split ``weights`` into ``parts`` groups whose sums are as equal as the largest
    differencing method makes them (indices into ``weights``; a group may be empty)."""
    if parts < 1:
        raise ValueError("parts must be at least 1")
    tie = itertools.count()
    heap: list[tuple[int, int, list[tuple[int, list[int]]]]] = []
    for index, weight in enumerate(weights):
        groups = [(weight, [index])] + [(0, []) for _ in range(parts - 1)]
        heapq.heappush(heap, (-weight, next(tie), groups))
    if not heap:
        return [[] for _ in range(parts)]
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        # the heaviest group of one with the lightest of the other: the difference shrinks
        a = sorted(a, key=lambda g: -g[0])
        b = sorted(b, key=lambda g: g[0])
        merged = sorted(((wa + wb, ia + ib) for (wa, ia), (wb, ib) in zip(a, b, strict=True)), key=lambda g: -g[0])
        spread = merged[0][0] - merged[-1][0]
        heapq.heappush(heap, (-spread, next(tie), merged))
    return [sorted(indices) for _, indices in heap[0][2]]


class KarmarkarKarp:
    """Bins of equal-as-possible token counts: the fewest bins the budget allows, balanced by
    :func:`karmarkar_karp` (one more bin whenever a balanced split still overflows)."""

    def pack(self, lengths: Sequence[int], budget: int) -> list[list[int]]:
        if not lengths:
            return []
        count = max(1, -(-sum(lengths) // budget))
        while count <= len(lengths):
            bins = [b for b in karmarkar_karp(lengths, count) if b]
            if all(sum(lengths[i] for i in b) <= budget for b in bins):
                return bins
            count += 1
        raise ValueError(f"a sequence of {max(lengths)} tokens does not fit a bin of {budget}")


#: the core's packers: id -> (class of this module, what it does); the core's plugin registers
#: them, and a config built without selection (a plugin's tests) resolves its packer here
CORE_PACKERS: dict[str, tuple[str, str]] = {
    "first_fit_decreasing": ("FirstFitDecreasing", "sort by length, place each sequence in the first row it fits"),
    "modified_first_fit_decreasing": ("ModifiedFirstFitDecreasing",
                                      "first-fit decreasing that pairs long and short sequences first (default)"),
    "first_fit_shuffle": ("FirstFitShuffle", "first fit over a shuffled order"),
    "concatenative": ("Concatenative", "concatenate in order, cut at the token budget"),
    "karmarkar_karp": ("KarmarkarKarp", "rows of balanced token counts (Karmarkar-Karp differencing)"),
}
