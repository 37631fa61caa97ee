"""Logprobs through megatron's vocabulary-parallel output layer at the positions that need them only.

GPTModel runs its output layer (a ColumnParallelLinear, the vocabulary split over the
tensor-parallel ranks, gathered whole on each since the backend builds it with
``parallel_output=False``) over every position of every row: a ``[rows, tokens, vocabulary]``
tensor per micro-batch (49,152 words for SmolLM2, 151,936 for Qwen2), most of it prompt and padding
whose logprob no loss reads. Here instead:

- :class:`HiddenTap` makes the output layer hand back its input while it is active (the final
  norm's output, gathered over the sequence-parallel ranks; the model's forward then returns
  ``[rows, tokens, hidden]``), so the decoder runs as before and GPTModel's own forward stays in
  charge of everything up to the head (pipeline stages, packed rows' masks, LoRA, MoE).
- :func:`head_logprobs` picks the hidden states the needed positions read (:func:`corerl.sdk.needed_positions`:
  position t's logprob reads the state at t - 1) and pushes them through this rank's slice of the
  output weight a chunk of positions at a time (:data:`CHUNK_ELEMENTS` logits at most), each token's
  logprob from megatron-core's vocabulary-parallel cross-entropy (max and sum of exponentials
  all-reduced over the tensor-parallel group, the target's logit from the rank that holds it).
  In training, past :data:`KEPT_CHUNKS` chunks, each is recomputed in the backward pass
  (``torch.utils.checkpoint``), so the backward holds one chunk's logits too.
- the top-k a distillation teacher reports and a student's candidate logprobs come from the same
  chunks (a vocabulary-parallel log-sum-exp; the top-k of each rank's slice, then of theirs).

The result keeps the layout of the full-logits path (``[rows, tokens]`` float32, candidates and
top-k ``[rows, tokens, k]``) with 0 (and id 0) at every position that is not needed. A critic's
value head is no vocabulary head and does not go through here. The multi-token-prediction heads'
draft loss distils the trunk's whole distribution: :class:`corerl_megatron.training.mtp.DraftHeads`
computes it from the trunk's hidden states where the tap was active (a chunk at a time with
``mtp_loss_chunk_size``).
"""

from __future__ import annotations

from typing import Any

import torch

from corerl.sdk import needed_positions

#: logits (positions x this rank's vocabulary slice) one chunk computes at a time: 64 MiB in float32,
#: about 340 positions at SmolLM2's 49,152 words on one rank
CHUNK_ELEMENTS = 1 << 24

#: chunks whose logits a training forward keeps for its backward pass (256 MiB at CHUNK_ELEMENTS, as
#: the core's head for the other backends keeps): past them every chunk is recomputed in the backward
KEPT_CHUNKS = 4


class HiddenTap:
    """While :attr:`active`, the GPTModel's output layer returns its input instead of logits (as
    ``(hidden, None)``, the layer's own return shape): the final norm's output ``[tokens, rows,
    hidden]``, gathered over the sequence-parallel ranks when the layer is sequence-parallel, and
    ready for this rank's slice of the vocabulary (its gradient is summed over the tensor-parallel
    ranks in the backward pass, as the layer's own input's is). Otherwise the layer runs as built
    (generation, the multi-token-prediction heads' logits)."""

    def __init__(self, gpt: Any) -> None:
        self.gpt = gpt
        self.active = False
        layer = gpt.output_layer
        self._layer_forward = layer.forward
        layer.forward = self._forward  # the instance's forward: GPTModel calls self.output_layer(...)

    def _forward(self, hidden: torch.Tensor, weight: Any = None, runtime_gather_output: Any = None) -> Any:
        if not self.active:
            return self._layer_forward(hidden, weight=weight, runtime_gather_output=runtime_gather_output)
        from megatron.core.tensor_parallel import (
            copy_to_tensor_model_parallel_region,
            gather_from_sequence_parallel_region,
        )

        group = _tp()[0]
        if getattr(self.gpt.output_layer, "sequence_parallel", False):  # all-gather; reduce-scatter backward
            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=True, group=group)
        else:
            hidden = copy_to_tensor_model_parallel_region(hidden, group)  # identity; all-reduce backward
        # GPTModel transposes what the layer returns: the gradient comes back as a transposed view, and
        # megatron-core's all-reduce of a gradient reduces a contiguous copy and hands back the view
        return _ContiguousGrad.apply(hidden), None

    def weight(self) -> torch.Tensor:
        """This rank's ``[vocabulary / tp, hidden]`` slice of the output weight (the embedding's
        where they are tied: on the last stage GPTModel keeps the tied copy as the layer's weight)."""
        if self.gpt.share_embeddings_and_output_weights:
            return self.gpt.shared_embedding_or_output_weight()
        return self.gpt.output_layer.weight


class _ContiguousGrad(torch.autograd.Function):
    """The identity, whose gradient is made contiguous on its way back."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def _tp() -> tuple[Any, int, int]:
    from megatron.core import parallel_state as ps

    return ps.get_tensor_model_parallel_group(), ps.get_tensor_model_parallel_rank(), \
        ps.get_tensor_model_parallel_world_size()


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(hidden, weight).float()


def _log_normaliser(logits: torch.Tensor) -> torch.Tensor:
    """``[n]`` log-sum-exp of ``[n, vocabulary / tp]`` logits over the whole vocabulary: the max
    (no gradient) and the sum of exponentials all-reduced over the tensor-parallel group."""
    import torch.distributed as dist
    from megatron.core.tensor_parallel import reduce_from_tensor_model_parallel_region

    group, _, tp = _tp()
    top = logits.detach().max(dim=-1).values
    if tp > 1:
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
    total = (logits - top.unsqueeze(-1)).exp().sum(dim=-1)
    if tp > 1:
        total = reduce_from_tensor_model_parallel_region(total, group)  # all-reduce; identity backward
    return top + total.log()


def _picked(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``[n, k]`` logits of the vocabulary ids ``ids`` ``[n, k]``, each from the rank whose slice holds it."""
    from megatron.core.tensor_parallel import reduce_from_tensor_model_parallel_region

    group, rank, tp = _tp()
    width = logits.shape[-1]
    local = ids - rank * width
    mine = (local >= 0) & (local < width)
    picked = logits.gather(-1, local.clamp(0, width - 1)) * mine
    return reduce_from_tensor_model_parallel_region(picked, group) if tp > 1 else picked


def _topk(logits: torch.Tensor, normaliser: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``([n, k]`` logprobs, ``[n, k]`` vocabulary ids``)`` of the ``k`` likeliest tokens: each rank's
    top-k of its slice, then the top-k of theirs."""
    import torch.distributed as dist

    group, rank, tp = _tp()
    values, ids = logits.topk(min(k, logits.shape[-1]), dim=-1)
    ids = ids + rank * logits.shape[-1]
    if tp > 1:
        all_values, all_ids = [torch.empty_like(values) for _ in range(tp)], [torch.empty_like(ids) for _ in range(tp)]
        dist.all_gather(all_values, values.contiguous(), group=group)
        dist.all_gather(all_ids, ids.contiguous(), group=group)
        values, where = torch.cat(all_values, dim=-1).topk(k, dim=-1)
        ids = torch.cat(all_ids, dim=-1).gather(-1, where)
    return values - normaliser.unsqueeze(-1), ids


def _chunk(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, candidates: torch.Tensor | None,
           k: int | None) -> tuple[torch.Tensor, ...]:
    """One chunk's token logprobs ``[n]``, and its candidates' ``[n, K]`` and top-k (logprobs and ids,
    ``[n, k]``, no gradient) where asked (empty otherwise)."""
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    logits = _chunk_logits(hidden, weight)
    top: tuple[torch.Tensor, ...] = ()
    if candidates is None and k is None:  # the token's logprob alone: megatron-core's, in the logits' storage
        return (-vocab_parallel_cross_entropy(logits, targets),)
    normaliser = _log_normaliser(logits)
    if k is not None:
        with torch.no_grad():
            top = _topk(logits.detach(), normaliser.detach(), k)
    if candidates is None:
        return (-vocab_parallel_cross_entropy(logits, targets), *top)
    # the token and its candidates from the same gather (the cross-entropy would overwrite logits the
    # gather's backward pass reads)
    picked = _picked(logits, torch.cat([targets.unsqueeze(-1), candidates], dim=-1)) - normaliser.unsqueeze(-1)
    return (picked[:, 0], picked[:, 1:], *top)


def head_logprobs(hidden: torch.Tensor, weight: torch.Tensor, mb: dict[str, torch.Tensor],
                  chunk_elements: int = CHUNK_ELEMENTS, topk: int | None = None) -> torch.Tensor:
    """``[rows, tokens]`` float32 logprobs of ``mb``'s tokens from the final hidden states ``hidden``
    ``[rows, tokens, hidden]`` (:class:`HiddenTap`) through this rank's output weight slice, at
    :func:`corerl.sdk.needed_positions` only (0 elsewhere). With ``candidate_ids`` in ``mb`` its
    ``candidate_logprobs`` (differentiable), with ``topk`` its ``topk_logprobs`` and ``topk_ids``,
    are written into it, laid out as the full-logits path lays them out."""
    from torch.utils.checkpoint import checkpoint

    rows, width = mb["input_ids"].shape[:2]
    needed = needed_positions(mb).to(hidden.device)
    row, col = needed.nonzero(as_tuple=True)
    states = hidden[row, col - 1]  # position t's token is predicted from position t - 1
    targets = mb["input_ids"].to(hidden.device)[row, col]
    candidates = mb["candidate_ids"].to(hidden.device)[row, col] if "candidate_ids" in mb else None
    step = max(1, chunk_elements // max(1, weight.shape[0]))
    # past KEPT_CHUNKS chunks, each one's logits are computed again in the backward pass instead of kept
    # from the forward (what the cross-entropy keeps for its backward is a chunk's logits)
    recompute = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad) and \
        states.shape[0] > KEPT_CHUNKS * step
    tokens, chosen, top_values, top_ids = [], [], [], []
    # no needed position: one empty chunk still, so that the loss reaches the hidden states and the weight
    # (a backward pass, and a pipeline's previous stage, wait for their gradients)
    for start in range(0, max(1, states.shape[0]), step):
        part = slice(start, start + step)
        args = (states[part], weight, targets[part], candidates[part] if candidates is not None else None, topk)
        out = checkpoint(_chunk, *args, use_reentrant=False) if recompute else _chunk(*args)
        tokens.append(out[0])
        rest = list(out[1:])
        if candidates is not None:
            chosen.append(rest.pop(0))
        if topk is not None:
            top_values.append(rest[0])
            top_ids.append(rest[1])

    def laid_out(parts: list[torch.Tensor], trailing: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        out = torch.zeros((rows, width, *trailing), dtype=dtype, device=hidden.device)
        if not parts:
            return out
        return out.index_put((row, col), torch.cat(parts).to(dtype))

    if candidates is not None:
        mb["candidate_logprobs"] = laid_out(chosen, (candidates.shape[-1],), torch.float32)
    if topk is not None:
        mb["topk_logprobs"] = laid_out(top_values, (topk,), torch.float32)
        mb["topk_ids"] = laid_out(top_ids, (topk,), torch.long)
    return laid_out(tokens, (), torch.float32)
