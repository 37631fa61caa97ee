"""Plain single-process PyTorch references the conformance suites compare backends against."""

from __future__ import annotations

from typing import Any

import torch


def _plain_logprobs(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per-token logprobs ``[B, T]`` by a plain transformers forward, written out independently of corerl."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    return torch.cat([torch.zeros_like(logp[:, :1]), logp], dim=1) * batch["attention_mask"]


def hf_logprobs(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """:func:`_plain_logprobs` without gradient."""
    with torch.no_grad():
        return _plain_logprobs(model, batch)


def reference_sgd_step(
    model_dir: str, batch: dict[str, torch.Tensor], loss_fn: Any, *, lr: float, momentum: float, max_grad_norm: float | None
) -> tuple[float, dict[str, torch.Tensor]]:
    """One SGD step on the whole batch at once: transformers model, ``torch.optim.SGD``,
    ``clip_grad_norm_``. Returns the loss and the updated parameters by name."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    logprobs = _plain_logprobs(model, batch)
    normaliser = float(batch["loss_mask"][:, 1:].sum())
    loss, _ = loss_fn(logprobs, batch, normaliser)
    loss.backward()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return float(loss.item()), {name: p.detach().clone() for name, p in model.named_parameters()}
