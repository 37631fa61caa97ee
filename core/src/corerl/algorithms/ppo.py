"""One PPO step with a critic, over any training and generation backends (only their contracts
are used).

prompts --generate--> samples --reward--> scores
        --policy.logprobs--> old logprobs (--reference.logprobs--> KL, folded into token rewards)
        --critic.values--> old values --GAE(gamma, lam)--> advantages, returns
        --critic.train_step(value loss), policy.train_step(clipped loss), per mini-batch x passes
        --refit--> generation

The critic is a second training backend (possibly another backend or layout) on the same
devices; :class:`CriticOffload` moves its state off the accelerator while the generation engine
runs, by the parts the policy's offload policy moves.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import torch

from corerl.algorithms.batches import RewardFn, minibatches, samples_to_batch, step_seed
from corerl.algorithms.contract import AlgorithmBase, RunServices
from corerl.algorithms.grpo_math import GRPOLoss, kl_estimate, step_gap_metrics
from corerl.algorithms.ppo_math import ValueLoss, explained_variance, gae, token_rewards
from corerl.algorithms.reward_shaping import RolloutShaping
from corerl.environments.rollout import SingleTurnRollout
from corerl.generation.contract import SamplingSettings
from corerl.generation.routes import without_routes
from corerl.offload import NoOffload, PhaseOffload, ReferenceOffload
from corerl.training.weights import send_weights

if TYPE_CHECKING:
    from corerl.generation.contract import GenerationEngine
    from corerl.training.contract import TrainingEngine, ValueEngine


def whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``values`` centred and scaled to unit variance over the ``mask`` tokens (0 elsewhere)."""
    m = mask.bool()
    picked = values[m]
    if picked.numel() < 2:
        return values * mask
    return (values - picked.mean()) / (picked.std(unbiased=False) + eps) * mask


def masked_stats(values: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """Mean and standard deviation of ``values`` over the ``mask`` tokens."""
    picked = values[mask.bool()].float()
    if picked.numel() == 0:
        return 0.0, 0.0
    return float(picked.mean()), float(picked.std(unbiased=False))


class CriticOffload:
    """The critic's state off the accelerator while it is idle (generation, refit): the parts
    ``parts`` the policy's offload policy moves for generation (none: the critic stays)."""

    def __init__(self, critic: Any, parts: Sequence[str] = ()) -> None:
        self.critic = critic
        self.parts = sorted(parts)
        self.away = False

    def idle(self) -> None:
        if self.parts and not self.away:
            self.critic.offload(self.parts)
            self.away = True

    def active(self) -> None:
        if self.away:
            self.critic.reload(self.parts)
            self.away = False


@attrs.define
class PPO:
    """PPO with a critic over a policy and a critic training backend and a generation backend;
    call :meth:`step` per batch of prompts."""

    config: Any
    training: TrainingEngine
    critic: ValueEngine
    generation: GenerationEngine
    reward_fn: RewardFn
    loss: GRPOLoss = attrs.field(factory=GRPOLoss)  # the clipped policy loss (its KL term off: KL is in the rewards)
    value_loss: ValueLoss = attrs.field(factory=ValueLoss)
    reference: TrainingEngine | None = None
    kl_coef: float = 0.0
    kl_type: str = "k1"
    gamma: float = 1.0
    lam: float = 0.95
    value_lam: float | None = None  # the critic targets' lambda (decoupled GAE); None: lam
    whiten_advantages: bool = True
    optimization_passes: int = 1
    optimizer_batch_size: int | None = None
    critic_warmup_steps: int = 0
    steps_done: int = 0
    offload: PhaseOffload | None = None
    reference_offload: ReferenceOffload | None = None
    critic_offload: CriticOffload | None = None
    rollout: Any = None  # default: one turn scored by reward_fn (corerl.environments.rollout)
    shaping: RolloutShaping = attrs.field(factory=RolloutShaping)  # DAPO's reward scaling, overlong penalty, filtering

    def __attrs_post_init__(self) -> None:
        if self.rollout is None:
            self.rollout = SingleTurnRollout(self.generation, self.reward_fn)
        if self.offload is None:
            self.offload = NoOffload(self.training, self.generation)
        if self.reference_offload is None and self.reference is not None:
            self.reference_offload = ReferenceOffload(self.reference, enabled=False)
        if self.critic_offload is None:
            self.critic_offload = CriticOffload(self.critic, sorted(getattr(self.offload, "for_generation", ())))

    @classmethod
    def from_config(cls, config: Any, **engines: Any) -> PPO:
        """A PPO of the recipe's ``algorithm``, ``algorithm.ppo`` and ``critic`` sections over ``engines``."""
        algorithm, critic, settings = config.core.algorithm, config.core.critic, config.section("algorithm.ppo")
        loss = GRPOLoss.from_config(algorithm, config.core.policy.generation.max_new_tokens)
        return cls(config=config, loss=attrs.evolve(loss, kl_penalty=0.0),
                   value_loss=ValueLoss(clip=critic.value_clip, scale=critic.loss_scale), kl_coef=algorithm.kl_penalty,
                   kl_type=algorithm.kl_type, gamma=settings.gamma, lam=settings.lam, value_lam=settings.value_lam,
                   whiten_advantages=settings.whiten_advantages,
                   optimization_passes=algorithm.optimization_passes,
                   optimizer_batch_size=algorithm.optimizer_batch_size,
                   critic_warmup_steps=settings.critic_warmup_steps,
                   shaping=RolloutShaping.from_config(config), **engines)

    def step(self, prompts: Sequence[Sequence[int]], items: Sequence[Any] | None = None) -> dict[str, float]:
        """Generate, score, estimate advantages, train critic and policy, refit; returns the step's
        metrics (timings in seconds)."""
        algorithm = self.config.core.algorithm
        items = list(items) if items is not None else [None] * len(prompts)
        offload, critic_offload = self.offload, self.critic_offload
        assert offload is not None and critic_offload is not None
        timings: dict[str, float] = {}

        start = time.perf_counter()
        critic_offload.idle()
        offload.before_generation()
        sampling = SamplingSettings.from_config(self.config, seed=step_seed(algorithm.seed, self.steps_done))
        assert self.rollout is not None
        rollout = self.shaping.apply(self.rollout.run(prompts, items, sampling, algorithm.num_generations_per_prompt,
                                                      self.config.core.policy.max_seq_length))
        groups = rollout.groups
        timings["time/generation"] = time.perf_counter() - start

        scores = torch.tensor([r for group in rollout.rewards for r in group], dtype=torch.float32)
        batch = samples_to_batch(groups, torch.zeros(len(scores)))
        mask = batch["loss_mask"]

        start = time.perf_counter()
        offload.before_training()
        critic_offload.active()
        batch["old_logprobs"] = self.training.logprobs(batch)
        kl = None
        if self.reference_offload is not None and self.kl_coef:
            with self.reference_offload.scoring() as reference:
                ref_logprobs = reference.logprobs(without_routes(batch))
            kl = kl_estimate(ref_logprobs - batch["old_logprobs"], self.kl_type) * mask
        old_values = self.critic.values(batch)
        timings["time/logprobs"] = time.perf_counter() - start

        rewards = token_rewards(scores, mask, kl, self.kl_coef)
        advantages, returns = gae(rewards, old_values, mask, self.gamma, self.lam)
        if self.value_lam is not None and self.value_lam != self.lam:  # decoupled GAE: the critic's own targets
            _, returns = gae(rewards, old_values, mask, self.gamma, self.value_lam)
        adv_mean, adv_std = masked_stats(advantages, mask)
        batch["advantages"] = whiten(advantages, mask) if self.whiten_advantages else advantages
        batch["returns"], batch["old_values"] = returns, old_values

        start = time.perf_counter()
        parts = minibatches(batch, self.optimizer_batch_size, weights=self.loss.aggregation_weights)
        passes = range(self.optimization_passes)
        critic_results = [self.critic.train_step(part, self.value_loss) for _ in passes for part in parts]
        timings["time/critic_training"] = time.perf_counter() - start
        start = time.perf_counter()
        policy_moves = self.steps_done >= self.critic_warmup_steps
        results = [self.training.train_step(part, self.loss) for _ in passes for part in parts] if policy_moves else []
        timings["time/training"] = time.perf_counter() - start

        start = time.perf_counter()
        if results:
            critic_offload.idle()
            offload.before_refit()
            send_weights(self.training, self.generation)
            offload.after_refit()
        timings["time/refit"] = time.perf_counter() - start
        self.steps_done += 1

        returns_mean, returns_std = masked_stats(returns, mask)
        critic_last = critic_results[-1]
        metrics: dict[str, float] = {
            "reward/mean": float(scores.mean()), "reward/max": float(scores.max()),
            "advantages/mean": adv_mean, "advantages/std": adv_std,
            "returns/mean": returns_mean, "returns/std": returns_std,
            "values/mean": masked_stats(old_values, mask)[0],
            "critic/value_loss": float(critic_results[0].loss),
            "critic/explained_variance": explained_variance(old_values, returns, mask),
            "critic/grad_norm": float(critic_last.grad_norm), "critic/lr": float(critic_last.lr),
            "generated_tokens": float(mask.sum()),
            **rollout.metrics,
        }
        if kl is not None:
            metrics["kl"] = float(kl.sum() / mask.sum().clamp(min=1))
        if results:
            last = results[-1]
            metrics.update({"optimizer_step": float(last.step), "loss": float(last.loss),
                            "grad_norm": float(last.grad_norm), "lr": float(last.lr),
                            **{k: float(v) for k, v in last.metrics.items()
                               if not k.startswith(("logprob_mismatch/", "importance_ratio/"))},
                            **step_gap_metrics(results[0].metrics)})
        else:  # the critic's warm-up: the policy has not moved
            metrics.update({"optimizer_step": 0.0, "loss": 0.0, "grad_norm": 0.0})
        return {**metrics, **timings}


def critic_start(context: RunServices) -> str:
    """The critic's starting checkpoint: ``critic.model_name`` (a value model), else the weights
    PPO starts from with a zero value head, written once to ``<run dir>/critic_init``."""
    from corerl.complete_folders import write_once
    from corerl.errors import ConfigError
    from corerl.models.value_model import init_value_model, is_value_model

    given = context.config.core.critic.model_name
    if given is not None:
        if not (Path(given) / "config.json").exists():
            raise ConfigError(f"critic checkpoint {given} is not a Hugging Face checkpoint directory",
                              key="critic.model_name", hint="give a local folder, or unset it to start the critic "
                                                            "from the policy")
        if not is_value_model(given):
            raise ConfigError(f"critic checkpoint {given} is not a value model (a one-label token classifier)",
                              key="critic.model_name", hint="unset critic.model_name to start the critic from the "
                                                            "policy's weights with a zero value head")
        return given
    return str(write_once(context.run_dir / "critic_init", lambda work: init_value_model(context.starting_weights, work)))


class PPOAlgorithm(AlgorithmBase):
    """``algorithm.name: ppo``: :meth:`PPO.step` over the policy, a critic (a second training
    group, the ``critic`` section; its checkpoint and final export are this algorithm's) and,
    with ``algorithm.kl_penalty``, a frozen reference."""

    name = "ppo"

    def __init__(self, context: RunServices) -> None:
        super().__init__(context)
        self.ppo: PPO | None = None
        self.resume_from: Path | None = None

    def begin(self) -> None:
        context, selection = self.context, self.context.selection
        assert selection.critic_backend is not None and selection.critic_backend.registration is not None
        reference = reference_offload = None
        if context.config.core.algorithm.kl_penalty:
            reference, reference_offload = context.start_reference()
        critic = context.start(selection.critic_backend.registration, critic_start(context),
                               config=selection.critic_config)
        if self.resume_from is not None and (self.resume_from / "critic").exists():
            critic.load_checkpoint(str(self.resume_from / "critic"))
        self.ppo = PPO.from_config(context.config, training=context.training, critic=critic,
                                   generation=context.generation, reward_fn=context.task.reward, reference=reference,
                                   steps_done=self.done, offload=context.offload, reference_offload=reference_offload,
                                   rollout=context.training_rollout())

    def step(self) -> dict[str, float]:
        assert self.ppo is not None
        prompts, examples = self.context.task.sample(self.context.config.core.algorithm.batch_size)
        return self.ppo.step(prompts, examples)

    def load(self, folder: Path) -> None:
        self.resume_from = folder  # the critic starts in begin(), from this checkpoint's critic/

    def save(self, folder: Path) -> None:
        if self.ppo is not None:
            assert self.ppo.critic_offload is not None
            self.ppo.critic_offload.active()
            self.ppo.critic.save_checkpoint(str(folder / "critic"))

    def export(self, run_dir: Path) -> list[str]:
        from corerl.complete_folders import write_complete

        assert self.ppo is not None and self.ppo.critic_offload is not None
        self.ppo.critic_offload.active()
        critic = self.ppo.critic
        write_complete(run_dir / "final_critic", lambda work: critic.export_hf(str(work)))
        return [f"{run_dir / 'final_critic'} (the critic)"]
