"""The rank-local decode loop of the ``megatron`` generation backend.

Rows with the same prompt length are decoded together: one prefill of the prompts, then one
token per step, with megatron-core's static KV cache (``StaticInferenceContext``) so that a
step reads the cache instead of re-running the sequence. Every rank of a model replica runs
the loop; the last pipeline stage chooses the tokens and passes them to the other stages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from corerl.sdk import SamplingSettings, choose_tokens, choose_tokens_per_row, row_generators

# (ids [rows, width], positions [rows, width], KV cache) -> last-position logits [rows, vocab],
# or None on a rank that is not the last pipeline stage
Forward = Callable[[torch.Tensor, torch.Tensor, Any], "torch.Tensor | None"]
# the chosen tokens [rows] and their logprobs (None where this rank holds no logits) -> the tokens every
# rank decoding the rows continues with, and the logprobs of those tokens where the rank reports them
ShareTokens = Callable[[torch.Tensor, "torch.Tensor | None"], "tuple[torch.Tensor, torch.Tensor | None]"]
Decoded = tuple[list[int], list[float], str]


def decode_rows(rows: list[list[int]], sampling: SamplingSettings, stop_ids: list[int], forward: Forward,
                share: ShareTokens, kv_bytes_per_token: int, kv_budget_bytes: float,
                device: torch.device | None = None, seeds: list[int] | None = None) -> list[Decoded]:
    """Completions of ``rows`` in order: ids (a final stop id included), logprobs (empty on
    ranks that do not hold the logits) and the finish reason. Rows of one prompt length are
    decoded in batches whose KV cache (``kv_bytes_per_token`` per cached token of a row) fits
    ``kv_budget_bytes``. The model's inputs live on ``device`` (the CPU unless given); tokens
    are chosen on the CPU, from one seeded generator whatever the device, or from one per row
    where ``seeds`` gives each row's seed (a row's tokens then depend on its own stream only)."""
    generator = torch.Generator().manual_seed(sampling.seed) if sampling.seed is not None else None
    generators = row_generators(seeds) if seeds is not None and sampling.temperature > 0 else None
    by_length: dict[int, list[int]] = {}
    for index, row in enumerate(rows):
        by_length.setdefault(len(row), []).append(index)
    decoded: list[Decoded | None] = [None] * len(rows)
    for length, same_length in sorted(by_length.items()):
        per_row = kv_bytes_per_token * (length + sampling.max_new_tokens)
        batch = max(1, int(kv_budget_bytes // per_row))
        for start in range(0, len(same_length), batch):
            members = same_length[start:start + batch]
            for index, done in zip(members, _decode_batch(rows, members, length, sampling, stop_ids, forward, share,
                                                          [generators[i] for i in members] if generators else generator,
                                                          device or torch.device("cpu")), strict=True):
                decoded[index] = done
    return [d for d in decoded if d is not None]


def _decode_batch(rows: list[list[int]], members: list[int], length: int, sampling: SamplingSettings,
                  stop_ids: list[int], forward: Forward, share: ShareTokens, generator: Any,
                  device: torch.device) -> list[Decoded]:
    from megatron.core.inference.contexts import StaticInferenceContext

    cache = StaticInferenceContext(len(members), length + sampling.max_new_tokens)
    tokens = torch.tensor([rows[i] for i in members], dtype=torch.long, device=device)
    positions = torch.arange(length, device=device).expand(len(members), -1)
    ids: list[list[int]] = [[] for _ in members]
    logprobs: list[list[float]] = [[] for _ in members]
    reasons = ["length"] * len(members)
    for step in range(sampling.max_new_tokens):
        logits = forward(tokens, positions, cache)
        if logits is not None:
            if isinstance(generator, list):  # one stream a row
                chosen, chosen_logprobs = choose_tokens_per_row(logits.cpu(), sampling, generator)
            else:
                chosen, chosen_logprobs = choose_tokens(logits.cpu(), sampling, generator)
        else:
            chosen, chosen_logprobs = torch.zeros(len(members), dtype=torch.long), None
        chosen, chosen_logprobs = share(chosen.to(device), chosen_logprobs)  # broadcasts run on the model's device
        for slot, token in enumerate(chosen.tolist()):
            if reasons[slot] == "stop":
                continue
            ids[slot].append(token)
            if chosen_logprobs is not None:
                logprobs[slot].append(float(chosen_logprobs[slot]))
            if token in stop_ids:
                reasons[slot] = "stop"
        if all(reason == "stop" for reason in reasons):
            break
        cache.sequence_len_offset += tokens.shape[1]
        cache.enable_decode_mode()
        tokens = chosen.unsqueeze(1)
        positions = torch.full((len(members), 1), length + step, dtype=torch.long, device=device)
    return [(ids[slot], logprobs[slot], reasons[slot]) for slot in range(len(members))]
