"""The ``example_reinforce`` algorithm: REINFORCE with a baseline, over any training and
generation backend (only their contracts are used).

Each step draws prompts from the task, samples completions (or plays episodes, with
``data.env_name``) through the run's rollout stage, gives each sample the advantage reward minus
baseline, and takes one optimizer step on ``-advantage x logprob`` of the completion tokens. The
baseline is the algorithm's own state: saved with each checkpoint, read back on resume.

Imported only when a run builds the algorithm, so torch stays out of ``corerl plugins``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from corerl.sdk import AlgorithmBase, RunServices, SamplingSettings, samples_to_batch, step_seed

STATE_FILE = "example_reinforce.json"


class PolicyGradientLoss:
    """``-advantage x logprob`` over the step's loss tokens. A module-level class, so that it
    pickles to a backend's worker processes. ``normaliser`` is the step's loss-token count over
    every micro-batch and rank: each micro-batch returns its share of the loss and of each metric,
    and the backend sums them (so ``advantage/mean`` comes back as the step's mean per token)."""

    def __call__(self, logprobs: torch.Tensor, batch: dict[str, torch.Tensor],
                 normaliser: float) -> tuple[torch.Tensor, dict[str, float]]:
        mask = batch["loss_mask"].to(logprobs.dtype)
        weighted = batch["advantages"] * mask
        loss = -(logprobs * weighted).sum() / normaliser
        return loss, {"advantage/mean": float(weighted.sum()) / normaliser}


class ExampleReinforce(AlgorithmBase):
    """One phase of a run: ``name`` (the registration's id), ``total``, ``done`` (the run loop's
    count: read it, never write it) and ``measure`` come from :class:`AlgorithmBase`, with the
    held-out reward of greedy answers."""

    name = "example_reinforce"

    def __init__(self, context: RunServices) -> None:
        super().__init__(context)  # total = algorithm.max_steps; done = the steps a resumed run had done
        settings = context.config.section("algorithm.example_reinforce")
        self.kind, self.momentum = settings.baseline, settings.baseline_momentum
        self.baseline = 0.0

    def step(self) -> dict[str, float]:
        context = self.context
        core = context.config.core
        n = core.algorithm.num_generations_per_prompt

        # 1. prompts: token-id lists, and the example (dataset row) each came from
        prompts, examples = context.task.sample(core.algorithm.batch_size)

        # 2. sample: the generation engine gets the accelerator, then the rollout stage samples n
        # completions per prompt (or plays episodes) and scores them
        context.offload.before_generation()
        sampling = SamplingSettings.from_config(context.config, seed=step_seed(core.algorithm.seed, self.done))
        rollout = context.training_rollout().run(prompts, examples, sampling, n, core.policy.max_seq_length)

        # 3. advantages: one per sample, in group order
        rewards = torch.tensor(rollout.rewards, dtype=torch.float32)  # [prompts, n]
        if self.kind == "group_mean":
            baseline = rewards.mean(dim=1, keepdim=True)
        else:
            baseline = torch.full_like(rewards, self.baseline)
            self.baseline = self.momentum * self.baseline + (1 - self.momentum) * float(rewards.mean())
        advantages = (rewards - baseline).flatten()

        # 4. train: the training engine gets the accelerator back, one optimizer step
        context.offload.before_training()
        result = context.training.train_step(samples_to_batch(rollout.groups, advantages), PolicyGradientLoss())

        # 5. refit: the new weights to the generation engine, for the next step's samples
        context.offload.before_refit()
        context.refit()
        context.offload.after_refit()
        return {
            "loss": result.loss, "grad_norm": result.grad_norm, "lr": result.lr,
            "optimizer_step": float(result.step), "reward/mean": float(rewards.mean()),
            "baseline": float(baseline.mean()), **result.metrics, **rollout.metrics,
        }

    def save(self, folder: Path) -> None:
        (folder / STATE_FILE).write_text(json.dumps({"baseline": self.baseline}))

    def load(self, folder: Path) -> None:
        self.baseline = json.loads((folder / STATE_FILE).read_text())["baseline"]

    def export(self, run_dir: Path) -> list[str]:
        path = run_dir / "baseline.json"
        path.write_text(json.dumps({"baseline": self.baseline}))
        return [f"{path} (the running-mean baseline at the end)"]
