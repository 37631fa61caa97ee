"""DPO's arithmetic: the preference loss over a micro-batch of (chosen, rejected) rows.

Pure tensor functions, picklable for the workers like :class:`corerl.algorithms.grpo_math.GRPOLoss`.
A batch holds both rows of each pair, marked by ``pair_ids`` (the pair's number in the step) and
``chosen`` (1 for the chosen row, 0 for the rejected one); both rows of a pair must sit in the
same micro-batch (the loss of a pair is not a sum over its tokens). The loop that builds such
batches and keeps pairs together is the DPO issue's next part.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch
import torch.nn.functional as F


def sequence_logprobs(logprobs: torch.Tensor, mask: torch.Tensor, average: bool = False) -> torch.Tensor:
    """Per row: the sum (or, with ``average``, the mean) of the logprobs of its loss tokens."""
    total = (logprobs * mask).sum(dim=-1)
    return total / mask.sum(dim=-1).clamp(min=1.0) if average else total


@attrs.frozen
class DPOLoss:
    """The DPO loss of each pair, summed over the micro-batch's pairs and divided by
    ``normaliser`` (the number of pairs in the whole step).

    With ``h = beta * ((pi_c - ref_c) - (pi_r - ref_r))`` (sequence logprobs of the chosen and
    rejected rows under the policy and the frozen reference):

    - sigmoid (default): ``-(1 - label_smoothing) * logsigmoid(h) - label_smoothing * logsigmoid(-h)``;
    - ``ipo``: ``(h / beta - 1 / (2 * beta)) ** 2`` on mean logprobs;

    plus ``sft_weight`` times the chosen row's negative log-likelihood (per token with
    ``sft_average``). Metrics: the implicit rewards ``beta * (pi - ref)`` of each side, their margin
    and the preference accuracy (margin > 0), as sums over pairs for the backend to add up.
    """

    beta: float = 0.1
    label_smoothing: float = 0.0
    ipo: bool = False
    sft_weight: float = 0.0
    preference_average: bool = False  # mean instead of summed sequence logprobs in the preference term
    sft_average: bool = True

    def __call__(self, logprobs: torch.Tensor, batch: dict[str, torch.Tensor],
                 normaliser: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask = batch["loss_mask"].to(logprobs.dtype)
        average = self.preference_average or self.ipo
        policy = sequence_logprobs(logprobs, mask, average)
        reference = sequence_logprobs(batch["ref_logprobs"].to(logprobs.dtype), mask, average)
        chosen, rejected = _pair_rows(batch["pair_ids"], batch["chosen"])
        rewards = policy - reference
        margin = rewards[chosen] - rewards[rejected]
        h = self.beta * margin
        if self.ipo:
            per_pair = (margin - 1.0 / (2.0 * self.beta)) ** 2
        else:
            per_pair = -(1.0 - self.label_smoothing) * F.logsigmoid(h) - self.label_smoothing * F.logsigmoid(-h)
        if self.sft_weight:
            nll = -sequence_logprobs(logprobs, mask, self.sft_average)[chosen]
            per_pair = per_pair + self.sft_weight * nll
        detached = self.beta * rewards.detach()
        metrics = {
            "rewards/chosen": detached[chosen].sum() / normaliser,
            "rewards/rejected": detached[rejected].sum() / normaliser,
            "rewards/margin": (detached[chosen] - detached[rejected]).sum() / normaliser,
            "preference_accuracy": (margin.detach() > 0).to(logprobs.dtype).sum() / normaliser,
        }
        return per_pair.sum() / normaliser, metrics


def _pair_rows(pair_ids: torch.Tensor, chosen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row indices of the chosen and the rejected row of each pair, in the same pair order."""
    chosen_rows = torch.nonzero(chosen.bool(), as_tuple=True)[0]
    rejected_rows = torch.nonzero(~chosen.bool(), as_tuple=True)[0]
    chosen_rows = chosen_rows[torch.argsort(pair_ids[chosen_rows])]
    rejected_rows = rejected_rows[torch.argsort(pair_ids[rejected_rows])]
    if not torch.equal(pair_ids[chosen_rows], pair_ids[rejected_rows]):
        raise ValueError("every pair needs its chosen and its rejected row in the same micro-batch")
    return chosen_rows, rejected_rows


def preference_batch(triples: Sequence[tuple[Sequence[int], Sequence[int], Sequence[int]]]) -> dict[str, torch.Tensor]:
    """Training rows of (prompt, chosen, rejected) token triples: for pair ``i``, row ``2i`` is
    prompt + chosen and row ``2i + 1`` prompt + rejected (adjacent, so an even micro-batch size
    keeps pairs together), right-padded, with the loss mask on the response, ``pair_ids`` and
    ``chosen``."""
    from corerl.algorithms.sft import pairs_to_batch

    rows = [(prompt, response) for prompt, chosen, rejected in triples for response in (chosen, rejected)]
    batch = pairs_to_batch(rows)
    batch["pair_ids"] = torch.arange(len(triples)).repeat_interleave(2)
    batch["chosen"] = torch.tensor([1, 0] * len(triples))
    return batch
