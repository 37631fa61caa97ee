"""DPO's arithmetic: the preference loss over a micro-batch of (chosen, rejected) rows.

Pure tensor functions, picklable for the workers like :class:`corerl.algorithms.grpo_math.GRPOLoss`.
A batch holds both rows of each pair, marked per token by ``group_ids`` (the pair's number in the
step, which the micro-batcher reads to keep a pair on one rank and in one micro-batch, adjacent
when packed) and ``chosen`` (1 on the chosen row's tokens, 0 on the rejected row's). The fields
are per token so the loss reads them the same way in padded rows and in packed rows, where one
row holds several sequences.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch
import torch.nn.functional as F


@attrs.frozen
class SequenceSums:
    """Per pair present in a micro-batch: the summed logprobs and the loss-token counts of its
    chosen and its rejected response."""

    pair_ids: torch.Tensor
    chosen: torch.Tensor
    rejected: torch.Tensor
    chosen_tokens: torch.Tensor
    rejected_tokens: torch.Tensor


def pair_sums(values: torch.Tensor, batch: dict[str, torch.Tensor]) -> SequenceSums:
    """Sums of ``values`` ``[b, T]`` over each response's loss tokens, by pair and side
    (differentiable in ``values``); refuses a micro-batch holding one side of a pair only."""
    mask = batch["loss_mask"].bool()
    keys = (2 * batch["group_ids"] + (1 - batch["chosen"]))[mask]  # 2p: chosen of pair p, 2p + 1: rejected
    found, slot = torch.unique(keys, return_inverse=True)
    sums = torch.zeros(found.shape[0], dtype=values.dtype, device=values.device).index_add(0, slot, values[mask])
    counts = torch.zeros(found.shape[0], dtype=values.dtype, device=values.device).index_add(
        0, slot, torch.ones_like(values[mask]))
    is_chosen = found % 2 == 0
    chosen_pairs, rejected_pairs = found[is_chosen] // 2, found[~is_chosen] // 2
    if not torch.equal(chosen_pairs, rejected_pairs):
        raise ValueError("every pair needs its chosen and its rejected response (with at least one loss token "
                         "each) in the same micro-batch")
    return SequenceSums(chosen_pairs, sums[is_chosen], sums[~is_chosen], counts[is_chosen], counts[~is_chosen])


@attrs.frozen
class DPOLoss:
    """The DPO loss of each pair, summed over the micro-batch's pairs and divided by ``pairs``
    (the number of pairs in the whole step, all ranks; the backend's token-count normaliser is
    not used), so the sum over micro-batches and ranks is the step's mean over pairs.

    With ``h = beta * ((pi_c - ref_c) - (pi_r - ref_r))`` (sequence logprobs of the chosen and
    rejected responses under the policy and the frozen reference):

    - sigmoid (default): ``-(1 - label_smoothing) * logsigmoid(h) - label_smoothing * logsigmoid(-h)``;
    - ``ipo``: ``(h / beta - 1 / (2 * beta)) ** 2`` on mean (per-token) logprobs;

    times ``preference_weight``, plus ``sft_weight`` times the chosen response's negative log-likelihood (per token with
    ``sft_average``). Metrics, as sums over pairs divided by ``pairs``: the implicit rewards
    ``beta * (pi - ref)`` of each side, their margin and the preference accuracy (margin > 0).
    """

    beta: float = 0.1
    label_smoothing: float = 0.0
    ipo: bool = False
    sft_weight: float = 0.0
    preference_average: bool = False  # mean instead of summed sequence logprobs in the preference term
    sft_average: bool = True
    preference_weight: float = 1.0
    pairs: int = 0

    def __call__(self, logprobs: torch.Tensor, batch: dict[str, torch.Tensor],
                 normaliser: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if self.pairs < 1:
            raise ValueError("DPOLoss.pairs must be the step's pair count (attrs.evolve(loss, pairs=n))")
        policy = pair_sums(logprobs, batch)
        reference = pair_sums(batch["ref_logprobs"].to(logprobs.dtype), batch)
        average = self.preference_average or self.ipo
        chosen_pi, rejected_pi = policy.chosen, policy.rejected
        chosen_ref, rejected_ref = reference.chosen, reference.rejected
        if average:
            chosen_pi, chosen_ref = chosen_pi / policy.chosen_tokens, chosen_ref / policy.chosen_tokens
            rejected_pi, rejected_ref = rejected_pi / policy.rejected_tokens, rejected_ref / policy.rejected_tokens
        chosen_reward, rejected_reward = chosen_pi - chosen_ref, rejected_pi - rejected_ref
        margin = chosen_reward - rejected_reward
        if self.ipo:
            per_pair = (margin - 1.0 / (2.0 * self.beta)) ** 2
        else:
            h = self.beta * margin
            per_pair = -(1.0 - self.label_smoothing) * F.logsigmoid(h) - self.label_smoothing * F.logsigmoid(-h)
        per_pair = self.preference_weight * per_pair
        if self.sft_weight:
            nll = -policy.chosen / policy.chosen_tokens if self.sft_average else -policy.chosen
            per_pair = per_pair + self.sft_weight * nll
        # a micro-batch without pairs (an empty filler) still returns a loss tied to the graph
        loss = per_pair.sum() / self.pairs + 0.0 * logprobs.sum()
        beta, n = self.beta, self.pairs
        metrics = {
            "rewards/chosen": beta * chosen_reward.detach().sum() / n,
            "rewards/rejected": beta * rejected_reward.detach().sum() / n,
            "rewards/margin": beta * margin.detach().sum() / n,
            "preference_accuracy": (margin.detach() > 0).to(logprobs.dtype).sum() / n,
        }
        return loss, metrics


def preference_batch(triples: Sequence[tuple[Sequence[int], Sequence[int], Sequence[int]]]) -> dict[str, torch.Tensor]:
    """Training rows of (prompt, chosen, rejected) token triples: for pair ``i``, row ``2i`` is
    prompt + chosen and row ``2i + 1`` prompt + rejected (adjacent), right-padded, with the loss
    mask on the response and the per-token ``group_ids`` (``i``) and ``chosen`` fields."""
    from corerl.algorithms.batches import pairs_to_batch

    rows = [(prompt, response) for prompt, chosen, rejected in triples for response in (chosen, rejected)]
    batch = pairs_to_batch(rows)
    width = batch["input_ids"].shape[1]
    batch["group_ids"] = torch.arange(len(triples)).repeat_interleave(2).unsqueeze(1).expand(-1, width).contiguous()
    batch["chosen"] = torch.tensor([1, 0] * len(triples)).unsqueeze(1).expand(-1, width).contiguous()
    return batch
