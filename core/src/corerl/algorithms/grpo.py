"""One GRPO step over any training and generation backend (only their contracts are used).

prompts --generate--> samples --reward--> rewards --group normalisation--> advantages
        (--training.logprobs--> old logprobs, for several passes) (--reference.logprobs--> KL reference)
        --train_step per mini-batch, x passes--> new weights --refit--> generation

The offload policy is called at each boundary: before generation, before training, and
around the refit (see :mod:`corerl.offload.schedule`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import torch

from corerl.algorithms.batches import (
    RewardFn,
    minibatches,
    samples_to_batch,
    step_minibatches,
    step_rows,
    step_seed,
)
from corerl.algorithms.contract import AlgorithmBase
from corerl.algorithms.grpo_math import (
    GRPOLoss,
    advantages_for,
    kl_estimate,
    kl_in_reward_advantages,
    mask_by_prob_error,
    off_policy_metrics,
    outcome_advantages_with_kl,
    step_gap_metrics,
)
from corerl.algorithms.reward_shaping import RolloutShaping, dynamically_sampled
from corerl.environments.rollout import Rollout, SingleTurnRollout, StepWiseSample, step_wise
from corerl.errors import ConfigError
from corerl.generation.contract import SamplingSettings
from corerl.generation.routes import without_routes
from corerl.offload import NoOffload, PhaseOffload, ReferenceOffload
from corerl.training.weights import send_weights

if TYPE_CHECKING:
    from corerl.generation.contract import GenerationEngine
    from corerl.training.contract import TrainingEngine


def component_means(rollout: Rollout) -> dict[str, float]:
    """Each named part of the step's rewards averaged over its samples (``reward_components/<name>``)."""
    flat = [parts for group in rollout.components or [] for parts in group]
    return {f"reward_components/{name}": sum(parts[name] for parts in flat) / len(flat) for name in flat[0]} if flat else {}


@attrs.define
class GRPO:
    """GRPO over a training backend and a generation backend; call :meth:`step` per batch of prompts."""

    config: Any
    training: TrainingEngine
    generation: GenerationEngine
    reward_fn: RewardFn
    loss: GRPOLoss = attrs.field(factory=GRPOLoss)
    reference: TrainingEngine | None = None  # a frozen training backend for the KL penalty (logprobs only)
    scale_rewards_by_std: bool = True
    leave_one_out_baseline: bool = False
    advantage_estimator: str = "grpo"  # reinforce_plus_plus (REINFORCE++-baseline), maxrl or batch_mean (advantages_for)
    minus_baseline: bool = True  # reinforce_plus_plus: the group's mean subtracted first
    advantage_clip: tuple[float | None, float | None] = (None, None)  # bounds on the advantages (low, high)
    # drop sequences whose training/generation probability error is above this (mask_by_prob_error)
    seq_logprob_error_threshold: float | None = None
    # reinforce_plus_plus with the KL in the reward: its coefficient (the loss then has no KL term)
    kl_in_reward: float = 0.0
    optimization_passes: int = 1
    optimizer_batch_size: int | None = None  # rows per optimizer step; None: the whole step's samples
    steps_done: int = 0
    offload: PhaseOffload | None = None  # default: nothing moves
    reference_offload: ReferenceOffload | None = None  # default: the reference stays where it is
    rollout: Any = None  # default: one turn scored by reward_fn (corerl.environments.rollout)
    # after each step's training, instead of refit(): asynchronous GRPO hands the weights over
    # without waiting for the generation group (corerl.asynchronous.grpo)
    hand_over: Callable[[], None] | None = None
    shaping: RolloutShaping = attrs.field(factory=RolloutShaping)  # DAPO's reward scaling, overlong penalty, filtering
    merge_steps: bool = False  # step-wise rows merged where the prefix holds (algorithm.step_wise_merge)

    def __attrs_post_init__(self) -> None:
        if self.rollout is None:
            self.rollout = SingleTurnRollout(self.generation, self.reward_fn)
        if self.offload is None:
            self.offload = NoOffload(self.training, self.generation)
        if self.reference_offload is None and self.reference is not None:
            self.reference_offload = ReferenceOffload(self.reference, enabled=False)

    def step(self, prompts: Sequence[Sequence[int]], items: Sequence[Any] | None = None) -> dict[str, float]:
        """Generate, score, train, refit; returns the step's metrics (timings in seconds)."""
        rollout, seconds = self.generate(prompts, items)
        return self.learn(rollout, {"time/generation": seconds})

    def generate(self, prompts: Sequence[Sequence[int]], items: Sequence[Any] | None = None,
                 batch: int = 0) -> tuple[Rollout, float]:
        """This step's rollout (``num_generations_per_prompt`` samples or episodes per prompt,
        scored, then shaped) and the seconds it took; ``batch``: which of the step's generation
        batches (dynamic sampling draws several, each with a seed of its own)."""
        algorithm = self.config.core.algorithm
        items = list(items) if items is not None else [None] * len(prompts)
        offload = self.offload
        assert offload is not None and self.rollout is not None
        start = time.perf_counter()
        offload.before_generation()
        seed = step_seed(algorithm.seed, self.steps_done, batch)
        sampling = SamplingSettings.from_config(self.config, seed=seed)
        rollout = self.rollout.run(prompts, items, sampling, algorithm.num_generations_per_prompt,
                                   self.config.core.policy.max_seq_length)
        return self.shaping.apply(rollout), time.perf_counter() - start

    def dynamic_step(self, draw: Callable[[int], tuple[list[list[int]], list[Any]]], batch_size: int,
                     settings: Any) -> dict[str, float]:
        """One step with DAPO's dynamic sampling (``algorithm.dynamic_sampling``): prompts from
        ``draw(count)`` are generated and scored until ``batch_size`` groups with differing
        (shaped) rewards are kept; each generation batch gets a seed of its own."""
        seconds = 0.0
        batches = 0

        def generate(count: int) -> Rollout:
            nonlocal seconds, batches
            prompts, items = draw(count)
            rollout, took = self.generate(prompts, items, batch=batches)
            seconds += took
            batches += 1
            return rollout

        rollout = dynamically_sampled(batch_size, settings.batch_multiplier, settings.max_generation_batches, generate)
        return self.learn(rollout, {"time/generation": seconds})

    def learn(self, rollout: Rollout, timings: dict[str, float]) -> dict[str, float]:
        """Advantages, training (passes x mini-batches) and the refit, from a scored ``rollout``;
        the step's metrics, ``timings`` among them."""
        offload = self.offload
        assert offload is not None
        groups = rollout.groups
        rewards = torch.tensor(rollout.rewards, dtype=torch.float32)
        kl_in_reward = self.kl_in_reward and self.reference_offload is not None
        # reinforce_plus_plus with the KL in the reward: normalised per token below
        advantages = advantages_for(self.advantage_estimator, rewards, scale_by_std=self.scale_rewards_by_std,
                                    leave_one_out=self.leave_one_out_baseline, minus_baseline=self.minus_baseline,
                                    normalise=self.scale_rewards_by_std and not kl_in_reward,
                                    components=self._components(rollout))
        # step-wise trajectories: each episode's turns are rows of their own, with its advantage
        stepped = any(isinstance(s, StepWiseSample) for group in groups for s in group)
        if stepped and kl_in_reward:
            raise ConfigError("takes each sequence's KL from its reward, and step-wise trajectories train an "
                              "episode's turns as rows of their own", key="algorithm.use_kl_in_reward",
                              hint="remove it, or set algorithm.step_wise_trajectories=false")
        rows_of, row_advantages, counts = (step_rows(groups, advantages, merge=self.merge_steps) if stepped
                                           else (groups, advantages, []))
        batch = samples_to_batch(rows_of, row_advantages)

        start = time.perf_counter()
        offload.before_training()
        mask = batch["loss_mask"].bool()
        rows, per_update = int(batch["input_ids"].shape[0]), self.optimizer_batch_size
        sequences = len(counts) if stepped else rows  # what optimizer_batch_size counts: episodes or samples
        several_updates = self.optimization_passes > 1 or (per_update is not None and per_update < sequences)
        off_policy = None
        # later updates, the IS weights, a KL in the reward and the sequences' error check need the
        # training policy's logprobs
        dropping = self.seq_logprob_error_threshold is not None
        if several_updates or self.loss.corrects_importance or kl_in_reward or dropping:
            batch["old_logprobs"] = self.training.logprobs(batch)
            off_policy = off_policy_metrics(batch["old_logprobs"], batch["gen_logprobs"], mask, self.loss)
            if dropping:  # measured over every sequence, then the ones past the threshold leave the loss
                assert self.seq_logprob_error_threshold is not None
                off_policy.update(mask_by_prob_error(batch, self.seq_logprob_error_threshold))
        if self.reference_offload is not None and (self.loss.kl_penalty or kl_in_reward):
            with self.reference_offload.scoring() as reference:
                batch["ref_logprobs"] = reference.logprobs(without_routes(batch))
        timings["time/logprobs"] = time.perf_counter() - start
        kl_metrics: dict[str, float] = {}
        if kl_in_reward:
            loss = self.loss
            kl = kl_estimate(batch["ref_logprobs"] - batch["old_logprobs"], loss.kl_type, loss.kl_input_clamp,
                             loss.kl_output_clamp) * mask
            if self.advantage_estimator == "reinforce_plus_plus":  # each token's return to go
                batch["advantages"] = kl_in_reward_advantages(advantages.reshape(-1), mask, kl, self.kl_in_reward,
                                                              normalise=self.scale_rewards_by_std)
            else:  # an outcome estimator: its advantages of the rewards less each sample's summed KL
                batch["advantages"] = outcome_advantages_with_kl(
                    self.advantage_estimator, rewards, kl, self.kl_in_reward, batch["advantages"].shape,
                    scale_by_std=self.scale_rewards_by_std, leave_one_out=self.leave_one_out_baseline)
            kl_metrics["kl"] = float(kl.sum() / mask.sum().clamp(min=1))
        if self.advantage_clip != (None, None):
            batch["advantages"] = batch["advantages"].clamp(*self.advantage_clip)

        start = time.perf_counter()
        # cut once the batch holds every column the loss reads
        weights = self.loss.aggregation_weights
        parts = (step_minibatches(batch, counts, per_update, weights=weights) if stepped
                 else minibatches(batch, per_update, weights=weights))
        results = [self.training.train_step(part, self.loss) for _ in range(self.optimization_passes) for part in parts]
        timings["time/training"] = time.perf_counter() - start

        start = time.perf_counter()
        if self.hand_over is not None:
            self.hand_over()
        else:
            self.refit()
        timings["time/refit"] = time.perf_counter() - start

        self.steps_done += 1
        last = results[-1]
        generated = int(mask.sum())
        # how far the training backend's logprobs of the sampled tokens are from the generation
        # backend's: from the separate logprob pass, else from the first pass's forward
        gap = step_gap_metrics(results[0].metrics)
        if off_policy is not None and generated:
            gap = off_policy
        loss_metrics = {k: float(v) for k, v in last.metrics.items()
                        if not k.startswith(("logprob_mismatch/", "importance_ratio/"))}
        if stepped:
            loss_metrics["step_wise/rows"] = float(rows)
        return {
            "optimizer_step": float(last.step),
            "reward/mean": float(rewards.mean()),
            "reward/max": float(rewards.max()),
            "loss": float(last.loss),
            "grad_norm": float(last.grad_norm),
            "lr": float(last.lr),
            "generated_tokens": float(generated),
            **gap,
            **loss_metrics,
            **kl_metrics,
            **component_means(rollout),
            **rollout.metrics,
            **timings,
        }

    def _components(self, rollout: Rollout) -> torch.Tensor | None:
        """The rewards' named parts as ``[K, prompts, n]`` for the gdpo estimator (None for the
        others); refused in one line where the environment names none."""
        if self.advantage_estimator != "gdpo":
            return None
        if rollout.components is None:
            raise ConfigError("the gdpo estimator normalises each named part of the reward, and this step's "
                              "environment gave none (Turn.reward_components)", key="algorithm.advantage_estimator",
                              hint="use an environment that names its reward's parts (data.env_name=math_multi_reward), "
                                   "or algorithm.advantage_estimator=grpo")
        names = list(rollout.components[0][0])
        return torch.tensor([[[parts[name] for parts in group] for group in rollout.components] for name in names],
                            dtype=torch.float32)

    def refit(self) -> None:
        """The new weights to the generation engine (waiting until it uses them)."""
        assert self.offload is not None
        self.offload.before_refit()
        send_weights(self.training, self.generation)
        self.offload.after_refit()


class GRPOAlgorithm(AlgorithmBase):
    """``algorithm.name: grpo``: each step samples ``algorithm.batch_size`` prompts from the task,
    ``num_generations_per_prompt`` completions (or, with ``data.env_name``, episodes) each, and
    runs :meth:`GRPO.step`; with
    ``algorithm.kl_penalty`` a frozen reference of the starting weights scores the samples."""

    name = "grpo"

    def begin(self) -> None:
        context, algorithm = self.context, self.context.config.core.algorithm
        reference = reference_offload = None
        if algorithm.kl_penalty:
            reference, reference_offload = context.start_reference()
        loss = GRPOLoss.from_config(algorithm, context.config.core.policy.generation.max_new_tokens)
        self.grpo = GRPO(context.config, context.training, context.generation, context.task.reward,
                         loss=loss, scale_rewards_by_std=algorithm.scale_rewards_by_std,
                         kl_in_reward=algorithm.kl_penalty if algorithm.use_kl_in_reward else 0.0,
                         leave_one_out_baseline=algorithm.leave_one_out_baseline,
                         advantage_estimator=algorithm.advantage_estimator, minus_baseline=algorithm.minus_baseline,
                         advantage_clip=(algorithm.advantage_clip_low, algorithm.advantage_clip_high),
                         seq_logprob_error_threshold=algorithm.seq_logprob_error_threshold,
                         optimization_passes=algorithm.optimization_passes,
                         optimizer_batch_size=algorithm.optimizer_batch_size, reference=reference,
                         steps_done=self.done, offload=context.offload, reference_offload=reference_offload,
                         rollout=self.training_rollout(), shaping=RolloutShaping.from_config(context.config),
                         merge_steps=algorithm.step_wise_merge)
        if self.asynchronous is not None:
            self.asynchronous.begin(self.grpo)

    def training_rollout(self) -> Any:
        """The run's training rollout; with ``algorithm.step_wise_trajectories``, playing step-wise
        (each turn a row of its own: :func:`corerl.environments.rollout.step_wise`; what it cannot
        combine with is refused by validation's table, :mod:`corerl.algorithms.step_wise`)."""
        rollout = self.context.training_rollout()
        if not self.context.config.core.algorithm.step_wise_trajectories:
            return rollout
        return step_wise(rollout)

    @property
    def asynchronous(self) -> Any:
        """The asynchronous driver (``algorithm.async.enabled``), built on first use; None when off."""
        if not hasattr(self, "_asynchronous"):
            from corerl.asynchronous.settings import async_settings

            settings = async_settings(self.context.config)
            self._asynchronous = None
            if settings.enabled:
                from corerl.asynchronous.grpo import AsyncTrainer

                self._asynchronous = AsyncTrainer(self.context, settings)
        return self._asynchronous

    def step(self) -> dict[str, float]:
        if self.asynchronous is not None:
            return self.asynchronous.step()
        algorithm = self.context.config.core.algorithm
        if algorithm.dynamic_sampling.enabled:
            return self.grpo.dynamic_step(self.context.task.sample, algorithm.batch_size, algorithm.dynamic_sampling)
        prompts, examples = self.context.task.sample(algorithm.batch_size)
        return self.grpo.step(prompts, examples)

    def held_out(self) -> dict[str, float]:
        if self.asynchronous is not None:
            self.asynchronous.stop()  # after training: the newest weights, no rollouts competing
        return super().held_out()

    def task_state(self) -> Any:
        if self.asynchronous is not None:
            return self.asynchronous.task_state()
        return super().task_state()

    def save(self, folder: Path) -> None:
        if self.asynchronous is not None:
            self.asynchronous.save(folder)

    def load(self, folder: Path) -> None:
        if self.asynchronous is not None:
            self.asynchronous.load(folder)
