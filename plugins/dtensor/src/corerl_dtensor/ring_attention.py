"""Ring attention: causal self-attention over sequences split across context-parallel ranks.

Load balancing: a sequence is cut into ``2 n`` equal chunks and rank ``r`` of ``n`` holds chunks
``r`` and ``2 n - 1 - r`` (an early one and a late one), so that under the causal mask every rank
has the same work. The key/value blocks go round the ring ``n - 1`` times; a rank attends its
queries to each block as it passes and merges the blocks' partial results by their log-sum-exp.
The backward pass sends the blocks round again with their gradient accumulators, which reach their
owner after one more shift.

Why our own and not torch's ``context_parallel``: that one needs flash or efficient SDPA, which
shards only on CUDA; this one runs on every device, so the CPU tests check the path a run takes.
Scores are computed in float32 at least (bf16 and fp16 inputs are upcast).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Protocol

import torch
import torch.distributed as dist

from corerl.sdk import context_parallel_chunks, context_parallel_positions


class Ring(Protocol):
    """The context-parallel ranks in ring order: ``shift`` sends to the next rank and returns what
    the previous one sent (the same shapes)."""

    rank: int
    size: int

    def shift(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]: ...


class ProcessGroupRing:
    """A :class:`Ring` over a torch.distributed process group (point-to-point sends and receives)."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self._next = dist.get_global_rank(group, (self.rank + 1) % self.size) if group else (self.rank + 1) % self.size
        self._prev = dist.get_global_rank(group, (self.rank - 1) % self.size) if group else (self.rank - 1) % self.size

    def shift(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        received = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t.contiguous(), self._next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, self._prev, self.group) for t in received]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return received


chunks_of, positions_of = context_parallel_chunks, context_parallel_positions  # the layout's names here


def _wide(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float, diagonal: bool) -> torch.Tensor:
    scores = torch.matmul(_wide(q), _wide(k).transpose(-1, -2)) * scale
    if diagonal:  # the same chunk: each position sees itself and those before it
        seen = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~seen, float("-inf"))
    return scores


def _pairs(mine: tuple[int, int], theirs: tuple[int, int]) -> list[tuple[int, int, bool]]:
    """(my chunk's slot, their chunk's slot, diagonal) for each pair the causal mask leaves any of."""
    return [(a, b, i == j) for a, i in enumerate(mine) for b, j in enumerate(theirs) if j <= i]


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: Ring, scale: float) -> torch.Tensor:
        mine = chunks_of(ring.rank, ring.size)
        queries = q.chunk(2, dim=2)
        outs: list[torch.Tensor | None] = [None, None]
        lses: list[torch.Tensor | None] = [None, None]
        held = [k, v]
        for step in range(ring.size):
            keys, values = held[0].chunk(2, dim=2), held[1].chunk(2, dim=2)
            for a, b, diagonal in _pairs(mine, chunks_of((ring.rank - step) % ring.size, ring.size)):
                scores = _scores(queries[a], keys[b], scale, diagonal)
                lse = torch.logsumexp(scores, dim=-1)
                out = torch.matmul(torch.exp(scores - lse.unsqueeze(-1)), _wide(values[b]))
                if outs[a] is None:
                    outs[a], lses[a] = out, lse
                else:  # merge two partial softmaxes by their log-sum-exp
                    merged = torch.logaddexp(lses[a], lse)
                    outs[a] = (outs[a] * torch.exp(lses[a] - merged).unsqueeze(-1)
                               + out * torch.exp(lse - merged).unsqueeze(-1))
                    lses[a] = merged
            if step < ring.size - 1:
                held = ring.shift(held)
        out, lse = torch.cat(outs, dim=2), torch.cat(lses, dim=2)  # every chunk sees its own: never None
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.scale = ring, scale
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        ring, scale = ctx.ring, ctx.scale
        mine = chunks_of(ring.rank, ring.size)
        grad_out = _wide(grad_out)
        delta = (grad_out * out).sum(-1)  # rowsum(dO * O): the softmax backward's correction
        grad_q = torch.zeros_like(_wide(q))
        queries, grads_out = q.chunk(2, dim=2), grad_out.chunk(2, dim=2)
        lses, deltas, grads_q = lse.chunk(2, dim=2), delta.chunk(2, dim=2), grad_q.chunk(2, dim=2)
        held = [k, v, torch.zeros_like(_wide(k)), torch.zeros_like(_wide(v))]
        for step in range(ring.size):
            keys, values = held[0].chunk(2, dim=2), held[1].chunk(2, dim=2)
            grads_k, grads_v = held[2].chunk(2, dim=2), held[3].chunk(2, dim=2)  # views: added in place
            for a, b, diagonal in _pairs(mine, chunks_of((ring.rank - step) % ring.size, ring.size)):
                probs = torch.exp(_scores(queries[a], keys[b], scale, diagonal) - lses[a].unsqueeze(-1))
                grads_v[b].add_(torch.matmul(probs.transpose(-1, -2), grads_out[a]))
                grad_scores = probs * (torch.matmul(grads_out[a], _wide(values[b]).transpose(-1, -2))
                                       - deltas[a].unsqueeze(-1))
                grads_q[a].add_(torch.matmul(grad_scores, _wide(keys[b])) * scale)
                grads_k[b].add_(torch.matmul(grad_scores.transpose(-1, -2), _wide(queries[a])) * scale)
            if step < ring.size - 1:
                held = ring.shift(held)
            elif ring.size > 1:  # the accumulators go home: the block held last is the next rank's
                held[2:] = ring.shift(held[2:])
        return grad_q.to(q.dtype), held[2].to(k.dtype), held[3].to(v.dtype), None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: Ring,
                   scale: float | None = None) -> torch.Tensor:
    """Causal attention of this rank's queries over the whole sequence's keys and values.

    ``q``, ``k``, ``v``: ``(batch, heads, local_len, head_dim)``, the rank's two chunks in
    :func:`positions_of` order (keys and values with as many heads as the queries). Returns the
    attention output in the same layout."""
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"ring attention takes as many key/value heads as query heads ({k.shape[1]} vs {q.shape[1]})")
    if q.shape[2] % 2:
        raise ValueError(f"a rank's {q.shape[2]} positions are not two equal chunks")
    return _RingAttention.apply(q, k, v, ring, q.shape[-1] ** -0.5 if scale is None else scale)


# -- as a Hugging Face model's attention ------------------------------------------------------

RING_ATTENTION = "corerl_ring"
_current = threading.local()


@contextlib.contextmanager
def splitting_sequences_over(ring: Ring) -> Iterator[None]:
    """Within it, a model loaded with ``attn_implementation="corerl_ring"`` attends over ``ring``:
    its inputs are this rank's positions (:func:`positions_of`), given as ``position_ids``, with no
    padding (a padding mask is not applied)."""
    previous = getattr(_current, "ring", None)
    _current.ring = ring
    try:
        yield
    finally:
        _current.ring = previous


def _hf_ring_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                       **kwargs: object) -> tuple[torch.Tensor, None]:
    ring = getattr(_current, "ring", None)
    if ring is None:
        raise RuntimeError(f"attn_implementation {RING_ATTENTION!r} runs only inside "
                           "corerl_dtensor.ring_attention.splitting_sequences_over(ring)")
    if dropout:
        raise ValueError("ring attention has no attention dropout; set the model's attention_dropout to 0")
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:  # grouped-query attention: the blocks travel with every query head's copy
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    return ring_attention(query, key, value, ring, scaling).transpose(1, 2).contiguous(), None


def register_with_transformers() -> str:
    """Make ``attn_implementation="corerl_ring"`` known to transformers; returns that name."""
    from transformers import AttentionInterface

    AttentionInterface.register(RING_ATTENTION, _hf_ring_attention)
    return RING_ATTENTION
