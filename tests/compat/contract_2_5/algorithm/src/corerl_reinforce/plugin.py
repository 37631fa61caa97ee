"""A third party's algorithm, written against corerl.sdk alone: REINFORCE with a running-mean
baseline (each sample's advantage is its reward minus an exponential mean of past rewards).
The example docs/plugins.md named at contract 2.5, with the version the docs said to state."""

from __future__ import annotations

import json

import attrs

from corerl.sdk import (
    Algorithm,
    AlgorithmBase,
    ConfigError,
    PlotSpec,
    SamplingSettings,
    hookimpl,
    samples_to_batch,
    setting,
    step_seed,
)

corerl_contract = "2.5"


@attrs.define(kw_only=True)
class ReinforceConfig:
    """``algorithm.reinforce``."""

    baseline_momentum: float = setting(0.9, min=0.0, max=1.0, help="weight of the past in the running-mean baseline")
    initial_baseline: float = setting(0.0, help="the baseline before the first step")


def check_supported(config):
    """Refuse what REINFORCE cannot run (``corerl validate`` and ``corerl run`` both call it)."""
    if config.core.algorithm.num_generations_per_prompt != 1:
        raise ConfigError("REINFORCE samples one completion per prompt", key="algorithm.num_generations_per_prompt",
                          hint="set algorithm.num_generations_per_prompt=1")


class PolicyGradientLoss:
    """-advantage x logprob of each completion token, over the step's loss tokens."""

    def __call__(self, logprobs, batch, normaliser):
        mask = batch["loss_mask"].to(logprobs.dtype)
        return -(logprobs * batch["advantages"] * mask).sum() / normaliser, {}


class Reinforce(AlgorithmBase):
    name = "reinforce"

    def __init__(self, context):
        super().__init__(context)
        settings = context.config.section("algorithm.reinforce")
        self.momentum, self.baseline = settings.baseline_momentum, settings.initial_baseline

    def save(self, folder):
        (folder / "reinforce.json").write_text(json.dumps({"baseline": self.baseline}))

    def load(self, folder):
        self.baseline = json.loads((folder / "reinforce.json").read_text())["baseline"]

    def step(self):
        import torch

        context, algorithm = self.context, self.context.config.core.algorithm
        prompts, examples = context.task.sample(algorithm.batch_size)
        context.offload.before_generation()
        sampling = SamplingSettings.from_config(context.config, seed=step_seed(algorithm.seed, self.done))
        groups = context.generation.generate(prompts, sampling.within(context.config.core.policy.max_seq_length,
                                                                       prompts), n=1)
        rewards = torch.tensor([float(context.task.reward(group[0], example))
                                for group, example in zip(groups, examples, strict=True)])
        advantages = rewards - self.baseline
        self.baseline = self.momentum * self.baseline + (1 - self.momentum) * float(rewards.mean())
        context.offload.before_training()
        result = context.training.train_step(samples_to_batch(groups, advantages), PolicyGradientLoss())
        context.offload.before_refit()
        context.refit()
        context.offload.after_refit()
        return {"optimizer_step": float(result.step), "loss": float(result.loss), "grad_norm": float(result.grad_norm),
                "reward/mean": float(rewards.mean()), "baseline": self.baseline}


@hookimpl
def corerl_register_algorithms(register):
    register(Algorithm(id="reinforce", factory=Reinforce, config_section="algorithm.reinforce",
                       config_schema=ReinforceConfig, check_supported=check_supported, plot=PlotSpec(metrics=("reward/mean", "baseline"), title="reward"),
                       description="REINFORCE with a running-mean baseline"))
