"""DAPO's changes to a sampling algorithm's rollout, between the rewards and the advantages:
reward scaling, the soft overlong penalty, overlong filtering (GRPO and PPO) and dynamic
sampling (GRPO). Pure logic over :class:`~corerl.environments.rollout.Rollout`; no engine.

Scaling comes first (a 0/1 verifier becomes -1/+1, DAPO's accuracy reward), then the overlong
penalty is added, as in the DAPO paper. Held-out figures are never shaped: they are the task's
own rewards.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from corerl.environments.rollout import Rollout
from corerl.errors import ConfigError
from corerl.generation.contract import Sample


def scale_reward(reward: float, settings: Any) -> float:
    """``reward`` clamped to [source_min, source_max] and mapped linearly onto [target_min, target_max]."""
    low, high = settings.source_min, settings.source_max
    clamped = min(max(reward, low), high)
    share = 0.0 if high == low else (clamped - low) / (high - low)
    return settings.target_min + share * (settings.target_max - settings.target_min)


def overlong_penalty(length: int, buffer_length: int, penalty: float, max_length: int) -> float:
    """DAPO's soft overlong punishment of a completion of ``length`` tokens: 0 up to
    ``max_length - buffer_length``, then linear down to ``-penalty`` at ``max_length`` and beyond."""
    expected = max_length - buffer_length
    if length <= expected:
        return 0.0
    if buffer_length <= 0:
        return -penalty
    return -penalty * min(1.0, (length - expected) / buffer_length)


def model_tokens(sample: Sample) -> int:
    """The completion tokens the model itself produced (an episode's observations left out)."""
    return len(sample.completion_ids) if sample.completion_mask is None else int(sum(sample.completion_mask))


def truncated(sample: Sample) -> bool:
    """Whether the completion was cut at the length limit rather than ending by itself."""
    return sample.finish_reason == "length"


@attrs.frozen
class RolloutShaping:
    """The ``algorithm`` keys that change a rollout's rewards or which samples train: built with
    :meth:`from_config`; :meth:`apply` returns the shaped rollout with its metrics."""

    scaling: Any = None  # RewardScalingConfig when enabled
    penalty: tuple[int, float, int] | None = None  # buffer_length, penalty, max_response_length
    truncated_factor: float | None = None  # ProRL: a truncated completion's reward times this (penalty off)
    filter_overlong: bool = False

    @classmethod
    def from_config(cls, config: Any) -> RolloutShaping:
        algorithm = config.core.algorithm
        overlong = algorithm.overlong_penalty
        penalty = factor = None
        if overlong.enabled and overlong.truncated_reward_factor is not None:
            factor = overlong.truncated_reward_factor
        elif overlong.enabled:
            limit = overlong.max_response_length or config.core.policy.generation.max_new_tokens
            penalty = (overlong.buffer_length, overlong.penalty, limit)
        return cls(scaling=algorithm.reward_scaling if algorithm.reward_scaling.enabled else None,
                   penalty=penalty, truncated_factor=factor, filter_overlong=algorithm.overlong_filtering)

    @property
    def active(self) -> bool:
        return (self.scaling is not None or self.penalty is not None or self.truncated_factor is not None
                or self.filter_overlong)

    def apply(self, rollout: Rollout) -> Rollout:
        """The rollout with scaled and penalised rewards, and truncated samples' loss masks
        emptied under overlong filtering; ``reward/raw_mean`` keeps the task's own mean."""
        if not self.active:
            return rollout
        metrics = dict(rollout.metrics)
        flat = [r for group in rollout.rewards for r in group]
        metrics["reward/raw_mean"] = sum(flat) / max(len(flat), 1)
        rewards = [list(group) for group in rollout.rewards]
        if self.scaling is not None:
            rewards = [[scale_reward(r, self.scaling) for r in group] for group in rewards]
        if self.penalty is not None:
            buffer_length, penalty, limit = self.penalty
            added = [[overlong_penalty(model_tokens(s), buffer_length, penalty, limit) for s in group]
                     for group in rollout.groups]
            rewards = [[r + p for r, p in zip(rs, ps, strict=True)] for rs, ps in zip(rewards, added, strict=True)]
            hit = [p for group in added for p in group if p < 0]
            metrics["reward/overlong_penalised"] = len(hit) / max(len(flat), 1)
        if self.truncated_factor is not None:
            factor = self.truncated_factor
            rewards = [[r * factor if truncated(s) else r for r, s in zip(rs, group, strict=True)]
                       for rs, group in zip(rewards, rollout.groups, strict=True)]
        groups = rollout.groups
        if self.filter_overlong:
            groups = [[_masked_out(s) if truncated(s) else s for s in group] for group in groups]
            cut = sum(truncated(s) for group in rollout.groups for s in group)
            metrics["overlong_filtered"] = cut / max(len(flat), 1)
        return Rollout(groups, rewards, metrics, rollout.components)  # the reward's parts are not shaped


def _masked_out(sample: Sample) -> Sample:
    return attrs.evolve(sample, completion_mask=tuple(0 for _ in sample.completion_ids))


def informative(rewards: Sequence[float], parts: Sequence[dict[str, float]] | None = None) -> bool:
    """Whether a group's rewards differ (a group of equal rewards has zero advantage everywhere),
    or, given its samples' reward ``parts`` (``Rollout.components``), any one part does (gdpo
    normalises each part in its group: equal sums of differing parts still teach)."""
    if len(rewards) > 1 and statistics.pstdev(rewards) > 0:
        return True
    return bool(parts) and len(parts) > 1 and any(
        statistics.pstdev([p.get(name, 0.0) for p in parts]) > 0 for name in parts[0])


def merge(parts: Sequence[Rollout]) -> Rollout:
    """One rollout of the groups of ``parts``, their numeric metrics averaged."""
    groups = [g for part in parts for g in part.groups]
    rewards = [r for part in parts for r in part.rewards]
    keys = {k for part in parts for k in part.metrics}
    metrics = {k: sum(p.metrics.get(k, 0.0) for p in parts) / len(parts) for k in keys}
    components = ([c for part in parts for c in part.components]  # type: ignore[union-attr]
                  if all(part.components is not None for part in parts) else None)
    return Rollout(groups, rewards, metrics, components)


def dynamically_sampled(batch_size: int, multiplier: float, max_batches: int,
                        generate: Callable[[int], Rollout]) -> Rollout:
    """DAPO's dynamic sampling: ``generate(prompts)`` (a scored rollout over that many fresh
    prompts) is called until ``batch_size`` groups with differing rewards are kept, at most
    ``max_batches`` times; the first ``batch_size`` kept groups are the step's, the others are
    dropped (``dynamic_sampling/dropped_groups`` counts them, the all-equal ones among them in
    ``dynamic_sampling/all_equal_groups``). Short of groups after ``max_batches``, a
    :class:`~corerl.errors.ConfigError` names the cap and how many groups were all-equal."""
    prompts = max(batch_size, round(batch_size * multiplier))
    kept_groups: list[list[Sample]] = []
    kept_rewards: list[list[float]] = []
    kept_components: list[Any] = []  # each kept group's reward parts (None where the rollout has none)
    parts: list[Rollout] = []
    uniform: Counter[float] = Counter()  # the all-equal groups by their reward
    seen = 0
    while len(kept_groups) < batch_size and len(parts) < max_batches:
        part = generate(prompts)
        parts.append(part)
        for index, (group, rewards) in enumerate(zip(part.groups, part.rewards, strict=True)):
            seen += 1
            if informative(rewards, None if part.components is None else part.components[index]):
                kept_groups.append(group)
                kept_rewards.append(rewards)
                kept_components.append(None if part.components is None else part.components[index])
            else:
                uniform[rewards[0] if rewards else 0.0] += 1
    kept = len(kept_groups)
    if kept < batch_size:
        raise ConfigError(
            f"{len(parts)} generation batches of {prompts} prompts gave {kept} of the {batch_size} groups with "
            f"differing rewards a step needs: {sum(uniform.values())} of {seen} groups had all-equal rewards "
            f"({', '.join(f'{n} all {r:g}' for r, n in sorted(uniform.items()))})",
            key="algorithm.dynamic_sampling.max_generation_batches",
            hint="raise it or algorithm.dynamic_sampling.batch_multiplier, or set "
                 "algorithm.dynamic_sampling.enabled=false")
    metrics = merge(parts).metrics
    metrics.update({"dynamic_sampling/generation_batches": float(len(parts)),
                    "dynamic_sampling/kept_share": kept / max(seen, 1),
                    "dynamic_sampling/dropped_groups": float(seen - batch_size),
                    "dynamic_sampling/all_equal_groups": float(sum(uniform.values()))})
    components_kept = kept_components[:batch_size]
    return Rollout(kept_groups[:batch_size], kept_rewards[:batch_size], metrics,
                   None if any(p is None for p in components_kept) else components_kept)
