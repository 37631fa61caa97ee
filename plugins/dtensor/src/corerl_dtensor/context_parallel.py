"""Context parallelism's data side: a right-padded micro-batch's sequences split over the
context-parallel ranks, each running the model on its two chunks (attention over the whole
sequence by :mod:`corerl_dtensor.ring_attention`), and the token logprobs gathered back into the
whole sequence's order on every rank, so that the loss functions see what they see without it.

A micro-batch's other asks of the same logits are answered the same way, each rank at its own
positions: a student's ``candidate_ids`` (a teacher's top-k tokens: ``candidate_logprobs``,
differentiable) and a teacher's :data:`~corerl.sdk.TOPK_REQUEST` (``topk_logprobs``
and ``topk_ids``). A critic's values are split and gathered the same way (:func:`context_parallel_values`).

Gradients: every rank computes the loss on the gathered logprobs, so the gather's backward hands
each rank ``cp`` times its positions' share; FSDP's mean over the ``dp x cp`` ranks that shard
the model divides it out again (the data-parallel mean is what is left).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from corerl.sdk import TOPK_REQUEST, picked_logprobs, picked_topk, shift_values
from corerl_dtensor.ring_attention import Ring, positions_of, splitting_sequences_over

#: micro-batch fields context parallelism does not take yet (packing, images)
NOT_YET = ("position_ids", "pixel_values")


class _RingAllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, piece: torch.Tensor, ring: Ring, dim: int) -> torch.Tensor:
        pieces: list[torch.Tensor] = [piece] * ring.size
        held = [piece]
        for step in range(1, ring.size):
            held = ring.shift(held)
            pieces[(ring.rank - step) % ring.size] = held[0]
        ctx.ring, ctx.dim = ring, dim
        return torch.cat(pieces, dim=dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        ring = ctx.ring
        grads = grad.chunk(ring.size, dim=ctx.dim)
        # a ring reduce-scatter: the sum for piece (rank - 1 - step) travels on, gathering each rank's share
        total = grads[(ring.rank - 1) % ring.size].contiguous()
        for step in range(ring.size - 1):
            (total,) = ring.shift([total])
            total = total + grads[(ring.rank - step - 2) % ring.size]
        return total, None, None


def ring_all_gather(piece: torch.Tensor, ring: Ring, dim: int = 1) -> torch.Tensor:
    """Every rank's ``piece`` (equal shapes) joined along ``dim`` in rank order, on every rank; the
    backward pass sums each piece's gradient over the ranks."""
    if ring.size == 1:
        return piece
    return _RingAllGather.apply(piece, ring, dim)


def _forward_split(model: torch.nn.Module, batch: dict[str, torch.Tensor], ring: Ring, router: Any = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The model's output on this rank's positions of each right-padded sequence (padded to
    ``2 x ring.size`` chunks), those positions, and the padded token ids. A mixture-of-experts
    model's router hooks (``router``: :class:`corerl.training.moe_router.RouterHooks`) get its
    routers' outputs back in whole rows (their loss terms are taken over whole sequences)."""
    asked = [field for field in NOT_YET if field in batch]
    if asked:
        raise ValueError(f"context parallelism does not take micro-batches with {', '.join(asked)} yet")
    ids = batch["input_ids"]
    length = ids.shape[1]
    padded = length + (-length) % (2 * ring.size)  # right padding: causal attention never looks at it
    ids_padded = torch.nn.functional.pad(ids, (0, padded - length))
    where = positions_of(padded, ring.rank, ring.size).to(ids.device)
    rows = (router.split_rows(where, padded, length, lambda mine: _in_sequence_order(mine, ring))
            if router is not None else contextlib.nullcontext())
    with splitting_sequences_over(ring), rows:
        logits = model(input_ids=ids_padded[:, where], position_ids=where.expand(ids.shape[0], -1),
                       use_cache=False).logits
    return logits, where, ids_padded


def _in_sequence_order(mine: torch.Tensor, ring: Ring) -> torch.Tensor:
    """Every rank's per-position values ``[B, its positions]`` gathered (on every rank) into the
    padded sequence's order; gradients flow back to the rank that computed each position."""
    padded = mine.shape[1] * ring.size
    gathered = ring_all_gather(mine, ring)  # [B, padded] in rank order of positions
    order = torch.cat([positions_of(padded, rank, ring.size) for rank in range(ring.size)]).to(mine.device)
    return gathered[:, torch.argsort(order)]


def context_parallel_logprobs(model: torch.nn.Module, batch: dict[str, torch.Tensor], ring: Ring,
                              router: Any = None) -> torch.Tensor:
    """What :func:`corerl.training.logprobs.model_logprobs` returns for a right-padded micro-batch
    (``[B, T]``: position t holds log p(token t | tokens before it), 0 at t = 0 and on padding), with
    each sequence split over ``ring``'s ranks. The model must attend with ring attention
    (``attn_implementation="corerl_ring"``); a MoE model's ``router`` hooks, see :func:`_forward_split`."""
    logits, where, ids_padded = _forward_split(model, batch, ring, router)
    after = (where + 1).clamp(max=ids_padded.shape[1] - 1)  # the token each of this rank's positions predicts
    mine = picked_logprobs(logits, ids_padded[:, after].unsqueeze(-1)).squeeze(-1)
    if "candidate_ids" in batch:  # [B, T, K]: position t's candidates for token t
        candidates = batch["candidate_ids"]
        padded = torch.nn.functional.pad(candidates, (0, 0, 0, ids_padded.shape[1] - candidates.shape[1]))
        batch["candidate_logprobs"] = _whole(picked_logprobs(logits, padded[:, after]), batch, ring)
    if TOPK_REQUEST in batch:
        top, ids = picked_topk(logits, int(batch[TOPK_REQUEST]))
        batch["topk_logprobs"], batch["topk_ids"] = _whole(top, batch, ring), _whole(ids, batch, ring)
    return _whole(mine, batch, ring)


def _whole(mine: torch.Tensor, batch: dict[str, torch.Tensor], ring: Ring) -> torch.Tensor:
    """This rank's per-position predictions (``[B, its positions, ...]``: position p's of token
    p + 1) as the whole sequence's ``[B, T, ...]``, aligned as the core's logprobs are: position t
    holds the prediction of token t, 0 at t = 0 and on padding."""
    of_next = _in_sequence_order(mine, ring)
    length = batch["input_ids"].shape[1]
    out = torch.cat([torch.zeros_like(of_next[:, :1]), of_next[:, :length - 1]], dim=1)
    mask = batch["attention_mask"].to(out.dtype)
    return out * mask.reshape(*mask.shape, *(1,) * (out.dim() - 2))


def context_parallel_values(model: torch.nn.Module, batch: dict[str, torch.Tensor], ring: Ring,
                            router: Any = None) -> torch.Tensor:
    """What :func:`corerl.models.value_model.model_values` returns for a right-padded micro-batch
    (a critic's values lined up with the logprobs), each sequence split over ``ring``'s ranks."""
    head, _, _ = _forward_split(model, batch, ring, router)
    after = _in_sequence_order(head[..., 0].float(), ring)  # position p: the state after token p
    return shift_values(after[:, :batch["input_ids"].shape[1]], batch["attention_mask"])
