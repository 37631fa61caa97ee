"""Reward models: a Bradley-Terry model trained from preference pairs (``algorithm.name: rm``).

The policy's training backend is built in the critic role: a causal model with a one-label value
head (:mod:`corerl.models.value_model`). A sequence's score is the head's output at its last token,
which the value engine reports one position later (position ``t`` holds the value of
``input_ids[:t]``): so each row gets one extra token after the response, whose value slot is the
score and the only loss token (the score slot's helpers, :func:`slot_token`, :func:`last_token_mask`
and :func:`slot_scores`, live in :mod:`corerl.environments.model_rewards`, which scores samples by the same
convention, and are re-exported here). The loss of a pair is ``-log sigmoid(score_chosen - score_rejected)``.

Exported as a Hugging Face sequence-classification checkpoint (``<run dir>/reward_model``): it
pools the last token of prompt + response, the same hidden state, and its score layer has no bias,
so its scores differ from training's by the head's bias, a constant a Bradley-Terry model ignores.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import torch
import torch.nn.functional as F

from corerl.algorithms.contract import AlgorithmBase, RunServices
from corerl.algorithms.dpo_math import pair_sums, preference_batch
from corerl.environments.model_rewards import last_token_mask, slot_scores, slot_token

if TYPE_CHECKING:
    from corerl.tasks.preferences import PreferencePair
    from corerl.training.contract import Batch


def scoring_batch(pairs: Sequence[PreferencePair], end_token: int) -> Batch:
    """DPO's adjacent (chosen, rejected) rows, each with ``end_token`` after its response and the
    loss mask on that token alone: its value slot holds the score of prompt + response."""
    batch = preference_batch([(prompt, [*chosen, end_token], [*rejected, end_token])
                              for prompt, chosen, rejected in pairs])
    batch["loss_mask"] = last_token_mask(batch["attention_mask"])
    return batch


@attrs.frozen
class BradleyTerryLoss:
    """``-log sigmoid(score_chosen - score_rejected)`` per pair, summed over a micro-batch's pairs
    and divided by ``pairs`` (the step's pair count), so micro-batches and ranks sum to the step's
    mean; metrics: the pairwise accuracy (a tie counts half) and the mean margin."""

    pairs: int = 0

    def __call__(self, values: torch.Tensor, batch: dict[str, torch.Tensor],
                 normaliser: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if self.pairs < 1:
            raise ValueError("BradleyTerryLoss.pairs must be the step's pair count (attrs.evolve(loss, pairs=n))")
        scores = pair_sums(values, batch)
        margin = scores.chosen - scores.rejected
        loss = -F.logsigmoid(margin).sum() / self.pairs + 0.0 * values.sum()
        detached = margin.detach()
        right = (detached > 0).to(values.dtype) + 0.5 * (detached == 0).to(values.dtype)
        return loss, {"pairwise_accuracy": right.sum() / self.pairs, "score_margin": detached.sum() / self.pairs}


def score_pairs(engine: Any, pairs: Sequence[PreferencePair], end_token: int, chunk: int = 64) -> torch.Tensor:
    """``[len(pairs), 2]``: the scores of each pair's chosen and rejected response."""
    out = []
    for start in range(0, len(pairs), chunk):
        out.append(slot_scores(engine, scoring_batch(pairs[start:start + chunk], end_token)).reshape(-1, 2))
    return torch.cat(out) if out else torch.zeros(0, 2)


def pairwise_accuracy(scores: torch.Tensor) -> float:
    """The share of pairs whose chosen response scores higher (a tie counts half)."""
    if scores.shape[0] == 0:
        return 0.0
    return float(((scores[:, 0] > scores[:, 1]).float() + 0.5 * (scores[:, 0] == scores[:, 1]).float()).mean())


def export_sequence_classifier(value_model: str | Path, out: str | Path) -> None:
    """Rewrite a value model (one-label token classifier) as a one-label sequence classifier of
    the same family: the same backbone, the head's weight (its bias dropped: see the module)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    from corerl.models.hf_save import save_pretrained
    from corerl.models.value_model import load_pretrained

    token_model = load_pretrained(str(value_model), role="critic")
    config = AutoConfig.from_pretrained(str(value_model))
    tokenizer = AutoTokenizer.from_pretrained(str(value_model))
    config.num_labels = 1
    config.pad_token_id = tokenizer.pad_token_id
    config.architectures = None
    model = AutoModelForSequenceClassification.from_config(config)
    state = {name: tensor for name, tensor in token_model.state_dict().items() if not name.endswith("score.bias")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"value model {value_model} does not map onto {type(model).__name__}: "
                           f"missing {missing}, unexpected {unexpected}")
    save_pretrained(model, str(out))
    tokenizer.save_pretrained(str(out))


class RewardModelAlgorithm(AlgorithmBase):
    """``algorithm.name: rm``: Bradley-Terry steps over the task's preference pairs (``algorithm.batch_size``
    a step) on a value head over the policy's model; held-out figure: pairwise accuracy. Exports
    ``<run dir>/reward_model``, a sequence-classification checkpoint (``final/`` is the value
    model itself, which PPO's ``critic.model_name`` also takes)."""

    name = "rm"
    measure = "pairwise_accuracy"

    def __init__(self, context: RunServices) -> None:
        super().__init__(context)
        self.loss = BradleyTerryLoss()
        self.pairs: list[Any] = []

    @property
    def end_token(self) -> int:
        return slot_token(self.context.tokenizer)

    def begin(self) -> None:
        self.pairs = self.context.task.train_pairs()

    def step(self) -> dict[str, float]:
        indices = self.context.task.draw(self.context.config.core.algorithm.batch_size)
        pairs = [self.pairs[i] for i in indices]
        start = time.perf_counter()
        batch = scoring_batch(pairs, self.end_token)
        result = self.context.training.train_step(batch, attrs.evolve(self.loss, pairs=len(pairs)))
        return {"optimizer_step": float(result.step), "loss": float(result.loss), "grad_norm": float(result.grad_norm),
                "lr": float(result.lr), "pairs": float(len(pairs)),
                **{key: float(value) for key, value in result.metrics.items()},
                "time/training": time.perf_counter() - start}

    def held_out(self) -> dict[str, float]:
        scores = score_pairs(self.context.training, self.context.task.held_out_pairs(), self.end_token)
        margin = float((scores[:, 0] - scores[:, 1]).mean()) if scores.shape[0] else 0.0
        return {"pairwise_accuracy": pairwise_accuracy(scores), "score_margin": margin}

    def export(self, run_dir: Path) -> list[str]:
        from corerl.complete_folders import write_complete

        write_complete(run_dir / "reward_model",
                       lambda work: export_sequence_classifier(run_dir / "final", work))
        return [f"{run_dir / 'reward_model'} (the reward model, a sequence-classification checkpoint)"]
