"""Logprobs of the positions a loss reads, with the LM head run only there, a chunk at a time.

A causal LM's forward ends with its output embeddings (the LM head) over every position: a
``[rows, tokens, vocabulary]`` tensor (49,152 words for SmolLM2, 151,936 for Qwen2), most of it
for prompt and padding positions whose logprobs no loss reads. Here a forward pre-hook on the head
takes the final hidden states as the model hands them to it, inside the model's own forward (so
FSDP2's gathered parameters, autocast and a PEFT-wrapped head are all as the model sees them), keeps
the positions whose next token is needed (:func:`needed_positions`), and runs the head over those
only, :data:`CHUNK_ELEMENTS` logits at a time; the head then gets zero positions and returns an
empty logits tensor. Where the logits of all chunks together would exceed
:data:`KEEP_LOGITS_ELEMENTS`, each chunk's logits are recomputed in the backward pass instead of
kept (``torch.utils.checkpoint``), so neither pass holds more than one chunk's logits.

Models whose forward changes the logits after the head (a final soft-cap or scale, read from the
config), heads whose weight DeepSpeed ZeRO-3 partitions (gathered only around the head's own
forward and backward, which this bypasses), models under the legacy FSDP1 wrapper (its backward
hooks wait on the root's outputs, which the scores bypass) and models without output embeddings are
scored from the model's full logits instead (:func:`head_hookable` says which).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: logits one chunk of the head works on (128 MiB of fp32 temporaries; at Qwen2's 151,936 words, 220
#: positions: fewer chunks pass over the head's weight fewer times)
CHUNK_ELEMENTS = 1 << 25
#: up to this many logits in all (512 MiB in fp32), every chunk's logits are kept for the backward
#: pass; past it each chunk is recomputed there (one more head matmul, memory of one chunk)
KEEP_LOGITS_ELEMENTS = 1 << 27
#: config fields of models whose forward rescales or caps the logits after the head
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def needed_positions(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[B, T]`` bool: the positions whose token logprob is computed: a real token
    (``attention_mask``), read by the loss (``loss_mask``, where the batch has one), with a token
    before it in its sequence (not position 0; in a packed row, not where ``position_ids`` is 0)."""
    needed = batch["attention_mask"] != 0
    if "loss_mask" in batch:
        needed = needed & (batch["loss_mask"] != 0)
    if "position_ids" in batch:
        needed = needed & (batch["position_ids"] != 0)
    needed = needed.clone()
    needed[:, 0] = False
    return needed


def _unwrapped(model: Any) -> Any:
    """The Hugging Face model under DeepSpeed's engine or DDP (``.module``)."""
    while hasattr(model, "module") and not hasattr(model, "get_output_embeddings"):
        model = model.module
    return model


def _under_fsdp1(model: Any) -> bool:
    """Whether ``model`` is wrapped by the legacy ``FullyShardedDataParallel`` (FSDP1): its backward
    hooks hang on the root's outputs, which the head's scores bypass."""
    import sys

    fsdp = sys.modules.get("torch.distributed.fsdp")
    legacy = getattr(fsdp, "FullyShardedDataParallel", None)
    while legacy is not None and model is not None:
        if isinstance(model, legacy):
            return True
        model = getattr(model, "module", None) if not hasattr(model, "get_output_embeddings") else None
    return False


def head_hookable(model: Any) -> bool:
    """Whether :func:`scoring_head` can score ``model``: it has output embeddings with a weight that
    is not partitioned by ZeRO-3, it is not under FSDP1, and its config applies nothing to the
    logits after the head."""
    if _under_fsdp1(model):
        return False
    inner = _unwrapped(model)
    get_head = getattr(inner, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    weight = getattr(head, "weight", None)
    if head is None or weight is None or hasattr(weight, "ds_id"):
        return False
    config = getattr(inner, "config", None)
    configs = [config, getattr(config, "text_config", None)]
    return not any(getattr(c, name, None) not in (None, 1, 1.0) for c in configs if c is not None
                   for name in _LOGIT_TRANSFORMS)


class HeadScores:
    """What :func:`scoring_head` computed in the forward it hooked: ``logprobs`` ``[B, T]`` float32
    (0 where not needed), and with ``candidates`` ``[B, T, K]`` their logprobs, with ``topk`` the
    top-k logprobs and ids (aligned as :mod:`corerl.training.logprobs` aligns them)."""

    def __init__(self) -> None:
        self.logprobs: torch.Tensor | None = None
        self.candidate_logprobs: torch.Tensor | None = None
        self.topk: tuple[torch.Tensor, torch.Tensor] | None = None


@contextmanager
def scoring_head(model: Any, input_ids: torch.Tensor, needed: torch.Tensor, *,
                 candidates: torch.Tensor | None = None, topk: int | None = None) -> Iterator[HeadScores]:
    """A forward of ``model`` inside this context scores the ``needed`` positions of ``input_ids``
    through the head (see the module's docstring); the :class:`HeadScores` it yields holds them once
    the forward returns. ``candidates`` ``[B, T, K]``: also the logprobs of those ids;
    ``topk``: also the ``topk`` likeliest next tokens (no gradient)."""
    head = _unwrapped(model).get_output_embeddings()
    scores = HeadScores()
    busy = [False]

    def hook(module: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if busy[0]:  # the head called below, for one chunk
            return None
        hidden = args[0]
        busy[0] = True
        try:
            _score(head, hidden, input_ids, needed, candidates, topk, scores)
        finally:
            busy[0] = False
        return (hidden[..., :0, :], *args[1:])

    handle = head.register_forward_pre_hook(hook)
    try:
        yield scores
    finally:
        handle.remove()
    if scores.logprobs is None:
        raise RuntimeError(f"{type(_unwrapped(model)).__name__}'s forward did not call its output embeddings "
                           "(corerl.training.head_logprobs scores the tokens there)")


def _score(head: Any, hidden: torch.Tensor, input_ids: torch.Tensor, needed: torch.Tensor,
           candidates: torch.Tensor | None, topk: int | None, scores: HeadScores) -> None:
    import torch

    if hidden.shape[:2] != input_ids.shape:
        raise RuntimeError(f"the head got hidden states of shape {tuple(hidden.shape)} for input ids of shape "
                           f"{tuple(input_ids.shape)}")
    rows, width = input_ids.shape
    picked = needed[:, 1:]
    states = hidden[:, :-1][picked]  # [N, H]: the state before each needed token
    targets = input_ids[:, 1:][picked].unsqueeze(-1)
    if candidates is not None:
        targets = torch.cat([targets, candidates[:, 1:][picked]], dim=-1)
    vocab = int(head.weight.shape[0])
    step = max(1, CHUNK_ELEMENTS // max(1, vocab))
    recompute = torch.is_grad_enabled() and states.requires_grad and states.shape[0] * vocab > KEEP_LOGITS_ELEMENTS
    parts, tops, top_ids = [], [], []
    for start in range(0, states.shape[0], step):
        chunk, wanted = states[start:start + step], targets[start:start + step]
        if recompute:
            from torch.utils.checkpoint import checkpoint

            parts.append(checkpoint(_picked, head, chunk, wanted, use_reentrant=False))
            if topk is not None:
                with torch.no_grad():
                    _top(head(chunk).float(), topk, tops, top_ids)
        else:
            logits = head(chunk).float()
            scored, norm = _scored(logits, wanted)
            parts.append(scored)
            if topk is not None:  # from the same logits: the head runs once a chunk
                with torch.no_grad():
                    _top(logits, topk, tops, top_ids, norm)
    width_k = targets.shape[-1]
    if not parts:  # no position to score (a micro-batch whose rows the loss masks out): the head still
        parts.append(_picked(head, states, targets))  # runs, on none, so the loss keeps its graph
    values = torch.cat(parts)
    full = _placed(values, picked, rows, width, width_k)
    scores.logprobs = full[..., 0]
    if candidates is not None:
        scores.candidate_logprobs = full[..., 1:]
    if topk is not None:
        top = torch.cat(tops) if tops else values.new_zeros((0, topk))
        ids = torch.cat(top_ids) if top_ids else torch.zeros((0, topk), dtype=torch.long, device=values.device)
        scores.topk = (_placed(top, picked, rows, width, topk), _placed(ids, picked, rows, width, topk))


def _top(logits: torch.Tensor, k: int, tops: list[torch.Tensor], ids: list[torch.Tensor],
         norm: torch.Tensor | None = None) -> None:
    """Append the ``k`` likeliest tokens' logprobs and ids under ``logits`` (float32, ``[n, V]``;
    ``norm`` their log-sum-exp where known) to ``tops`` and ``ids``, without gradient."""
    import torch

    values, index = logits.detach().topk(k, dim=-1)
    norm = torch.logsumexp(logits.detach(), dim=-1, keepdim=True) if norm is None else norm.detach()
    tops.append(values - norm)
    ids.append(index)


def _scored(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[n, K]``: log p(targets[i, k]) under float32 ``logits`` ``[n, V]``, and their log-sum-exp ``[n, 1]``."""
    import torch

    norm = torch.logsumexp(logits, dim=-1, keepdim=True)
    return logits.gather(-1, targets) - norm, norm


def _picked(head: Any, states: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``[n, K]`` float32: log p(targets[i, k]) under the head's distribution at ``states[i]``."""
    return _scored(head(states).float(), targets)[0]


def _placed(values: torch.Tensor, picked: torch.Tensor, rows: int, width: int, k: int) -> torch.Tensor:
    """``[rows, width, k]``: ``values`` ``[N, k]`` at the ``picked`` positions (shifted by one: the
    prediction of token t sits at t), 0 elsewhere; differentiable in ``values``."""
    import torch

    body = values.new_zeros((rows, width - 1, k)).masked_scatter(picked.unsqueeze(-1), values)
    return torch.cat([values.new_zeros((rows, 1, k)), body], dim=1)
