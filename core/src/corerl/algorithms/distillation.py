"""On-policy distillation: the student (the policy) samples, a frozen teacher scores the student's
own tokens, and the student learns to lower a KL to the teacher on them.

prompts --generate (student)--> samples --training.logprobs--> student logprobs
        --teacher.logprobs (or topk_logprobs)--> teacher logprobs (and its top-k next tokens)
        --the kl_type loss (one on-policy pass)--> new weights --refit-->

``kl_type: reverse``: with ``A_t = log p_teacher(x_t) - log p_student(x_t)`` (detached) as each
sampled token's advantage, the policy-gradient step is the gradient of ``KL(student || teacher)``
per token, estimated on the student's own samples (no discount over later tokens). ``forward``:
``KL(teacher || student)`` at each of the student's positions, summed over the teacher's
``topk_logits_k`` most likely next tokens (the teacher's engine returns them with
``topk_logprobs``; the student's backend computes its logprobs of the same tokens as
``candidate_logprobs``). ``mixed``: a weighted sum of the two
(:class:`~corerl.algorithms.distillation_math.TopKDistillationLoss`). The task's reward is
scored and logged; it is trained on only with ``outcome_advantage_weight`` above 0, which adds
that much of each sample's GRPO advantage to its tokens' (NeMo RL's OPD with an outcome reward).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from corerl.algorithms.batches import minibatches, samples_to_batch, step_seed
from corerl.algorithms.contract import AlgorithmBase, RunServices
from corerl.algorithms.distillation_math import (
    TopKDistillationLoss,
    reverse_kl_advantages,
    reverse_kl_k3,
    with_outcome_advantages,
)
from corerl.algorithms.grpo_math import GRPOLoss
from corerl.errors import ConfigError
from corerl.generation.contract import SamplingSettings
from corerl.generation.routes import without_routes
from corerl.models.tokenizer import check_same_vocabulary
from corerl.offload import ReferenceOffload
from corerl.training.weights import send_weights

TEACHER_KEY = "algorithm.distillation.teacher_model"


class DistillationAlgorithm(AlgorithmBase):
    """``algorithm.name: distillation``: each step samples ``algorithm.batch_size`` prompts x
    ``num_generations_per_prompt`` completions from the student, scores them with the teacher
    (``algorithm.distillation``) and takes one on-policy step down the per-token reverse KL."""

    name = "distillation"

    def __init__(self, context: RunServices) -> None:
        super().__init__(context)
        self.teacher: Any = None
        self.teacher_offload: ReferenceOffload | None = None
        self.loss: Any = GRPOLoss()
        self.topk: int | None = None  # forward or mixed KL: how many of the teacher's next tokens
        self.settings: Any = None  # algorithm.distillation
        self.rollout: Any = None

    def begin(self) -> None:
        context = self.context
        settings = self.settings = context.config.section("algorithm.distillation")
        teacher_path = context.resolve_model(settings.teacher_model, key=TEACHER_KEY, folder="teacher_model")
        check_same_vocabulary(context.starting_weights, teacher_path, TEACHER_KEY, "teacher")
        config = context.frozen_config(teacher_path, micro_batch_size=settings.teacher_micro_batch_size,
                                       backend=settings.teacher_training_backend,
                                       own_layout=settings.teacher_overrides,
                                       own_layout_key="algorithm.distillation.teacher_overrides", pool="teacher")
        registration = context.selection.training_backend.registration
        if settings.teacher_training_backend is not None:
            registration = context.host.training_backends.get(settings.teacher_training_backend)
            if registration is None:
                raise ConfigError(f"no training backend {settings.teacher_training_backend!r} is installed",
                                  key="algorithm.distillation.teacher_training_backend",
                                  hint=f"installed: {', '.join(context.host.training_backends.ids())}; or unset it "
                                       "to host the teacher on the policy's backend")
        if settings.teacher_overrides:  # a layout of its own: the backend's own check, as selection runs it for the policy
            registration.check(config)
        self.teacher = context.start(registration, teacher_path, config=config)
        self.teacher_offload = ReferenceOffload(self.teacher, settings.teacher_cpu_offload)
        if settings.kl_type != "reverse":
            self.topk = self._topk(settings, registration.id, teacher_path)
            self.loss = TopKDistillationLoss(settings.kl_type, settings.mixed_kl_weight, settings.zero_outside_topk)
        self.rollout = context.rollout()

    def _topk(self, settings: Any, backend: str, teacher_path: str) -> int:
        """``topk_logits_k``, once the teacher's engine is known to compute top-k logprobs and its
        vocabulary to hold that many tokens."""
        from transformers import AutoConfig

        if not callable(getattr(self.teacher, "topk_logprobs", None)):
            raise ConfigError(f"kl_type {settings.kl_type} needs the teacher's top-k next tokens, and training "
                              f"backend {backend!r} does not compute them (no topk_logprobs, contract 2.10)",
                              key="algorithm.distillation.kl_type",
                              hint="use kl_type reverse, or host the teacher on a backend that has topk_logprobs "
                                   "(algorithm.distillation.teacher_training_backend)")
        vocab = int(AutoConfig.from_pretrained(teacher_path).vocab_size)
        if settings.topk_logits_k > vocab:
            raise ConfigError(f"topk_logits_k {settings.topk_logits_k} is more than the teacher's {vocab}-token "
                              "vocabulary", key="algorithm.distillation.topk_logits_k",
                              hint=f"set it to at most {vocab}")
        return int(settings.topk_logits_k)

    def step(self) -> dict[str, float]:
        context = self.context
        core = context.config.core
        assert self.teacher_offload is not None
        prompts, items = context.task.sample(core.algorithm.batch_size)
        start = time.perf_counter()
        context.offload.before_generation()
        sampling = SamplingSettings.from_config(context.config, seed=step_seed(core.algorithm.seed, self.done))
        rollout = self.rollout.run(prompts, items, sampling, core.algorithm.num_generations_per_prompt,
                                   core.policy.max_seq_length)
        timings = {"time/generation": time.perf_counter() - start}

        start = time.perf_counter()
        rows = sum(len(group) for group in rollout.groups)
        batch = samples_to_batch(rollout.groups, torch.zeros(rows))
        context.offload.before_training()
        mask = batch["loss_mask"].to(torch.float32)
        student = context.training.logprobs(batch)
        with self.teacher_offload.scoring() as teacher:  # the teacher routes its own way (not the student's r3)
            if self.topk is None:
                teacher_logprobs = teacher.logprobs(without_routes(batch))
            else:  # forward or mixed KL: the teacher's top-k next tokens, and the student's logprobs of them
                teacher_logprobs, batch["teacher_topk_logprobs"], batch["candidate_ids"] = teacher.topk_logprobs(
                    without_routes(batch), self.topk)
        rewards = torch.tensor(rollout.rewards, dtype=torch.float32)
        batch["advantages"] = with_outcome_advantages(
            reverse_kl_advantages(student, teacher_logprobs, mask), rewards, mask,
            self.settings.outcome_advantage_weight, scale_by_std=core.algorithm.scale_rewards_by_std,
            leave_one_out=core.algorithm.leave_one_out_baseline)
        timings["time/logprobs"] = time.perf_counter() - start

        start = time.perf_counter()
        results = [context.training.train_step(part, self.loss)
                   for part in minibatches(batch, core.algorithm.optimizer_batch_size)]
        timings["time/training"] = time.perf_counter() - start

        start = time.perf_counter()
        context.offload.before_refit()
        send_weights(context.training, context.generation)
        context.offload.after_refit()
        timings["time/refit"] = time.perf_counter() - start

        tokens = float(mask.sum().clamp(min=1.0))
        last = results[-1]
        return {
            "optimizer_step": float(last.step),
            "reverse_kl": float((reverse_kl_k3(student, teacher_logprobs) * mask).sum() / tokens),
            "teacher_logprob": float((teacher_logprobs * mask).sum() / tokens),
            **({} if self.topk is None else {"teacher_topk_mass": float(
                (batch["teacher_topk_logprobs"].exp().sum(dim=-1) * mask).sum() / tokens)}),
            "reward/mean": float(rewards.mean()),
            "reward/max": float(rewards.max()),
            "loss": float(last.loss),
            "grad_norm": float(last.grad_norm),
            "lr": float(last.lr),
            "generated_tokens": tokens,
            **{k: float(v) for k, v in last.metrics.items()  # the backend's (a MoE's expert load among them)
               if not k.startswith(("logprob_mismatch/", "importance_ratio/"))},
            **rollout.metrics,
            **timings,
        }

    def save(self, folder: Path) -> None:
        return None  # the teacher is frozen: the checkpoint is the student's
