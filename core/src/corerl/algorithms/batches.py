"""Rows for the training backends out of samples and pairs, and the seeds of generation steps:
the pieces GRPO, PPO, SFT and DPO share (no algorithm imports another; each imports these)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from corerl.generation.contract import Sample
from corerl.training.batching import right_pad

RewardFn = Callable[[Sample, Any], float]


def step_seed(seed: int, step: int, batch: int = 0) -> int:
    """The sampling seed of one step (of its ``batch``-th generation batch, where a step draws
    several): reproducible run to run, and far from the seeds of other steps (engines derive
    per-sample seeds as seed + offset, so neighbouring integers would replay the previous step's
    random draws)."""
    text = f"{seed}:{step}" if batch == 0 else f"{seed}:{step}:{batch}"
    digest = hashlib.blake2b(text.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF


def samples_to_batch(groups: Sequence[Sequence[Sample]], advantages: torch.Tensor) -> dict[str, torch.Tensor]:
    """Right-padded training rows (prompt + completion), a loss mask on the model's completion
    tokens (a multi-turn episode's environment tokens stay out: ``Sample.completion_mask``), each
    row's advantage on every token, and the generation backend's logprobs for comparison."""
    samples = [s for group in groups for s in group]
    input_ids, attention = right_pad([list(s.prompt_ids) + list(s.completion_ids) for s in samples])
    rows, width = input_ids.shape
    loss_mask = torch.zeros((rows, width), dtype=torch.long)
    gen_logprobs = torch.zeros((rows, width), dtype=torch.float32)
    for row, s in enumerate(samples):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        loss_mask[row, p : p + c] = 1 if s.completion_mask is None else torch.tensor(s.completion_mask)
        gen_logprobs[row, p : p + c] = torch.tensor(s.logprobs, dtype=torch.float32)
    adv = advantages.reshape(rows, 1).to(torch.float32).expand(rows, width).contiguous()
    return {"input_ids": input_ids, "attention_mask": attention, "loss_mask": loss_mask,
            "advantages": adv, "gen_logprobs": gen_logprobs}


def minibatches(batch: dict[str, torch.Tensor], rows: int | None,
                weights: Callable[[torch.Tensor], torch.Tensor | None] | None = None) -> list[dict[str, torch.Tensor]]:
    """``batch`` cut into consecutive mini-batches of ``rows`` rows (one optimizer step each);
    ``None``: the whole batch, one optimizer step. ``rows`` must divide the batch's rows. With
    ``weights`` (a loss's ``aggregation_weights``) each mini-batch gets the ``aggregation_weights``
    of its own loss mask, where that gives any."""
    total = int(batch["input_ids"].shape[0])
    if rows is None or rows >= total:
        parts = [batch]
    elif total % rows:
        raise ValueError(f"{rows} rows per optimizer step do not divide the step's {total} rows")
    else:
        parts = [{key: value[start : start + rows] for key, value in batch.items()} for start in range(0, total, rows)]
    if weights is None:
        return parts
    weighted = [(part, weights(part["loss_mask"])) for part in parts]
    return [part if w is None else {**part, "aggregation_weights": w} for part, w in weighted]


def pairs_to_batch(pairs: Sequence[Sequence[Sequence[int]]]) -> dict[str, torch.Tensor]:
    """Right-padded rows prompt + response, the loss mask on the response only (and, where a
    demonstration has a third element, a 0/1 mask over its response, only where that is 1: a
    multi-turn demonstration's environment tokens are not the model's to learn)."""
    input_ids, attention = right_pad([list(pair[0]) + list(pair[1]) for pair in pairs])
    loss_mask = torch.zeros_like(input_ids)
    for row, (prompt, response, *mask) in enumerate(pairs):
        loss_mask[row, len(prompt) : len(prompt) + len(response)] = torch.tensor(mask[0]) if mask else 1
    return {"input_ids": input_ids, "attention_mask": attention, "loss_mask": loss_mask}
