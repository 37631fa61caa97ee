"""The conformance suites' fixed inputs: the recipe's optimizer settings, the batches and losses
each check runs (policy-gradient, DPO pairs, GRPO's variants, PPO's value loss), the critic model
built from the tiny policy, and (d)'s save, load and continue procedure (shared by the dense and
the mixture-of-experts checks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from corerl.testing.reference import hf_logprobs

LR = 0.5
MOMENTUM = 0.9
MAX_GRAD_NORM = 1.0


def conformance_loss(logprobs: torch.Tensor, batch: dict[str, torch.Tensor], normaliser: float) -> tuple[torch.Tensor, dict[str, float]]:
    """A policy-gradient-shaped loss: -sum(advantage * logprob) over loss tokens / normaliser."""
    weighted = logprobs * batch["advantages"] * batch["loss_mask"]
    loss = -weighted.sum() / normaliser
    return loss, {"loss_tokens": float(batch["loss_mask"][:, 1:].sum())}


def conformance_batch(rows: int = 4, length: int = 16, vocab: int = 128, seed: int = 0) -> dict[str, torch.Tensor]:
    """A fixed right-padded batch with varied lengths, a prompt/response mask and advantages."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, vocab, (rows, length), generator=gen)
    lengths = [length - (3 * i) % 7 for i in range(rows)]
    attention_mask = torch.zeros(rows, length, dtype=torch.long)
    for row, n in enumerate(lengths):
        attention_mask[row, :n] = 1
    input_ids = input_ids * attention_mask
    loss_mask = attention_mask.clone()
    loss_mask[:, :5] = 0  # the "prompt"
    advantages = torch.randn(rows, 1, generator=gen).expand(rows, length).contiguous()
    return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask, "advantages": advantages}


def preference_conformance_batch(pairs: int = 4, vocab: int = 128, seed: int = 2) -> dict[str, torch.Tensor]:
    """A fixed DPO batch: ``pairs`` (prompt, chosen, rejected) of varied lengths on adjacent rows,
    with reference logprobs on the response tokens."""
    from corerl.algorithms.dpo_math import preference_batch

    gen = torch.Generator().manual_seed(seed)

    def tokens(count: int) -> list[int]:
        return torch.randint(4, vocab, (count,), generator=gen).tolist()

    triples = [(tokens(3 + i % 3), tokens(2 + (2 * i) % 5), tokens(3 + i % 4)) for i in range(pairs)]
    batch = preference_batch(triples)
    batch["ref_logprobs"] = -torch.rand(batch["loss_mask"].shape, generator=gen) * 3 * batch["loss_mask"]
    return batch


def dpo_conformance_loss(pairs: int = 4) -> Any:
    """DPO's loss with an SFT term, over ``pairs`` pairs."""
    from corerl.algorithms.dpo_math import DPOLoss

    return DPOLoss(beta=0.5, sft_weight=0.3, pairs=pairs)


#: GRPO loss options each layout's step is checked with (i), by test id
GRPO_LOSS_VARIANTS = ("cispo", "dr_grpo")


def grpo_conformance_loss(variant: str) -> Any:
    """The :class:`~corerl.algorithms.grpo_math.GRPOLoss` of one of :data:`GRPO_LOSS_VARIANTS`:
    ``cispo`` (the clipped ratio a detached weight), ``dr_grpo`` (the summed token loss over rows
    x 16), each with the ratio bounded to [0.8, 1.28] (DAPO's clip-higher)."""
    from corerl.algorithms.grpo_math import GRPOLoss

    bounds = {"ratio_clip_min": 0.2, "ratio_clip_max": 0.28}
    if variant == "cispo":
        return GRPOLoss(use_cispo=True, **bounds)
    if variant == "dr_grpo":
        return GRPOLoss(loss_aggregation="constant_length", loss_aggregation_length=16, **bounds)
    raise ValueError(f"unknown GRPO loss variant {variant!r}; known: {', '.join(GRPO_LOSS_VARIANTS)}")


def grpo_conformance_batch(model_dir: str, loss_fn: Any, seed: int = 4) -> dict[str, torch.Tensor]:
    """:func:`conformance_batch` with what a GRPO loss reads: ``old_logprobs`` (the model's own
    logprobs moved by noise, so that some ratios fall outside the clip range and some inside) and
    the loss's ``aggregation_weights`` where its aggregation has any."""
    from transformers import AutoModelForCausalLM

    batch = conformance_batch()
    mask = batch["loss_mask"].float()
    current = hf_logprobs(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), batch)
    gen = torch.Generator().manual_seed(seed)
    batch["old_logprobs"] = (current + 0.3 * torch.randn(mask.shape, generator=gen)) * mask
    weights = loss_fn.aggregation_weights(batch["loss_mask"])
    if weights is not None:
        batch["aggregation_weights"] = weights
    return batch


def value_conformance_batch(rows: int = 4, seed: int = 3) -> dict[str, torch.Tensor]:
    """:func:`conformance_batch` with what the value loss reads: ``returns`` and ``old_values``."""
    batch = conformance_batch(rows=rows, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    mask = batch["loss_mask"].float()
    batch["returns"] = 0.5 * torch.randn(mask.shape, generator=gen) * mask
    batch["old_values"] = 0.3 * torch.randn(mask.shape, generator=gen) * mask
    return batch


def value_conformance_loss() -> Any:
    """PPO's clipped value loss, with a clip range both branches of the clip meet on the batch above."""
    from corerl.algorithms.ppo_math import ValueLoss

    return ValueLoss(clip=0.5)


def write_conformance_critic(model_dir: str, out: Path, seed: int = 5) -> str:
    """A value model of ``model_dir`` with a random head (so values differ from row to row)."""
    from transformers import AutoModelForTokenClassification

    from corerl.models.hf_save import save_pretrained
    from corerl.models.value_model import init_value_model

    path = init_value_model(model_dir, out)
    model = AutoModelForTokenClassification.from_pretrained(path, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.score.weight.copy_(torch.randn(model.score.weight.shape, generator=gen) * 0.2)
    save_pretrained(model, path)
    return str(path)


def save_load_continue(engine: Any, model_dir: str, first: dict[str, torch.Tensor], second: dict[str, torch.Tensor],
                       folder: Path) -> tuple[list[Any], dict[str, torch.Tensor], list[Any], dict[str, torch.Tensor]]:
    """(d)'s procedure: a step on ``first``, a checkpoint, then steps on ``second`` and ``first``
    straight on and again after loading the checkpoint into a fresh model and optimizer; the
    step results and weights of both."""
    engine.load_hf(model_dir)
    engine.train_step(first, conformance_loss)
    engine.save_checkpoint(str(folder))
    straight = [engine.train_step(b, conformance_loss) for b in (second, first)]
    straight_w = dict(engine.weight_stream())
    engine.load_hf(model_dir)  # a fresh model and optimizer
    engine.load_checkpoint(str(folder))
    resumed = [engine.train_step(b, conformance_loss) for b in (second, first)]
    return straight, straight_w, resumed, dict(engine.weight_stream())
