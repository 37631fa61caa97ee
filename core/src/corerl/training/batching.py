"""Cutting batches into data-parallel shards and micro-batches, and putting them back."""

from __future__ import annotations

from typing import TYPE_CHECKING

from corerl.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from corerl.training.contract import Batch


def batch_rows(batch: Batch) -> int:
    """Number of rows (sequences) in ``batch``."""
    return int(batch["input_ids"].shape[0])


def _take(batch: Batch, start: int, stop: int) -> Batch:
    rows = batch_rows(batch)
    return {k: (v[start:stop] if v.dim() > 0 and v.shape[0] == rows else v) for k, v in batch.items()}


def shard_rows(batch: Batch, parts: int) -> list[Batch]:
    """``parts`` contiguous shards of equal size, one per data-parallel rank."""
    rows = batch_rows(batch)
    if rows % parts:
        raise ConfigError(
            f"a batch of {rows} rows cannot be split evenly across {parts} data-parallel ranks",
            hint="make the batch size a multiple of the data-parallel size",
        )
    size = rows // parts
    return [_take(batch, i * size, (i + 1) * size) for i in range(parts)]


def micro_batches(batch: Batch, size: int) -> list[Batch]:
    """Consecutive micro-batches of at most ``size`` rows."""
    rows = batch_rows(batch)
    return [_take(batch, start, min(start + size, rows)) for start in range(0, rows, size)]


def right_pad(sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id lists as ``input_ids`` and ``attention_mask`` ``[len(sequences), longest]``, padded with 0 on the right."""
    import torch

    width = max(len(seq) for seq in sequences)
    input_ids = torch.zeros((len(sequences), width), dtype=torch.long)
    attention = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        input_ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention[row, : len(seq)] = 1
    return input_ids, attention


def loss_token_count(batch: Batch) -> int:
    """How many tokens enter the loss (``loss_mask`` summed, position 0 excluded)."""
    return int(batch["loss_mask"][:, 1:].sum().item())
