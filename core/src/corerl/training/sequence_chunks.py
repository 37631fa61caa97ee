"""Context parallelism's load-balanced layout of a sequence: ``2 x size`` equal chunks, rank ``r``
holding chunk ``r`` and its mirror ``2 x size - 1 - r``, so that under causal attention every rank
has as much work as the others (an early chunk attends to little, its mirror to much). The dtensor
backend's ring attention and the megatron backend's Transformer Engine attention both split a
sequence this way (megatron-core's rotary embeddings take a rank's positions in this order)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def context_parallel_chunks(rank: int, size: int) -> tuple[int, int]:
    """The two chunks (of ``2 * size``) that ``rank`` of ``size`` holds: an early one and its mirror."""
    return rank, 2 * size - 1 - rank


def context_parallel_positions(seq_len: int, rank: int, size: int) -> torch.Tensor:
    """The positions of a ``seq_len`` sequence that ``rank`` of ``size`` holds, in its order."""
    import torch

    if seq_len % (2 * size):
        raise ValueError(f"a sequence of {seq_len} tokens cannot be split into 2 x {size} equal chunks")
    chunk = seq_len // (2 * size)
    return torch.cat([torch.arange(c * chunk, (c + 1) * chunk) for c in context_parallel_chunks(rank, size)])
