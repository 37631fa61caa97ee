"""GRPO's arithmetic: group-normalised advantages and the clipped, optionally KL-penalised loss.

Pure tensor functions; the loop that feeds them lives in :mod:`corerl.algorithms.grpo`.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import torch


def group_advantages(rewards: torch.Tensor, *, scale_by_std: bool = True, leave_one_out: bool = False,
                     eps: float = 1e-6) -> torch.Tensor:
    """``rewards`` ``[prompts, n]`` -> each reward minus its group's mean, or with ``leave_one_out``
    minus the mean of the group's other rewards (divided by the group's std when
    ``scale_by_std``). A group whose rewards are all equal gets zero advantages."""
    n = rewards.shape[1]
    if leave_one_out and n > 1:
        baseline = (rewards.sum(dim=1, keepdim=True) - rewards) / (n - 1)
    else:
        baseline = rewards.mean(dim=1, keepdim=True)
    centred = rewards - baseline
    if not scale_by_std:
        return centred
    std = rewards.std(dim=1, keepdim=True, unbiased=False)
    return centred / (std + eps)


def reinforce_plus_plus_advantages(rewards: torch.Tensor, *, minus_baseline: bool = True, normalise: bool = True,
                                   eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++-baseline: ``rewards`` ``[prompts, n]`` minus the group's mean (with
    ``minus_baseline``), then centred and scaled over the whole step's samples (``normalise``)
    rather than within each group."""
    centred = rewards - rewards.mean(dim=1, keepdim=True) if minus_baseline else rewards
    if not normalise or centred.numel() < 2:
        return centred
    return (centred - centred.mean()) / (centred.std(unbiased=False) + eps)


def gdpo_advantages(components: torch.Tensor, *, scale_by_std: bool = True, leave_one_out: bool = False,
                    eps: float = 1e-6) -> torch.Tensor:
    """GDPO (group reward-decoupled normalisation, arXiv:2601.05242): ``components`` ``[K, prompts,
    n]``, the K named parts of each sample's reward, each turned into :func:`group_advantages`
    within its own group (so a part with another scale or hit rate does not drown the others),
    summed over the parts, and the sums centred and scaled over the whole step's samples."""
    total = sum((group_advantages(part, scale_by_std=scale_by_std, leave_one_out=leave_one_out, eps=eps)
                 for part in components), torch.zeros(components.shape[1:], dtype=torch.float32))
    if total.numel() < 2:
        return total
    return (total - total.mean()) / (total.std(unbiased=False) + eps)


def maxrl_advantages(rewards: torch.Tensor, *, eps: float = 1e-6) -> torch.Tensor:
    """MaxRL (maximum-likelihood RL): ``rewards`` ``[prompts, n]`` -> each reward minus its
    group's mean, divided by that mean (``+ eps``) instead of by the std. With 0/1 rewards the
    mean is the prompt's success rate ``p``, so a correct sample gets ``(1 - p) / p``: the ``1/p``
    weighting of maximum likelihood, which gives hard prompts the larger weight. A group whose
    rewards are all 0 gets zero advantages; a group of one sample keeps its reward (no baseline,
    as SkyRL's ``maxrl``). Meant for rewards of 0 or more (a success rate): a mean near 0 from
    rewards of both signs makes the advantages large."""
    if rewards.shape[1] < 2:
        return rewards.clone()
    mean = rewards.mean(dim=1, keepdim=True)
    return (rewards - mean) / (mean + eps)


def batch_mean_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """``rewards`` ``[prompts, n]`` minus the mean reward of the whole step's samples: one
    baseline for the batch, not per prompt, and no scaling (SkyRL's custom_advantage_estimator
    example, ``simple_baseline``)."""
    return rewards - rewards.mean()


def advantages_for(estimator: str, rewards: torch.Tensor, *, scale_by_std: bool = True, leave_one_out: bool = False,
                   minus_baseline: bool = True, normalise: bool = True,
                   components: torch.Tensor | None = None) -> torch.Tensor:
    """``algorithm.advantage_estimator``'s advantages of a step's ``rewards`` ``[prompts, n]``:
    ``grpo`` (:func:`group_advantages`, with ``scale_by_std`` and ``leave_one_out``),
    ``reinforce_plus_plus`` (:func:`reinforce_plus_plus_advantages`, with ``minus_baseline`` and
    ``normalise``), ``maxrl`` (:func:`maxrl_advantages`) or ``batch_mean``
    (:func:`batch_mean_advantages`); the last two take none of the options. ``gdpo``
    (:func:`gdpo_advantages`, with ``scale_by_std`` and ``leave_one_out``) reads the reward's parts,
    ``components`` ``[K, prompts, n]``, instead of ``rewards``."""
    if estimator == "gdpo":
        if components is None:
            raise ValueError("the gdpo advantage estimator needs the rewards' named parts (reward_components)")
        return gdpo_advantages(components, scale_by_std=scale_by_std, leave_one_out=leave_one_out)
    if estimator == "grpo":
        return group_advantages(rewards, scale_by_std=scale_by_std, leave_one_out=leave_one_out)
    if estimator == "reinforce_plus_plus":
        return reinforce_plus_plus_advantages(rewards, minus_baseline=minus_baseline, normalise=normalise)
    if estimator == "maxrl":
        return maxrl_advantages(rewards)
    if estimator == "batch_mean":
        return batch_mean_advantages(rewards)
    raise ValueError(f"unknown advantage estimator {estimator!r}; known: grpo, gdpo, reinforce_plus_plus, maxrl, "
                     "batch_mean")


def kl_in_reward_advantages(scores: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor, kl_coef: float, *,
                            normalise: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++ with the KL in the reward: ``[B, T]`` per-token advantages from each sample's
    (baseline-subtracted) ``scores`` ``[B]`` and the per-token ``kl`` estimate. Each loss token's
    reward is ``-kl_coef * kl``, the last one's plus the sample's score; a token's advantage is the
    sum of the rewards from it to the end (its return to go, no discount), then centred and
    scaled over the step's loss tokens (``normalise``)."""
    mask = mask.to(torch.float32)
    rewards = -kl_coef * kl.to(torch.float32) * mask
    last = (mask * torch.arange(mask.shape[1], dtype=torch.float32)).argmax(dim=1)  # each row's last loss token
    present = mask.sum(dim=1) > 0
    rows = torch.arange(mask.shape[0])[present]
    rewards[rows, last[present]] += scores.to(torch.float32)[present]
    returns = torch.flip(torch.cumsum(torch.flip(rewards, [1]), dim=1), [1]) * mask
    picked = returns[mask.bool()]
    if not normalise or picked.numel() < 2:
        return returns
    return (returns - picked.mean()) / (picked.std(unbiased=False) + eps) * mask


def outcome_advantages_with_kl(estimator: str, rewards: torch.Tensor, kl: torch.Tensor, kl_coef: float,
                               shape: torch.Size, *, scale_by_std: bool = True,
                               leave_one_out: bool = False) -> torch.Tensor:
    """An outcome estimator's (``grpo``, ``maxrl``, ``batch_mean``) advantages with the KL in the
    reward: each sample's reward ``[prompts, n]`` less ``kl_coef`` x the sum of its tokens' KL
    estimates (``kl`` ``[samples, T]``, zero off the loss tokens, one row per sample in group
    order), the estimator applied to those, and each sample's advantage on every token (``shape``).
    SkyRL's ``use_kl_in_reward`` with its outcome estimators: the per-token KL penalty is summed
    into the sequence's reward before the baseline."""
    penalised = rewards.to(torch.float32) - kl_coef * kl.to(torch.float32).sum(dim=1).reshape(rewards.shape)
    advantages = advantages_for(estimator, penalised, scale_by_std=scale_by_std, leave_one_out=leave_one_out)
    return advantages.reshape(-1, 1).expand(shape).contiguous()


def kl_estimate(delta: torch.Tensor, kind: str = "k3", input_clamp: float | None = None,
                output_clamp: float | None = None) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from ``delta = ref_logprob - logprob`` of the
    sampled tokens: ``k1`` = -delta, ``k2`` = delta^2 / 2, ``k3`` = exp(delta) - delta - 1;
    ``delta`` and the estimate optionally bounded to +-``input_clamp`` / +-``output_clamp``."""
    if input_clamp is not None:
        delta = delta.clamp(-input_clamp, input_clamp)
    if kind == "k1":
        kl = -delta
    elif kind == "k2":
        kl = 0.5 * delta * delta
    elif kind == "k3":
        kl = torch.exp(delta) - delta - 1.0
    else:
        raise ValueError(f"unknown KL estimator {kind!r}; known: k1, k2, k3")
    return kl.clamp(-output_clamp, output_clamp) if output_clamp is not None else kl


@attrs.frozen
class GRPOLoss:
    """The training loss, picklable for the workers (see ``corerl.training.contract``).

    Per loss token: ``-min(r * A, clip(r, 1 - ratio_clip_min, 1 + ratio_clip_max) * A)`` with
    ``r = exp(logprob - old_logprob)``; ``old_logprob`` is the detached current logprob when the
    batch has no ``old_logprobs`` (one on-policy pass needs no separate logprob pass). Options:

    - ``sequence_level_ratios``: ``r`` is exp of the row's mean log ratio (GSPO);
    - ``ratio_clip_c`` (dual clipping, > 1): a negative-advantage token's loss is at most
      ``-ratio_clip_c * A``;
    - ``importance_sampling_correction``: each token's loss is weighted by
      ``w = exp(old_logprob - gen_logprob)`` (the training policy over the generation engine's),
      bounded as ``importance_sampling_type`` says (:func:`importance_weights`);
    - ``kl_penalty`` times the ``kl_type`` estimate (:func:`kl_estimate`, k3 by default) of
      KL(policy || reference) where ``ref_logprobs`` are given; with ``on_policy_kl_approximation``
      each token's estimate is weighted by ``exp(logprob - gen_logprob)`` (detached), since the
      tokens were sampled by the generation engine, not the policy being trained.

    With ``use_cispo`` (CISPO) the token's loss is ``-A * sg(clip(r, ...)) * logprob`` instead: the
    clipped ratio is a detached weight, so every token keeps a gradient (dual clipping does not
    apply).

    ``policy_loss`` replaces the clipped surrogate (``clipped``, the default, with the options
    above) by another one (the importance-sampling correction and the KL term still apply):

    - ``rollout_is``: ``-A * sg(w) * logprob`` with ``w = exp(logprob - gen_logprob)`` (the policy
      being trained over the generation engine's, not over the old policy) where ``w`` lies
      strictly within ``(1 - ratio_clip_min, 1 + ratio_clip_max)``, 0 elsewhere (a token out of
      range loses its gradient): GLM-5's loss for fully asynchronous training (:func:`rollout_is_surrogate`);
    - ``sapo``: ``-A * f(r)`` with the soft gate ``f(r) = 4 / tau * sigmoid(tau * (r - 1))``,
      ``tau`` = ``sapo_tau_pos`` for a positive advantage, ``sapo_tau_neg`` otherwise (SAPO: no
      hard cut, the gradient fades as ``r`` leaves 1) (:func:`sapo_surrogate`);
    - ``clip_cov``: the clipped surrogate, with up to ``clip_cov_ratio`` of the loss tokens
      (at least one), drawn at random among the unclipped ones whose covariance
      ``(A - mean A) * (logprob - mean logprob)`` lies strictly within ``(clip_cov_lb,
      clip_cov_ub)``, left out of the loss (Clip-Cov) (:func:`clip_cov_surrogate`);
    - ``kl_cov``: the unclipped ``-A * r``, plus ``kl_cov_coef * |logprob - old_logprob|`` on the
      ``kl_cov_ratio`` share of the loss tokens (at least one) with the largest covariance
      (KL-Cov) (:func:`kl_cov_surrogate`).
    - ``reinforce``: plain REINFORCE, ``-A * logprob``: no ratio, no clipping (the gradient is
      ``-A * grad logprob`` on every pass, the old policy playing no part).

    Summed and divided by the number of loss tokens in the optimizer batch (``loss_aggregation``
    ``token_mean``); with ``sequence_mean`` or ``constant_length`` each token also carries its
    ``aggregation_weights`` (:func:`aggregation_weights`), which make the sum each sequence's mean
    averaged over sequences, or the sum over sequences x ``loss_aggregation_length`` (Dr. GRPO).
    """

    ratio_clip_min: float = 0.2
    ratio_clip_max: float = 0.2
    kl_penalty: float = 0.0
    kl_type: str = "k3"  # k1: log ratio, k2: half its square, k3: exp(d) - d - 1 (unbiased, non-negative)
    kl_input_clamp: float | None = None  # bound on the log ratio before the estimator
    kl_output_clamp: float | None = None  # bound on the per-token estimate
    ratio_clip_c: float | None = None  # dual clipping: bound on a negative-advantage token's loss
    # sequence-level ratios: each row's r is exp of the mean log ratio of its loss tokens (GSPO)
    sequence_level_ratios: bool = False
    # importance-sampling correction: each token's loss weighted by exp(old_logprob - gen_logprob),
    # the training policy over the generation engine's (at most ``importance_weight_cap``)
    importance_sampling_correction: bool = False
    importance_weight_cap: float | None = None
    importance_weight_min: float | None = None
    importance_sampling_type: str = "tis"  # tis, icepop, seq-mask-tis, seq-mask or seq-tis (importance_weights)
    # the KL term weighted by exp(logprob - gen_logprob), detached: KL under the training policy
    on_policy_kl_approximation: bool = False
    # token_mean, sequence_mean or constant_length (the batch's aggregation_weights: aggregation_weights())
    loss_aggregation: str = "token_mean"
    loss_aggregation_length: int | None = None  # constant_length: the length each sequence counts as
    use_cispo: bool = False  # CISPO: -A * sg(clipped ratio) * logprob
    policy_loss: str = "clipped"  # clipped, rollout_is, sapo, clip_cov, kl_cov or reinforce (the class docstring)
    sapo_tau_pos: float = 1.0  # SAPO's gate temperature on tokens with a positive advantage
    sapo_tau_neg: float = 1.05  # ... and on the others
    clip_cov_ratio: float = 0.0002  # Clip-Cov: the share of loss tokens left out
    clip_cov_lb: float = 1.0  # Clip-Cov: the covariance range the tokens left out are drawn from
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.2  # KL-Cov: the share of loss tokens with the KL term
    kl_cov_coef: float = 1.0  # KL-Cov: the KL term's weight

    @property
    def corrects_importance(self) -> bool:
        """Whether the loss weights tokens by the training over the generation policy (it then
        needs the training policy's logprobs before the update, ``old_logprobs``)."""
        return self.importance_sampling_correction

    @classmethod
    def from_config(cls, algorithm: Any, max_new_tokens: int | None = None) -> GRPOLoss:
        """The loss an ``algorithm`` section describes (``max_new_tokens``: the length a
        ``constant_length`` aggregation counts each sequence as, unless the section names one)."""
        fields = {field.name: getattr(algorithm, field.name) for field in attrs.fields(cls)}
        fields["loss_aggregation"] = algorithm.aggregation
        if fields["loss_aggregation_length"] is None:
            fields["loss_aggregation_length"] = max_new_tokens
        if algorithm.use_kl_in_reward:  # the KL is in the rewards (REINFORCE++), not in the loss
            fields["kl_penalty"] = 0.0
        return cls(**fields)

    def aggregation_weights(self, loss_mask: torch.Tensor) -> torch.Tensor | None:
        """The per-token weights this loss's aggregation needs on an optimizer batch (None for
        ``token_mean``, which needs none): :func:`aggregation_weights`."""
        return aggregation_weights(loss_mask, self.loss_aggregation, self.loss_aggregation_length)

    def __call__(
        self, logprobs: torch.Tensor, batch: dict[str, torch.Tensor], normaliser: float
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask = batch["loss_mask"].to(logprobs.dtype)
        advantages = batch["advantages"]
        # on-policy (one pass, no separate logprob pass): the old policy is the current one
        old = batch["old_logprobs"] if "old_logprobs" in batch else logprobs.detach()
        log_ratio = logprobs - old
        if self.sequence_level_ratios:
            tokens = mask.sum(dim=-1, keepdim=True).clamp(min=1.0)
            log_ratio = ((log_ratio * mask).sum(dim=-1, keepdim=True) / tokens).expand_as(logprobs)
        ratio = torch.exp(log_ratio)
        clipped = torch.clamp(ratio, 1.0 - self.ratio_clip_min, 1.0 + self.ratio_clip_max)
        changed = (ratio - clipped).abs() > 1e-6  # the tokens the surrogate cut (clip_fraction)
        extra: dict[str, torch.Tensor] = {}
        if self.policy_loss == "rollout_is":
            if "gen_logprobs" not in batch:
                raise ValueError("the rollout_is policy loss needs the generation engine's logprobs (gen_logprobs)")
            per_token, changed = rollout_is_surrogate(logprobs, batch["gen_logprobs"], advantages,
                                                      self.ratio_clip_min, self.ratio_clip_max)
        elif self.policy_loss == "sapo":
            per_token = sapo_surrogate(log_ratio, advantages, self.sapo_tau_pos, self.sapo_tau_neg)
            changed = torch.zeros_like(changed)  # a soft gate: nothing is cut
        elif self.policy_loss == "clip_cov":
            per_token, left_out = clip_cov_surrogate(logprobs, old, advantages, mask, self)
            extra["clip_cov_fraction"] = (left_out.to(mask.dtype) * mask).sum().detach() / normaliser
        elif self.policy_loss == "kl_cov":
            per_token, penalised = kl_cov_surrogate(logprobs, old, advantages, mask, self.kl_cov_ratio,
                                                    self.kl_cov_coef)
            changed = torch.zeros_like(changed)  # no clipping
            extra["kl_cov_fraction"] = (penalised.to(mask.dtype) * mask).sum().detach() / normaliser
        elif self.policy_loss == "reinforce":
            per_token = -advantages * logprobs
            changed = torch.zeros_like(changed)  # no clipping
        elif self.policy_loss != "clipped":
            raise ValueError(f"unknown policy loss {self.policy_loss!r}; known: clipped, rollout_is, sapo, clip_cov, "
                             "kl_cov, reinforce")
        elif self.use_cispo:  # the clipped ratio weighs the log-likelihood's gradient; no token loses it
            per_token = -advantages * clipped.detach() * logprobs
        else:
            per_token = -torch.minimum(ratio * advantages, clipped * advantages)
            if self.ratio_clip_c is not None:
                bounded = torch.minimum(per_token, -self.ratio_clip_c * advantages)
                per_token = torch.where(advantages < 0, bounded, per_token)
        weights = None
        if self.importance_sampling_correction and "gen_logprobs" in batch:
            weights, _ = importance_weights(old.detach(), batch["gen_logprobs"], mask, self)
            per_token = per_token * weights
        # metrics stay 0-d tensors on the device: the backend reads them once per step
        metrics = {"clip_fraction": (changed.to(mask.dtype) * mask).sum().detach() / normaliser, **extra}
        if "gen_logprobs" in batch:  # the generation backend's logprobs of the same tokens
            metrics.update(_gap_sums(logprobs.detach(), batch["gen_logprobs"], mask, normaliser, self))
        if weights is not None:
            metrics["importance_weight/mean"] = weights.sum().detach() / normaliser
        if self.kl_penalty and "ref_logprobs" in batch:
            kl = kl_estimate(batch["ref_logprobs"] - logprobs, self.kl_type, self.kl_input_clamp,
                             self.kl_output_clamp)
            metrics["kl"] = (kl.detach() * mask).sum() / normaliser
            if self.on_policy_kl_approximation and "gen_logprobs" in batch:
                kl = kl * torch.exp(logprobs.detach() - batch["gen_logprobs"]) * mask
            per_token = per_token + self.kl_penalty * kl
        if self.loss_aggregation != "token_mean":
            per_token = per_token * batch["aggregation_weights"].to(per_token.dtype)
        return (per_token * mask).sum() / normaliser, metrics


def rollout_is_surrogate(logprobs: torch.Tensor, gen_logprobs: torch.Tensor, advantages: torch.Tensor,
                         low: float, high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``rollout_is``'s per-token loss ``-A * sg(w) * logprob``, ``w = exp(logprob - gen_logprob)``
    where ``1 - low < w < 1 + high`` and 0 elsewhere, and the tokens whose ``w`` was out of range."""
    weight = torch.exp((logprobs.detach() - gen_logprobs).clamp(-20.0, 20.0))
    inside = (weight > 1.0 - low) & (weight < 1.0 + high)
    return -advantages * torch.where(inside, weight, torch.zeros_like(weight)) * logprobs, ~inside


def sapo_surrogate(log_ratio: torch.Tensor, advantages: torch.Tensor, tau_pos: float,
                   tau_neg: float) -> torch.Tensor:
    """SAPO's per-token loss ``-A * 4 / tau * sigmoid(tau * (r - 1))``, ``r = exp(log_ratio)``,
    ``tau`` = ``tau_pos`` where ``A > 0``, else ``tau_neg``. The gate's slope at ``r = 1`` is 1, so
    near the old policy the gradient is the unclipped ``-A * grad r``; it fades as ``r`` moves away."""
    ratio = torch.exp(log_ratio.clamp(-20.0, 20.0))
    tau = torch.where(advantages > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    return -advantages * torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)


def _covariance(logprobs: torch.Tensor, advantages: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """Each loss token's ``(A - mean A) * (logprob - mean logprob)``, the means over the loss
    tokens (detached: it chooses tokens, it is not differentiated)."""
    count = present.sum().clamp(min=1)
    adv = advantages.detach().expand_as(logprobs)
    logp = logprobs.detach()
    return (adv - adv[present].sum() / count) * (logp - logp[present].sum() / count)


def clip_cov_surrogate(logprobs: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                       loss: GRPOLoss) -> tuple[torch.Tensor, torch.Tensor]:
    """Clip-Cov's per-token loss: PPO-clip's ``max(-A * r, -A * clip(r))``, times 0 on
    ``max(1, int(clip_cov_ratio * loss tokens))`` tokens (fewer if fewer qualify) drawn at random
    (torch's generator) among the loss tokens PPO-clip did not clip whose covariance lies strictly
    within ``(clip_cov_lb, clip_cov_ub)``; and the mask of the tokens left out."""
    ratio = torch.exp(logprobs - old)
    unclipped = -advantages * ratio
    clip = -advantages * torch.clamp(ratio, 1.0 - loss.ratio_clip_min, 1.0 + loss.ratio_clip_max)
    present = mask.bool()
    covariance = _covariance(logprobs, advantages, present)
    eligible = present & ~(clip > unclipped) & (covariance > loss.clip_cov_lb) & (covariance < loss.clip_cov_ub)
    candidates = eligible.reshape(-1).nonzero().squeeze(-1)
    wanted = max(int(loss.clip_cov_ratio * int(present.sum())), 1)
    chosen = candidates[torch.randperm(candidates.numel())[:wanted].to(candidates.device)]
    left_out = torch.zeros(present.numel(), dtype=torch.bool, device=present.device)
    left_out[chosen] = True
    left_out = left_out.reshape(present.shape)
    return torch.maximum(unclipped, clip) * (~left_out).to(logprobs.dtype), left_out


def kl_cov_surrogate(logprobs: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                     share: float, coef: float) -> tuple[torch.Tensor, torch.Tensor]:
    """KL-Cov's per-token loss: ``-A * r`` (no clipping), plus ``coef * |logprob - old|`` on the
    ``max(1, int(share * loss tokens))`` loss tokens with the largest covariance; and their mask."""
    log_ratio = logprobs - old
    per_token = -advantages * torch.exp(log_ratio)
    present = mask.bool()
    penalised = torch.zeros(present.numel(), dtype=torch.bool, device=present.device)
    tokens = int(present.sum())
    if tokens:
        covariance = _covariance(logprobs, advantages, present).reshape(-1)
        positions = present.reshape(-1).nonzero().squeeze(-1)
        top = torch.topk(covariance[positions], min(max(int(tokens * share), 1), tokens)).indices
        penalised[positions[top]] = True
    penalised = penalised.reshape(present.shape)
    return per_token + coef * log_ratio.abs() * penalised.to(logprobs.dtype), penalised


def aggregation_weights(loss_mask: torch.Tensor, aggregation: str, length: int | None = None) -> torch.Tensor | None:
    """Per-token weights that turn a sum over an optimizer batch's loss tokens divided by their
    count (what a loss gets as its normaliser) into another aggregation: None for ``token_mean``
    (no weights); ``sequence_mean``: each sequence's token mean averaged over sequences,
    ``tokens / (sequences * tokens_of_the_row)`` on every token of a row (0 on a row with no loss
    token); ``constant_length``: the sum over ``rows * length`` (Dr. GRPO), ``tokens / (rows *
    length)`` on every token, every row counted. Computed per optimizer batch."""
    if aggregation == "token_mean":
        return None
    per_row = loss_mask.sum(dim=-1, keepdim=True).to(torch.float32)
    total = float(per_row.sum())
    if aggregation == "sequence_mean":
        rows = int((per_row > 0).sum())
        weights = torch.where(per_row > 0, total / (max(rows, 1) * per_row.clamp(min=1.0)), torch.zeros_like(per_row))
    elif aggregation == "constant_length":
        if length is None:
            raise ValueError("a constant_length aggregation needs the length each sequence counts as")
        weights = torch.full_like(per_row, total / (loss_mask.shape[0] * length))
    else:
        raise ValueError(f"unknown loss aggregation {aggregation!r}; known: token_mean, sequence_mean, constant_length")
    return weights.expand(loss_mask.shape).contiguous()


def _gap_sums(current: torch.Tensor, gen: torch.Tensor, mask: torch.Tensor, normaliser: float,
              loss: GRPOLoss) -> dict[str, torch.Tensor]:
    """The training/generation gap of one micro-batch as sums over its loss tokens (divided by
    the step's ``normaliser``: summed over micro-batches and ranks they are the step's means),
    and its extremes under ``/max`` and ``/min`` names (combined by maximum and minimum)."""
    delta = (current - gen) * mask
    gap = delta.abs()
    ratio = torch.exp(delta) * mask
    _, changed = importance_weights(current, gen, mask, loss)
    present = mask.bool()
    none = not bool(present.any())
    return {
        "logprob_mismatch/mean": gap.sum() / normaliser,
        "logprob_mismatch/mean_sq": (gap * gap).sum() / normaliser,
        "logprob_mismatch/max": gap.max() if not none else gap.sum(),
        "logprob_mismatch/kl": (kl_estimate(delta, "k3") * mask).sum() / normaliser,
        # of r - 1, not r: near 1, E[r^2] - E[r]^2 in float32 would be rounding noise of about 3e-4
        "importance_ratio/excess_mean": ((ratio - 1.0) * mask).sum() / normaliser,
        "importance_ratio/excess_mean_sq": ((ratio - 1.0) * mask).pow(2).sum() / normaliser,
        "importance_ratio/max": ratio[present].max() if not none else ratio.sum(),
        "importance_ratio/min": ratio[present].min() if not none else ratio.sum() + 1.0,
        "importance_ratio/clipped_share": changed.to(mask.dtype).sum() / normaliser,
    }


def step_gap_metrics(sums: dict[str, float]) -> dict[str, float]:
    """The step's gap metrics from a loss's sums (:func:`_gap_sums`): means, rms, std, extremes."""
    import math

    if "logprob_mismatch/mean" not in sums:
        return {}
    kept = ("logprob_mismatch/mean", "logprob_mismatch/max", "logprob_mismatch/kl", "importance_ratio/max",
            "importance_ratio/min", "importance_ratio/clipped_share")
    out = {k: sums[k] for k in kept if k in sums}
    out["logprob_mismatch/rms"] = math.sqrt(max(sums.get("logprob_mismatch/mean_sq", 0.0), 0.0))
    if "importance_ratio/excess_mean" in sums:
        excess, excess_sq = sums["importance_ratio/excess_mean"], sums["importance_ratio/excess_mean_sq"]
        out["importance_ratio/mean"] = 1.0 + excess
        out["importance_ratio/std"] = math.sqrt(max(excess_sq - excess * excess, 0.0))
    return out


def importance_weights(old: torch.Tensor, gen: torch.Tensor, mask: torch.Tensor,
                       loss: GRPOLoss) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token importance weights of the training policy (``old`` logprobs) over the generation
    engine's (``gen``), and the loss tokens whose weight the bound changed (a bool mask).

    ``tis``: ``w = min(exp(old - gen), cap)`` (truncated importance sampling); ``icepop``: ``w``
    where it lies within ``[min, cap]``, 0 elsewhere; ``seq-mask-tis``: a whole sequence's
    weights are 0 when the geometric mean of its ratios, ``exp(mean(old - gen))``, lies outside
    ``[min, cap]``, else its tokens keep ``exp(old - gen)``; ``seq-mask``: the same sequences left
    out, the others' tokens weighing 1 (a mask, no weight); ``seq-tis``: every token of a sequence
    weighs the sequence's ratio, the product ``exp(sum(old - gen))``, at most ``cap`` (truncated
    importance sampling per sequence). An unset bound does not bound."""
    mask = mask.to(old.dtype)
    raw = torch.exp(old - gen) * mask
    high = loss.importance_weight_cap if loss.importance_weight_cap is not None else float("inf")
    low = loss.importance_weight_min if loss.importance_weight_min is not None else 0.0
    kind = loss.importance_sampling_type
    if kind == "tis":
        weights = raw.clamp(max=high)
    elif kind == "icepop":
        weights = raw * ((raw >= low) & (raw <= high)).to(raw.dtype)
    elif kind == "seq-tis":  # capped in log space: a long sequence's product would overflow exp
        summed = ((old - gen) * mask).sum(dim=-1, keepdim=True)
        capped = summed.clamp(max=math.log(high)) if math.isfinite(high) else summed
        return torch.exp(capped) * mask, (summed > capped).expand_as(mask) & mask.bool()
    elif kind in ("seq-mask-tis", "seq-mask"):
        tokens = mask.sum(dim=-1, keepdim=True).clamp(min=1.0)
        geometric = torch.exp(((old - gen) * mask).sum(dim=-1, keepdim=True) / tokens)
        kept = ((geometric >= low) & (geometric <= high)).to(raw.dtype)
        if kind == "seq-mask":  # the mask alone: the kept sequences' tokens weigh 1
            return kept * mask, (kept * mask == 0) & mask.bool()
        weights = raw * kept
    else:
        raise ValueError(f"unknown importance sampling type {kind!r}; known: tis, icepop, seq-mask-tis, seq-mask, "
                         "seq-tis")
    changed = ((weights - raw).abs() > 1e-12) & mask.bool()
    return weights * mask, changed


def sequence_prob_errors(old: torch.Tensor, gen: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each row's multiplicative probability error between the training policy's logprobs of its
    sampled tokens (``old``) and the generation engine's (``gen``): the mean over its loss tokens
    of ``exp(|old - gen|)``, 1.0 where they agree; 0.0 for a row without loss tokens. NeMo RL's
    ``seq_logprob_error_threshold`` compares this with its threshold."""
    mask = mask.bool()
    gap = torch.where(mask, (old - gen).abs(), torch.zeros_like(old))
    # a token the engine gave -inf or NaN to (a mismatch past measuring) counts as out of bounds
    errors = torch.where(mask, torch.nan_to_num(torch.exp(gap), nan=float("inf")), torch.zeros_like(old))
    tokens = mask.sum(dim=1)
    return errors.sum(dim=1) / tokens.clamp(min=1)


def mask_by_prob_error(batch: dict[str, torch.Tensor], threshold: float) -> dict[str, float]:
    """Drop from the loss (``loss_mask`` set to 0, in place) every row whose
    :func:`sequence_prob_errors` is above ``threshold``; the rows' error (mean, max over the rows
    with loss tokens) and the share dropped."""
    mask = batch["loss_mask"].bool()
    errors = sequence_prob_errors(batch["old_logprobs"], batch["gen_logprobs"], mask)
    scored = mask.any(dim=1)
    if not bool(scored.any()):
        return {}
    dropped = scored & (errors > threshold)
    batch["loss_mask"] = batch["loss_mask"] * (~dropped).unsqueeze(1).to(batch["loss_mask"].dtype)
    finite = errors[scored & torch.isfinite(errors)]
    return {
        "logprob_mismatch/seq_prob_error/mean": float(finite.mean()) if finite.numel() else float("inf"),
        "logprob_mismatch/seq_prob_error/max": float(errors[scored].max()),
        "logprob_mismatch/seq_dropped_share": float(dropped.sum() / scored.sum()),
    }


def off_policy_metrics(old: torch.Tensor, gen: torch.Tensor, mask: torch.Tensor, loss: GRPOLoss) -> dict[str, float]:
    """How far the generation engine's logprobs of the sampled tokens are from the training
    policy's (``old``, before the update): the absolute gap (mean, max, rms), a KL estimate
    (k3 of the log ratio, KL(generation || training)), and the importance ratios' spread and the
    share of tokens the chosen bound changed (``importance_weight/*``)."""
    mask = mask.bool()
    if not bool(mask.any()):
        return {}
    delta = (old - gen)[mask]
    gap = delta.abs()
    ratio = torch.exp(delta)
    _, changed = importance_weights(old, gen, mask, loss)
    return {
        "logprob_mismatch/mean": float(gap.mean()), "logprob_mismatch/max": float(gap.max()),
        "logprob_mismatch/rms": float(gap.pow(2).mean().sqrt()),
        "logprob_mismatch/kl": float(kl_estimate(delta, "k3").mean()),
        "importance_ratio/mean": float(ratio.mean()), "importance_ratio/std": float(ratio.std(unbiased=False)),
        "importance_ratio/min": float(ratio.min()), "importance_ratio/max": float(ratio.max()),
        "importance_ratio/clipped_share": float(changed[mask].float().mean()),
    }
