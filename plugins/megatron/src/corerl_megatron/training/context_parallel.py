"""Context parallelism on the megatron backend (``policy.megatron_cfg.context_parallel_size``): each
micro-batch's rows split over the context-parallel ranks in the load-balanced layout
(:func:`corerl.sdk.context_parallel_positions`: chunk ``r`` and its mirror), which megatron-core's
rotary embeddings take for a rank's tokens and Transformer Engine's attention exchanges keys and
values over; the model's output at a rank's positions (logits, the final hidden states the
output-layer tap hands back, or a critic's values) is gathered back into sequence order on every
rank, so the loss, logprobs and values see each row whole, as without it.

Gradients: every context-parallel rank computes the loss on the gathered output, so the gather's
backward (``torch.distributed.nn``'s all-gather: a reduce-scatter) hands each rank ``cp`` times
its positions' share; megatron's DDP averages the gradients over the data x context-parallel
ranks, which divides it out again (the data-parallel mean is what is left). Megatron's schedule
multiplies each loss by ``cp`` too (its own losses are a rank's chunks'), which the worker divides
out (:meth:`corerl_megatron.training.worker.MegatronWorker._whole_rows_loss`).

Rows are right-padded to a multiple of ``2 x cp`` tokens first (causal attention never looks at
the padding) and the gathered output is cut back to the rows' width.
"""

from __future__ import annotations

from typing import Any

import torch


class SequenceSplit:
    """This rank's share of each row (rank ``rank`` of the ``size`` ranks of ``group``); with
    sequence parallelism over ``tensor_parallel`` ranks, a share they split again evenly."""

    def __init__(self, group: Any, rank: int, size: int, tensor_parallel: int = 1) -> None:
        import math

        self.group, self.rank, self.size = group, rank, size
        #: rows are padded to a multiple of it: 2 x size equal chunks, each rank's two of them a multiple of
        #: tensor_parallel tokens
        self.multiple = size * math.lcm(2, tensor_parallel)

    def padded(self, width: int) -> int:
        """``width`` rounded up to whole chunks (:attr:`multiple`)."""
        return width + (-width) % self.multiple

    def positions(self, width: int, device: Any = None) -> torch.Tensor:
        """The positions of a row of ``width`` tokens (once padded) that this rank holds, in order."""
        from corerl.sdk import context_parallel_positions

        return context_parallel_positions(self.padded(width), self.rank, self.size).to(device)

    def local(self, rows: torch.Tensor) -> torch.Tensor:
        """This rank's tokens of ``rows`` (``[rows, width, ...]``), right-padded with zeros first."""
        width = rows.shape[1]
        pad = self.padded(width) - width
        if pad:
            rows = torch.nn.functional.pad(rows, (0, 0) * (rows.dim() - 2) + (0, pad))
        return rows[:, self.positions(width, rows.device)]

    def gather(self, mine: torch.Tensor, width: int) -> torch.Tensor:
        """Every rank's ``mine`` (``[rows, its positions, ...]``) in sequence order, on every rank, cut
        to ``width``; the backward pass sums each position's gradient over the ranks."""
        from torch.distributed.nn.functional import all_gather

        pieces = all_gather(mine.contiguous(), group=self.group)
        padded = self.padded(width)
        from corerl.sdk import context_parallel_positions

        order = torch.cat([context_parallel_positions(padded, rank, self.size) for rank in range(self.size)])
        whole = torch.cat(list(pieces), dim=1)[:, torch.argsort(order).to(mine.device)]
        return whole[:, :width]
