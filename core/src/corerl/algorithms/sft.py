"""Supervised fine-tuning: masked next-token loss on (prompt, response) pairs, over any
training backend (only its contract is used). Used for warm starts before GRPO and for
``algorithm.name: sft`` runs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs
import torch

from corerl.algorithms.batches import pairs_to_batch
from corerl.algorithms.contract import AlgorithmBase, RunServices

if TYPE_CHECKING:
    from corerl.training.contract import TrainingEngine


#: the largest loss perplexity exponentiates (exp(20) ~ 4.9e8): an early, unstable step's loss does not overflow
PERPLEXITY_LOSS_CAP = 20.0


def perplexity(loss: float) -> float:
    """A step's perplexity: ``exp`` of its mean token loss (:class:`SFTLoss`), the loss capped at
    :data:`PERPLEXITY_LOSS_CAP` (as SkyRL's PerplexityLogger callback logs it); NaN stays NaN."""
    return loss if math.isnan(loss) else math.exp(min(loss, PERPLEXITY_LOSS_CAP))


@attrs.frozen
class SFTLoss:
    """Mean negative log-likelihood of the response tokens: the sum over loss tokens divided by
    the number of loss tokens in the whole step (picklable, for the workers)."""

    def __call__(
        self, logprobs: torch.Tensor, batch: dict[str, torch.Tensor], normaliser: float
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mask = batch["loss_mask"].to(logprobs.dtype)
        return -(logprobs * mask).sum() / normaliser, {}


@attrs.define
class SFT:
    """SFT over a training backend; call :meth:`step` per batch of demonstrations. Each step's
    metrics include ``perplexity``, ``exp`` of its loss (:func:`perplexity`)."""

    training: TrainingEngine
    loss: SFTLoss = attrs.field(factory=SFTLoss)
    steps_done: int = 0

    def step(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> dict[str, float]:
        """One optimizer step; returns its metrics (timings in seconds)."""
        batch = pairs_to_batch(pairs)
        start = time.perf_counter()
        result = self.training.train_step(batch, self.loss)
        elapsed = time.perf_counter() - start
        self.steps_done += 1
        loss = float(result.loss)
        return {
            "optimizer_step": float(result.step),
            "loss": loss,
            "perplexity": perplexity(loss),
            "grad_norm": float(result.grad_norm),
            "lr": float(result.lr),
            "tokens": float(batch["loss_mask"].sum()),
            "time/training": elapsed,
            **{key: float(value) for key, value in result.metrics.items()},  # what the backend reports (MoE routers)
        }


class SFTAlgorithm(AlgorithmBase):
    """``algorithm.name: sft`` (and the ``sft`` section's warm start before another algorithm):
    each step draws demonstrations from the task (a preference task's chosen responses) and
    takes one optimizer step; held-out figures come from greedy answers, after a refit."""

    name = "sft"

    def __init__(self, context: RunServices, warm_start: bool = False) -> None:
        super().__init__(context)
        core = context.config.core
        self.total = core.sft.max_steps if warm_start else core.algorithm.max_steps
        self.batch_size = core.sft.batch_size if warm_start else core.algorithm.batch_size
        self.sft = SFT(context.training, steps_done=self.done)  # over the started policy engine
        self.refitted = True

    def step(self) -> dict[str, float]:
        context = self.context
        context.offload.before_training()
        self.refitted = False
        if not hasattr(context.task, "demonstrations"):  # a preference task: its chosen responses
            train = context.task.train_pairs()
            return self.sft.step([train[i][:2] for i in context.task.draw(self.batch_size)])
        return self.sft.step(context.task.demonstrations(self.batch_size))

    def held_out(self) -> dict[str, float]:
        if not self.refitted:  # SFT steps do not refit: the generation engine gets the weights now
            self.context.refit()
            self.refitted = True
        return super().held_out()
