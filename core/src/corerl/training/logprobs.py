"""Per-token logprobs from a causal LM's logits."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


#: elements of the logits one log-sum-exp works on at a time (64 MiB of fp32 temporaries)
LOGSUMEXP_ELEMENTS = 1 << 24


def _position_chunks(body: torch.Tensor) -> Iterator[tuple[slice, torch.Tensor]]:
    """``body`` ``[B, T, V]`` a slice of positions at a time, each in float32 and small enough for
    one log-sum-exp (:data:`LOGSUMEXP_ELEMENTS`): no full-size log-softmax copy of the logits (3 GB
    at 64 x 256 x 49,152 in fp32), and in the backward pass only the logits' own gradient."""
    step = max(1, LOGSUMEXP_ELEMENTS // max(1, body.shape[0] * body.shape[-1]))
    for start in range(0, body.shape[1], step):
        yield slice(start, start + step), body[:, start:start + step].float()


def _shifted(parts: list[torch.Tensor], body: torch.Tensor, trailing: tuple[int, ...], dtype: torch.dtype,
             attention_mask: torch.Tensor) -> torch.Tensor:
    """Per-position ``parts`` (predictions of tokens 1..T-1) as ``[B, T, *trailing]``: 0 at position
    0 (no context) and where ``attention_mask`` is 0."""
    import torch

    picked = torch.cat(parts, dim=1) if parts else body.new_zeros((*body.shape[:2], *trailing), dtype=dtype)
    out = torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)
    return out * attention_mask.to(out.dtype).reshape(*attention_mask.shape, *(1,) * len(trailing))


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` float32: position t holds log p(input_ids[t] | input_ids[:t]); 0 at t=0 and on padding."""
    return candidate_logprobs(logits, input_ids.unsqueeze(-1), attention_mask).squeeze(-1)


def candidate_logprobs(logits: torch.Tensor, candidate_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, T, K]`` float32: position t holds log p(candidate_ids[t, k] | input_ids[:t]) for each of
    the K candidates (aligned like :func:`token_logprobs`, so position 0 and padding hold 0): the
    student's side of a forward KL over a teacher's top-k tokens, and with K = 1 the token's own."""
    import torch

    body, targets = logits[:, :-1], candidate_ids[:, 1:]
    return _shifted([picked_logprobs(body, targets)], body, (targets.shape[-1],), torch.float32, attention_mask)


def picked_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``[B, T, K]`` float32: position t holds log p(targets[t, k]) under the distribution of
    ``logits[:, t]`` (no shift: each position's own logits), a slice of positions at a time
    (:func:`_position_chunks`): for a forward of one's own whose positions are not the sequence's
    (context parallelism's chunks)."""
    import torch

    parts = [chunk.gather(-1, targets[:, where]) - torch.logsumexp(chunk, dim=-1, keepdim=True)
             for where, chunk in _position_chunks(logits)]
    return torch.cat(parts, dim=1) if parts else logits.new_zeros((*logits.shape[:2], targets.shape[-1]),
                                                                  dtype=torch.float32)


def picked_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most likely tokens under each position's own logits (no shift, as
    :func:`picked_logprobs`): ``([B, T, k]`` float32 logprobs, ``[B, T, k]`` long ids``)``, a slice of
    positions at a time (:func:`_position_chunks`)."""
    import torch

    values, ids = [], []
    for _, chunk in _position_chunks(logits):
        top, index = chunk.topk(k, dim=-1)
        values.append(top - torch.logsumexp(chunk, dim=-1, keepdim=True))
        ids.append(index)
    if not values:
        shape = (*logits.shape[:2], k)
        return logits.new_zeros(shape, dtype=torch.float32), logits.new_zeros(shape, dtype=torch.long)
    return torch.cat(values, dim=1), torch.cat(ids, dim=1)


def topk_logprobs(logits: torch.Tensor, k: int, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most likely next tokens at every position: ``([B, T, k]`` float32 logprobs,
    ``[B, T, k]`` long token ids``)``, aligned like :func:`token_logprobs` (position t holds the
    distribution of token t given ``input_ids[:t]``; position 0 and padding hold 0 and id 0)."""
    import torch

    body = logits[:, :-1]
    values, ids = picked_topk(body, k)
    return (_shifted([values], body, (k,), torch.float32, attention_mask),
            _shifted([ids], body, (k,), torch.long, attention_mask))


#: a micro-batch field asking the forward pass for the top-k next tokens (a 0-d long tensor: k)
TOPK_REQUEST = "topk_request"


def join_topk(logprobs: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """One ``[b, T, 1 + 2k]`` float32 tensor a rank sends back for a top-k request: the token
    logprobs, the top-k logprobs, then the top-k ids (exact in float32 for any vocabulary
    under 2^24 tokens); :func:`split_topk` takes it apart."""
    import torch

    return torch.cat([logprobs.float().unsqueeze(-1), batch["topk_logprobs"].float(),
                      batch["topk_ids"].float()], dim=-1)


def split_topk(joined: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(logprobs [B, T], topk_logprobs [B, T, k], topk_ids [B, T, k] long)`` from :func:`join_topk`'s layout."""
    import torch

    k = (joined.shape[-1] - 1) // 2
    return joined[..., 0], joined[..., 1:1 + k], joined[..., 1 + k:].round().to(torch.long)


def batch_logprobs(logits: torch.Tensor, batch: dict[str, torch.Tensor], inside: torch.Tensor) -> torch.Tensor:
    """:func:`token_logprobs` of one micro-batch's logits (``inside``: the positions that hold a
    logprob), and what else the micro-batch asks of the same logits, written into it:

    - with ``candidate_ids`` ``[b, T, K]``: ``candidate_logprobs`` (:func:`candidate_logprobs`,
      differentiable: a loss function reads it next to the logprobs);
    - with :data:`TOPK_REQUEST`: ``topk_logprobs`` and ``topk_ids`` (:func:`topk_logprobs`).
    """
    if "candidate_ids" in batch:
        batch["candidate_logprobs"] = candidate_logprobs(logits, batch["candidate_ids"], inside)
    if TOPK_REQUEST in batch:
        batch["topk_logprobs"], batch["topk_ids"] = topk_logprobs(logits, int(batch[TOPK_REQUEST]), inside)
    return token_logprobs(logits, batch["input_ids"], inside)


def model_logprobs(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Run ``model`` on a micro-batch and return its token logprobs at the positions a loss reads
    (:func:`corerl.training.head_logprobs.needed_positions`: the ``loss_mask``'s; 0 elsewhere), and
    the candidates' or the top-k the micro-batch asks for, written into it (see :func:`batch_logprobs`).

    The LM head runs only at those positions, in chunks (:mod:`corerl.training.head_logprobs`);
    a model whose head cannot be hooked so is scored from its full logits, masked the same way.

    A right-padded micro-batch goes in with its ``attention_mask``. A packed one (it has
    ``position_ids``, restarting at 0 where each sequence starts) goes in with the positions
    and no mask, and ``use_cache=False``: transformers then builds a block-diagonal causal
    mask from the restarts (with a cache it silently attends across sequences). Each
    sequence's first token gets logprob 0, as position 0 of a padded row does.

    A vision-language batch's images (:mod:`corerl.training.image_rows`) go in with its rows.
    """
    from corerl.training.head_logprobs import head_hookable, needed_positions, scoring_head
    from corerl.training.image_rows import image_inputs, image_token_id

    if "position_ids" in batch:
        inputs = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"], "use_cache": False}
        inside = batch["attention_mask"] * (batch["position_ids"] != 0).to(batch["attention_mask"].dtype)
    else:
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "use_cache": False,
                  **image_inputs(batch, image_token_id(model))}
        inside = batch["attention_mask"]
    needed = needed_positions(batch)
    if not head_hookable(model):
        out = model(**inputs)
        return _masked(batch_logprobs(out.logits, batch, inside), batch, needed)
    topk = int(batch[TOPK_REQUEST]) if TOPK_REQUEST in batch else None
    with scoring_head(model, batch["input_ids"], needed, candidates=batch.get("candidate_ids"), topk=topk) as scores:
        model(**inputs)
    assert scores.logprobs is not None
    if scores.candidate_logprobs is not None:
        batch["candidate_logprobs"] = scores.candidate_logprobs
    if scores.topk is not None:
        batch["topk_logprobs"], batch["topk_ids"] = scores.topk
    return scores.logprobs


def _masked(logprobs: torch.Tensor, batch: dict[str, torch.Tensor], needed: torch.Tensor) -> torch.Tensor:
    """The full-logits path's answers kept at the ``needed`` positions only, as the head's path gives them."""
    keep = needed.to(logprobs.dtype)
    for key in ("candidate_logprobs", "topk_logprobs"):
        if key in batch:
            batch[key] = batch[key] * keep.unsqueeze(-1)
    if "topk_ids" in batch:
        batch["topk_ids"] = batch["topk_ids"] * needed.to(batch["topk_ids"].dtype).unsqueeze(-1)
    return logprobs * keep
