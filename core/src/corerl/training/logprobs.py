"""Per-token logprobs from a causal LM's logits."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


#: elements of the logits one log-sum-exp works on at a time (64 MiB of fp32 temporaries)
LOGSUMEXP_ELEMENTS = 1 << 24


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` float32: position t holds log p(input_ids[t] | input_ids[:t]); 0 at t=0 and on padding."""
    import torch

    # the chosen token's logit minus the log-sum-exp, a slice of positions at a time: no full-size
    # log-softmax copy of the [B, T, V] logits (3 GB at 64 x 256 x 49,152 in fp32), and in the
    # backward pass only the logits' own gradient
    body, targets = logits[:, :-1], input_ids[:, 1:].unsqueeze(-1)
    step = max(1, LOGSUMEXP_ELEMENTS // max(1, body.shape[0] * body.shape[-1]))
    parts = []
    for start in range(0, body.shape[1], step):
        chunk = body[:, start:start + step].float()
        parts.append(chunk.gather(-1, targets[:, start:start + step]).squeeze(-1) - torch.logsumexp(chunk, dim=-1))
    picked = torch.cat(parts, dim=1) if parts else body.new_zeros(body.shape[:2], dtype=torch.float32)
    out = torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)
    return out * attention_mask.to(out.dtype)


def model_logprobs(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Run ``model`` on a micro-batch and return :func:`token_logprobs`.

    A right-padded micro-batch goes in with its ``attention_mask``. A packed one (it has
    ``position_ids``, restarting at 0 where each sequence starts) goes in with the positions
    and no mask, and ``use_cache=False``: transformers then builds a block-diagonal causal
    mask from the restarts (with a cache it silently attends across sequences). Each
    sequence's first token gets logprob 0, as position 0 of a padded row does.
    """
    if "position_ids" in batch:
        out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False)
        inside = batch["attention_mask"] * (batch["position_ids"] != 0).to(batch["attention_mask"].dtype)
        return token_logprobs(out.logits, batch["input_ids"], inside)
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
    return token_logprobs(out.logits, batch["input_ids"], batch["attention_mask"])
