"""Plain single-process PyTorch references the conformance suites compare backends against."""

from __future__ import annotations

from typing import Any

import torch


def max_diff(a: torch.Tensor, b: torch.Tensor, *, empty: float | None = None) -> float:
    """The largest absolute difference between ``a`` and ``b``, element by element, in float32: what
    every check of the conformance suites compares within its tolerance. Tensors without elements
    have no difference to measure: ``empty`` is the answer for them where the caller gives one (the
    offload check's logprobs of an empty batch: 0.0, nothing differs), else a ValueError (a check that
    compares nothing is a broken check, not a passing one)."""
    if a.numel() == 0:
        if empty is None:
            raise ValueError(f"max_diff of tensors without elements (shapes {tuple(a.shape)} and {tuple(b.shape)}): "
                             "nothing to compare")
        return empty
    return float((a.float() - b.float()).abs().max())


def loss_positions(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[B, T]`` float32: 1 where the training contract defines a token's logprob (inside the
    attention mask, not position 0, and where the batch has a ``loss_mask``, inside it), else 0."""
    keep = batch["attention_mask"].float().clone()
    if "loss_mask" in batch:
        keep *= batch["loss_mask"].float()
    keep[:, 0] = 0
    return keep


def at_loss_positions(logprobs: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """``logprobs`` (``[B, T]`` or ``[B, T, k]``) with 0 wherever :func:`loss_positions` is 0: what
    the conformance suites compare, so that a backend may compute the other positions or not."""
    keep = loss_positions(batch).to(logprobs.device)
    return logprobs * (keep if logprobs.dim() == 2 else keep.unsqueeze(-1)).to(logprobs.dtype)


def _plain_logprobs(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per-token logprobs ``[B, T]`` by a plain transformers forward, written out independently of
    corerl; 0 outside :func:`loss_positions`."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    return torch.cat([torch.zeros_like(logp[:, :1]), logp], dim=1) * loss_positions(batch)


def _unpadded_logprobs(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per-token logprobs ``[B, T]``, each row run alone at its own length (no padding, no mask);
    0 outside :func:`loss_positions`."""
    rows = []
    for ids, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True):
        n = int(mask.sum())
        logits = model(input_ids=ids[None, :n]).logits.float()
        logp = torch.log_softmax(logits[0, :-1], dim=-1).gather(-1, ids[1:n, None])[:, 0]
        rows.append(torch.cat([logp.new_zeros(1), logp, logp.new_zeros(ids.shape[0] - n)]))
    return torch.stack(rows) * loss_positions(batch)


def _plain_values(model: Any, batch: dict[str, torch.Tensor], unpadded: bool = False) -> torch.Tensor:
    """Per-token values ``[B, T]`` of a token-classification value model, written out independently
    of corerl: the head's output at ``t - 1`` (the state before token ``t``), 0 at 0 and on padding."""
    if unpadded:
        rows = []
        for ids, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True):
            n = int(mask.sum())
            head = model(input_ids=ids[None, :n]).logits[0, :, 0].float()
            rows.append(torch.cat([head.new_zeros(1), head[: n - 1], head.new_zeros(ids.shape[0] - n)]))
        return torch.stack(rows)
    head = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[..., 0].float()
    return torch.cat([torch.zeros_like(head[:, :1]), head[:, :-1]], dim=1) * batch["attention_mask"]


def hf_values(model: Any, batch: dict[str, torch.Tensor], *, unpadded: bool = False) -> torch.Tensor:
    """:func:`_plain_values` without gradient."""
    with torch.no_grad():
        return _plain_values(model, batch, unpadded)


def hf_logprobs(model: Any, batch: dict[str, torch.Tensor], *, unpadded: bool = False) -> torch.Tensor:
    """:func:`_plain_logprobs` (or, ``unpadded``, each row alone) without gradient."""
    with torch.no_grad():
        return _unpadded_logprobs(model, batch) if unpadded else _plain_logprobs(model, batch)


def _plain_candidate_logprobs(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[B, T, K]`` logprobs of the batch's ``candidate_ids`` at each position, by a plain forward."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, batch["candidate_ids"][:, 1:])
    return torch.cat([torch.zeros_like(logp[:, :1]), logp], dim=1) * loss_positions(batch)[..., None]


def hf_topk(model: Any, batch: dict[str, torch.Tensor], k: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """By a plain transformers forward, without gradient: ``({"tokens": [B, T] logprobs,
    "topk": [B, T, k] top-k logprobs, "all": [B, T - 1, V] every next token's logprob}, [B, T, k]
    top-k ids)``, aligned as the training contract's logprobs (0 outside :func:`loss_positions`)."""
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
        full = torch.log_softmax(logits[:, :-1], dim=-1)
        top, ids = full.topk(k, dim=-1)
        mask = loss_positions(batch)[..., None]
        top = torch.cat([torch.zeros_like(top[:, :1]), top], dim=1) * mask
        ids = torch.cat([torch.zeros_like(ids[:, :1]), ids], dim=1) * mask.long()
        return {"tokens": _plain_logprobs(model, batch), "topk": top, "all": full}, ids


def reference_sgd_step(
    model_dir: str, batch: dict[str, torch.Tensor], loss_fn: Any, *, lr: float, momentum: float,
    max_grad_norm: float | None, unpadded: bool = False, critic: bool = False,
) -> tuple[float, dict[str, torch.Tensor]]:
    """One SGD step on the whole batch at once (``unpadded``: each row's forward alone, at its
    own length): transformers model, ``torch.optim.SGD``, ``clip_grad_norm_``; ``critic``: a value
    model whose values the loss reads. Returns the loss and the updated parameters by name."""
    loss, _, params = reference_gradients(model_dir, batch, loss_fn, max_grad_norm=max_grad_norm, unpadded=unpadded,
                                          lr=lr, momentum=momentum, critic=critic)
    return loss, params


def reference_gradients(
    model_dir: str, batch: dict[str, torch.Tensor], loss_fn: Any, *, max_grad_norm: float | None,
    unpadded: bool = False, lr: float = 0.0, momentum: float = 0.0, critic: bool = False,
) -> tuple[float, tuple[float, dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    """Loss, (gradient norm before clipping, clipped gradients by name) and the parameters
    after one SGD step with ``lr`` (the loaded ones when ``lr`` is 0)."""
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    if critic:
        model = AutoModelForTokenClassification.from_pretrained(model_dir, dtype=torch.float32)
        model.eval()  # the plain reference runs its head without dropout, as a critic does
        logprobs = _plain_values(model, batch, unpadded)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        logprobs = _unpadded_logprobs(model, batch) if unpadded else _plain_logprobs(model, batch)
        if "candidate_ids" in batch:  # a forward-KL loss reads the candidates' logprobs too
            batch = {**batch, "candidate_logprobs": _plain_candidate_logprobs(model, batch)}
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    normaliser = float(batch["loss_mask"][:, 1:].sum())
    loss, _ = loss_fn(logprobs, batch, normaliser)
    loss.backward()
    limit = max_grad_norm if max_grad_norm is not None else float("inf")
    norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), limit))
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    optimizer.step()
    return float(loss.item()), (norm, grads), {name: p.detach().clone() for name, p in model.named_parameters()}


def recipe_lora_config(settings: Any) -> Any:
    """PEFT's ``LoraConfig`` for a causal LM with the values of a recipe's ``policy.lora``, written
    out here from what each key means (docs/lora.md), not through corerl's own mapping
    (:func:`corerl.lora.adapter.peft_config`), so that a reference built with it catches a wrong
    mapping: rank ``dim``, scaling ``alpha / dim``, ``dropout`` on the adapter's input, every
    linear layer but the output head (``match_all_linear`` or no ``target_modules``) or the named
    ones, none of ``exclude_modules``, no bias."""
    from peft import LoraConfig

    if settings.match_all_linear or not settings.target_modules:
        targets: Any = "all-linear"
    else:
        targets = list(settings.target_modules)
    return LoraConfig(r=int(settings.dim), lora_alpha=settings.alpha, lora_dropout=float(settings.dropout),
                      target_modules=targets, exclude_modules=list(settings.exclude_modules) or None,
                      bias="none", task_type="CAUSAL_LM")


def reference_lora_steps(model_dir: str, batch: dict[str, torch.Tensor], loss_fn: Any, settings: Any,
                         start: dict[str, torch.Tensor], lrs: list[float]) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Plain PEFT steps in PyTorch: the transformers model wrapped by ``peft.get_peft_model`` with
    :func:`recipe_lora_config` of ``settings`` (``policy.lora``), the adapter ``start`` loaded, then
    one SGD step (momentum 0.9, gradients clipped to norm 1) per learning rate in ``lrs`` on the
    whole batch. Returns the losses and the adapter after the steps (PEFT's saved names).

    Deterministic: ``settings.dropout`` must be 0 (no reference can draw an engine's dropout masks)."""
    from peft import get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    if settings.dropout:
        raise ValueError(f"reference_lora_steps compares deterministic steps: policy.lora.dropout must be 0, "
                         f"got {settings.dropout}")
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                           recipe_lora_config(settings))
    result = set_peft_model_state_dict(model, start)
    unexpected = [k for k in getattr(result, "unexpected_keys", ()) if ".lora_" in k]
    if unexpected:
        raise ValueError(f"the engine's adapter has tensors the recipe's LoRA does not: {unexpected[:5]}")
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=lrs[0], momentum=0.9)
    normaliser = float(batch["loss_mask"][:, 1:].sum())
    losses = []
    for lr in lrs:
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss, _ = loss_fn(_plain_logprobs(model, batch), batch, normaliser)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.item()))
    return losses, {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
