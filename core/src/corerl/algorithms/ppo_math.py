"""PPO's arithmetic with a critic: token-level rewards with the KL penalty folded in, generalised
advantage estimation, and the clipped value loss.

Pure tensor functions over right-padded ``[B, T]`` tensors whose ``mask`` marks the response
tokens (the tokens a value and an action belong to); the PPO loop and the critic's training
group are the PPO issue's next part.
"""

from __future__ import annotations

import attrs
import torch


def token_rewards(scores: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None = None,
                  kl_coef: float = 0.0) -> torch.Tensor:
    """``[B, T]`` per-token rewards: ``-kl_coef * kl`` on every response token, plus the sequence's
    score ``scores`` ``[B]`` on its last response token (the reward of a finished sequence)."""
    mask = mask.to(torch.float32)
    rewards = -kl_coef * kl * mask if kl is not None and kl_coef else torch.zeros_like(mask)
    last = (mask * torch.arange(mask.shape[1], dtype=torch.float32)).argmax(dim=1)  # last response token
    has_response = mask.sum(dim=1) > 0
    rows = torch.arange(mask.shape[0])[has_response]
    rewards[rows, last[has_response]] += scores.to(torch.float32)[has_response]
    return rewards


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
        lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns ``[B, T]`` by generalised advantage estimation over each row's
    response tokens (right to left; the value after the last token is 0, tokens outside ``mask``
    are skipped and get 0): ``delta_t = r_t + gamma * V_{t+1} - V_t``,
    ``A_t = delta_t + gamma * lam * A_{t+1}``, returns ``A_t + V_t``."""
    mask = mask.to(torch.float32)
    advantages = torch.zeros_like(rewards, dtype=torch.float32)
    next_value = torch.zeros(rewards.shape[0])
    next_advantage = torch.zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = advantage * m
        # outside the mask (padding, prompt) the running values pass through unchanged
        next_value = torch.where(m > 0, values[:, t].float(), next_value)
        next_advantage = torch.where(m > 0, advantage, next_advantage)
    return advantages, (advantages + values.float()) * mask


@attrs.frozen
class ValueLoss:
    """The clipped value loss, half the larger squared error of the new value and of the new value
    clipped to within ``clip`` of the old one: ``0.5 * max((V - R)^2, (clip(V, V_old +- clip) - R)^2)``,
    summed over ``loss_mask`` tokens and divided by the step's loss-token count (``normaliser``).
    Reads ``returns`` and ``old_values`` from the batch; ``values`` are the critic's ``[b, T]`` outputs."""

    clip: float | None = 0.2
    scale: float = 1.0  # factor on the loss (critic.loss_scale)

    def __call__(self, values: torch.Tensor, batch: dict[str, torch.Tensor],
                 normaliser: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask = batch["loss_mask"].to(values.dtype)
        returns, old = batch["returns"].to(values.dtype), batch["old_values"].to(values.dtype)
        error = (values - returns) ** 2
        if self.clip is not None:
            clipped = old + (values - old).clamp(-self.clip, self.clip)
            error = torch.maximum(error, (clipped - returns) ** 2)
        loss = self.scale * 0.5 * (error * mask).sum() / normaliser
        return loss, {"value_loss": loss.detach()}


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var(returns - values) / Var(returns)`` over the masked tokens (0 where the returns
    do not vary)."""
    m = mask.bool()
    if int(m.sum()) < 2:  # no spread to explain (a step whose every token left the loss, e.g. overlong filtering)
        return 0.0
    residual, target = (returns - values)[m].float(), returns[m].float()
    variance = target.var(unbiased=False)
    return 0.0 if variance.item() == 0 else float(1.0 - residual.var(unbiased=False) / variance)
