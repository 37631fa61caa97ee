"""Packed rows on the megatron backend (``policy.sequence_packing``).

The core's packed layout (:class:`corerl.sdk.MicroBatcher`) hands each rank micro-batches of one
row: the sequences of one bin (at most the ``train_mb_tokens`` / ``logprob_mb_tokens`` budget)
side by side, ``position_ids`` restarting at 0 where each sequence starts, no padding between
them. megatron's pipeline schedule sends activations of one shape between stages, so here every
micro-batch of a call is first padded on the right to the widest bin of that call
(:func:`same_width`): each micro-batch is ``[1, width]``, ``width`` at most the budget, and the
schedule runs unchanged.

Each sequence attends to itself only. megatron-core's local layer spec takes an attention mask
(True where a query must not see a key): :func:`segment_mask` is block-diagonal and causal, the
padding after the last sequence a block of its own. Rotary positions restart with each sequence
too (:class:`RestartedRope`): GPTModel computes its rotary table for positions ``0..width-1``
whatever ``position_ids`` says, so a hook on its rotary module hands the layers the table's rows
at the micro-batch's positions. Transformer Engine's packed attention (THD with
``PackedSeqParams``) is not used: packed micro-batches run on the local spec (CPU ranks have
nothing else, and on a GPU the backend builds the local spec when packing is on).

Logprobs and values hold 0 at each sequence's first position (it has no context inside its
sequence), as at position 0 of a padded row: :func:`scored_positions`.
"""

from __future__ import annotations

from typing import Any

import torch


def is_packed(mbs: list[dict[str, torch.Tensor]]) -> bool:
    """Whether these are the packed layout's micro-batches (they carry ``position_ids``)."""
    return bool(mbs) and "position_ids" in mbs[0]


def same_width(mbs: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    """Packed micro-batches padded on the right to the widest of them: per-token fields with
    zeros (no attention, no loss), ``position_ids`` restarting at 0 where the padding starts (a
    segment of its own, which no real token sees)."""
    width = max(int(mb["input_ids"].shape[1]) for mb in mbs)
    return [_pad(mb, width) for mb in mbs]


def _pad(mb: dict[str, torch.Tensor], width: int) -> dict[str, torch.Tensor]:
    rows, have = (int(n) for n in mb["input_ids"].shape[:2])
    if have == width:
        return mb
    extra = width - have
    out: dict[str, torch.Tensor] = {}
    for key, value in mb.items():
        if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[0] == rows and value.shape[1] == have:
            pad = value.new_zeros((rows, extra, *value.shape[2:]))
            if key == "position_ids":
                pad = torch.arange(extra, dtype=value.dtype).expand(rows, extra)
            out[key] = torch.cat([value, pad], dim=1)
        else:
            out[key] = value
    return out


def segment_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """``[rows, 1, width, width]`` bool, True where a query must not see a key: a key in another
    sequence of the row (a new one starts where ``position_ids`` is 0) or after the query."""
    segments = (position_ids == 0).long().cumsum(dim=1)
    same = segments.unsqueeze(2) == segments.unsqueeze(1)
    width = position_ids.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=position_ids.device).tril()
    return (~(same & causal)).unsqueeze(1)


def scored_positions(mb: dict[str, torch.Tensor]) -> torch.Tensor:
    """Where a packed micro-batch holds a logprob or a value: real tokens, not a sequence's first."""
    mask = mb["attention_mask"]
    return mask * (mb["position_ids"] != 0).to(mask.dtype)


class RestartedRope:
    """While :attr:`positions` is set (``[rows, width]``), GPTModel's rotary table for its
    ``0..width-1`` is replaced by the table's rows at those positions (``[width, rows, 1, dim]``),
    so each packed sequence is rotated from position 0 as it would be alone; otherwise the
    table passes unchanged (unpacked rows, generation)."""

    def __init__(self, gpt: Any) -> None:
        self.gpt = gpt
        self.positions: torch.Tensor | None = None
        rotary = getattr(gpt, "rotary_pos_emb", None)
        if rotary is None:
            raise RuntimeError("packed rows need the model's rotary embedding module (GPTModel.rotary_pos_emb)")
        rotary.register_forward_hook(self._restart)

    def _restart(self, module: Any, args: Any, table: torch.Tensor) -> torch.Tensor:
        if self.positions is None:
            return table
        if int(self.positions.max()) >= table.shape[0]:
            raise RuntimeError(f"a packed position {int(self.positions.max())} is beyond the rotary table's "
                               f"{table.shape[0]} rows")
        rows = table.reshape(table.shape[0], table.shape[-1])  # [positions, dim]
        return rows[self.positions.t().to(table.device)].unsqueeze(2)


def computed_slots(per_rank: list[list[dict[str, torch.Tensor]]]) -> tuple[int, int]:
    """``(rows, token slots)`` the forward passes of one call compute over the ranks'
    micro-batches: packed ones at the width :func:`same_width` gives each rank's call."""
    rows = slots = 0
    for mbs in per_rank:
        if not mbs:
            continue
        width = max(int(mb["input_ids"].shape[1]) for mb in mbs) if is_packed(mbs) else None
        for mb in mbs:
            count = int(mb["input_ids"].shape[0])
            rows += count
            slots += count * (width if width is not None else int(mb["input_ids"].shape[1]))
    return rows, slots
