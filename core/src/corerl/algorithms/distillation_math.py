"""On-policy distillation's arithmetic: the per-token reverse KL on the student's sampled tokens,
and the forward KL over the teacher's top-k next tokens at the same positions.

Pure tensor functions and one picklable loss; :mod:`corerl.algorithms.distillation` feeds them.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from corerl.algorithms.grpo_math import GRPOLoss


def reverse_kl_advantages(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each loss token's advantage, ``log p_teacher - log p_student`` (0 off the loss tokens): with
    the policy-gradient loss, one on-policy step down the per-token KL(student || teacher)."""
    return ((teacher - student) * mask).to(torch.float32)


def with_outcome_advantages(advantages: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor, weight: float, *,
                            scale_by_std: bool = True, leave_one_out: bool = False) -> torch.Tensor:
    """``advantages`` ``[rows, width]`` plus ``weight`` times each row's GRPO advantage of its
    reward (``rewards`` ``[prompts, n]``, rows in the same order) on its loss tokens: the teacher's
    signal and the task's together (NeMo RL's OPD estimator with ``use_orm_advantage``)."""
    if not weight:
        return advantages
    from corerl.algorithms.grpo_math import group_advantages

    outcome = group_advantages(rewards, scale_by_std=scale_by_std, leave_one_out=leave_one_out).reshape(-1, 1)
    return advantages + weight * outcome.to(advantages.dtype) * mask.to(advantages.dtype)


def reverse_kl_k3(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Per token, ``r - 1 - log r`` with ``r = p_teacher / p_student``: an estimate of
    KL(student || teacher) from the student's samples that is unbiased and never negative."""
    log_ratio = teacher - student
    return torch.expm1(log_ratio) - log_ratio


def topk_forward_kl(student: torch.Tensor, teacher: torch.Tensor, *, renormalise: bool = False) -> torch.Tensor:
    """Per position ``[B, T]``: ``sum_j p_T(j) (log p_T(j) - log p_S(j))`` over the teacher's
    top-k tokens ``j``, from the student's and the teacher's ``[B, T, k]`` logprobs of them.

    Without ``renormalise`` ``p_T`` is the teacher's own probability (its top-k mass is below 1,
    the rest of the vocabulary left out of the sum); with it the teacher's top-k logprobs are
    renormalised to a distribution over the k tokens first (NeMo RL's ``zero_outside_topk``)."""
    if renormalise:
        teacher = torch.log_softmax(teacher, dim=-1)
    return (teacher.exp() * (teacher - student)).sum(dim=-1)


@attrs.frozen
class TopKDistillationLoss:
    """The loss of ``algorithm.distillation.kl_type`` ``forward`` or ``mixed`` (picklable, see
    ``corerl.training.contract``).

    ``forward``: the mean over loss tokens of :func:`topk_forward_kl`, from the student's
    ``candidate_logprobs`` (the backend computes them for the batch's ``candidate_ids``, the
    teacher's top-k) and the batch's ``teacher_topk_logprobs``. ``mixed``:
    ``mixed_kl_weight x forward + (1 - mixed_kl_weight) x reverse``, the reverse part the
    policy-gradient loss on the ``advantages`` of :func:`reverse_kl_advantages`."""

    kl_type: str = "forward"
    mixed_kl_weight: float = 0.5
    zero_outside_topk: bool = False
    reverse: GRPOLoss = attrs.field(factory=GRPOLoss)

    def __call__(self, logprobs: torch.Tensor, batch: dict[str, torch.Tensor],
                 normaliser: float) -> tuple[torch.Tensor, dict[str, Any]]:
        mask = batch["loss_mask"].to(torch.float32)
        per_token = topk_forward_kl(batch["candidate_logprobs"], batch["teacher_topk_logprobs"].to(torch.float32),
                                    renormalise=self.zero_outside_topk)
        forward = (per_token * mask).sum() / normaliser
        metrics: dict[str, Any] = {"forward_kl": forward.detach()}
        if self.kl_type == "forward":
            return forward, metrics
        reverse, reverse_metrics = self.reverse(logprobs, batch, normaliser)
        weight = self.mixed_kl_weight
        return weight * forward + (1.0 - weight) * reverse, {**reverse_metrics, **metrics}
