"""Direct preference optimisation over any training backend (only its contract is used).

Each step takes ``algorithm.batch_size`` (prompt, chosen, rejected) pairs, lays them out as
adjacent rows with per-token pair fields (:func:`corerl.algorithms.dpo_math.preference_batch`;
the micro-batcher keeps both rows of a pair together on one rank and in one micro-batch) and
runs one optimizer step of :class:`~corerl.algorithms.dpo_math.DPOLoss`.

The reference's sequence logprobs come from :class:`ReferenceScores`: either precomputed for
every training and held-out pair with the starting weights (the default: no second model), or
from a frozen copy of the model that scores each batch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import torch

from corerl.algorithms.contract import AlgorithmBase, RunServices
from corerl.algorithms.dpo_math import DPOLoss, preference_batch

if TYPE_CHECKING:
    from corerl.tasks.preferences import PreferencePair
    from corerl.training.contract import Batch, TrainingEngine


def response_sums(logprobs: torch.Tensor, batch: Batch) -> torch.Tensor:
    """``[pairs, 2]``: the summed logprobs of each pair's chosen and rejected response."""
    sums = (logprobs * batch["loss_mask"]).sum(dim=1)
    return sums.reshape(-1, 2)


def score_pairs(engine: TrainingEngine, pairs: Sequence[PreferencePair], chunk: int = 64) -> torch.Tensor:
    """``[len(pairs), 2]`` sequence logprobs of chosen and rejected under ``engine``'s weights,
    in chunks of ``chunk`` pairs."""
    out = [response_sums(engine.logprobs(batch), batch)
           for batch in (preference_batch(pairs[i:i + chunk]) for i in range(0, len(pairs), chunk))]
    return torch.cat(out) if out else torch.zeros(0, 2)


def with_reference(batch: Batch, sums: torch.Tensor) -> Batch:
    """``batch`` with ``ref_logprobs``: each response's reference sum on its first loss token
    (so the loss's sum over loss tokens gives it back exactly, padded or packed)."""
    mask = batch["loss_mask"]
    first = mask.float().argmax(dim=1)
    ref = torch.zeros(mask.shape, dtype=torch.float32)
    ref[torch.arange(mask.shape[0]), first] = sums.reshape(-1).float()
    return {**batch, "ref_logprobs": ref}


def preference_metrics(policy: torch.Tensor, reference: torch.Tensor, beta: float) -> dict[str, float]:
    """Held-out figures from ``[pairs, 2]`` sequence logprobs: ``preference_accuracy`` (the policy
    gives the chosen response the higher logprob; a tie counts half), the implicit reward accuracy
    and margin (``beta * (policy - reference)``, chosen minus rejected)."""
    if policy.shape[0] == 0:
        return {"preference_accuracy": 0.0, "reward_accuracy": 0.0, "reward_margin": 0.0}
    ranked = (policy[:, 0] > policy[:, 1]).float() + 0.5 * (policy[:, 0] == policy[:, 1]).float()
    rewards = beta * (policy - reference)
    margin = rewards[:, 0] - rewards[:, 1]
    return {"preference_accuracy": float(ranked.mean()), "reward_accuracy": float((margin > 0).float().mean()),
            "reward_margin": float(margin.mean())}


@attrs.define
class ReferenceScores:
    """The reference's sequence logprobs: tables of every training and held-out pair scored once
    (``train``, ``held_out``: ``[pairs, 2]``), or a frozen engine that scores each batch
    (``engine``, offloaded between uses by ``offload`` when given)."""

    train: torch.Tensor | None = None
    held_out: torch.Tensor | None = None
    engine: Any = None
    offload: Any = None

    def for_pairs(self, indices: Sequence[int], pairs: Sequence[PreferencePair]) -> torch.Tensor:
        if self.train is not None:
            return self.train[list(indices)]
        return self._score(pairs)

    def for_held_out(self, pairs: Sequence[PreferencePair]) -> torch.Tensor:
        return self.held_out if self.held_out is not None else self._score(pairs)

    def _score(self, pairs: Sequence[PreferencePair]) -> torch.Tensor:
        if self.offload is not None:
            with self.offload.scoring() as engine:
                return score_pairs(engine, pairs)
        return score_pairs(self.engine, pairs)


@attrs.define
class DPO:
    """DPO over a training backend; call :meth:`step` per batch of pairs."""

    training: TrainingEngine
    loss: DPOLoss
    reference: ReferenceScores
    steps_done: int = 0

    @staticmethod
    def loss_from_config(settings: Any) -> DPOLoss:
        """The :class:`DPOLoss` of ``algorithm.dpo``."""
        return DPOLoss(beta=settings.beta, label_smoothing=settings.label_smoothing, ipo=settings.loss_type == "ipo",
                       sft_weight=settings.sft_weight, preference_average=settings.preference_average_log_probs,
                       sft_average=settings.sft_average_log_probs, preference_weight=settings.preference_weight)

    def step(self, indices: Sequence[int], pairs: Sequence[PreferencePair]) -> dict[str, float]:
        """One optimizer step on ``pairs`` (``indices``: their places in the task's training pairs)."""
        start = time.perf_counter()
        batch = with_reference(preference_batch(pairs), self.reference.for_pairs(indices, pairs))
        scored = time.perf_counter()
        result = self.training.train_step(batch, attrs.evolve(self.loss, pairs=len(pairs)))
        done = time.perf_counter()
        self.steps_done += 1
        return {
            "optimizer_step": float(result.step), "loss": float(result.loss), "grad_norm": float(result.grad_norm),
            "lr": float(result.lr), "tokens": float(batch["loss_mask"].sum()), "pairs": float(len(pairs)),
            **{key: float(value) for key, value in result.metrics.items()},
            "time/reference": scored - start, "time/training": done - scored,
        }


class DPOAlgorithm(AlgorithmBase):
    """``algorithm.name: dpo``: steps over the task's preference pairs; the reference is either
    every pair scored once with the starting weights (``algorithm.dpo.precompute_reference_logprobs``,
    kept in ``<run dir>/reference_logprobs``) or a frozen copy scoring each batch. Samples
    nothing: no generation backend is started. Held-out figures: preference accuracy first."""

    name = "dpo"
    measure = "preference_accuracy"

    def __init__(self, context: RunServices) -> None:
        super().__init__(context)
        self.dpo: DPO | None = None

    def begin(self) -> None:
        context = self.context
        settings = context.config.section("algorithm.dpo")
        if settings.precompute_reference_logprobs:
            reference = self.precomputed_reference()
        else:
            engine, offload = context.start_reference()
            reference = ReferenceScores(engine=engine, offload=offload)
        self.dpo = DPO(context.training, DPO.loss_from_config(settings), reference, steps_done=self.done)
        self.pairs = context.task.train_pairs()

    def step(self) -> dict[str, float]:
        assert self.dpo is not None
        indices = self.context.task.draw(self.context.config.core.algorithm.batch_size)
        return self.dpo.step(indices, [self.pairs[i] for i in indices])

    def held_out(self) -> dict[str, float]:
        """Before DPO starts the policy is its own reference."""
        pairs = self.context.task.held_out_pairs()
        policy = score_pairs(self.context.training, pairs)
        reference = self.dpo.reference.for_held_out(pairs) if self.dpo is not None else policy
        return preference_metrics(policy, reference, self.context.config.section("algorithm.dpo").beta)

    def precomputed_reference(self) -> ReferenceScores:
        """Every training and held-out pair scored with the weights DPO starts from, written once
        to ``<run dir>/reference_logprobs`` (a resumed run reads it back: its weights have moved)."""
        from safetensors.torch import load_file, save_file

        from corerl.complete_folders import is_complete, recover, write_complete
        from corerl.errors import RunError

        context = self.context
        folder = context.run_dir / "reference_logprobs"
        recover(folder)
        train, held = context.task.train_pairs(), context.task.held_out_pairs()
        if not is_complete(folder):
            if self.done:
                raise RunError(f"{folder} is missing, and this run has trained past the weights that scored it",
                               key="algorithm.dpo.precompute_reference_logprobs",
                               hint="start the run over under a new run.name")
            begin = time.perf_counter()
            with context.console.status(f"scoring {len(train)} training and {len(held)} held-out pairs with the "
                                        "reference (the starting weights)"):
                scores = {"train": score_pairs(context.training, train), "held_out": score_pairs(context.training, held)}
            write_complete(folder, lambda work: save_file(scores, str(work / "scores.safetensors")))
            context.console.print(f"reference: scored {len(train)} training and {len(held)} held-out pairs in "
                                  f"{time.perf_counter() - begin:.1f} s")
        scores = load_file(str(folder / "scores.safetensors"))
        if scores["train"].shape[0] != len(train) or scores["held_out"].shape[0] != len(held):
            raise RunError(f"{folder} scored {scores['train'].shape[0]} training and {scores['held_out'].shape[0]} "
                           f"held-out pairs, and the task now has {len(train)} and {len(held)}", key="data.train_files",
                           hint="resume with the data the run started with, or start over under a new run.name")
        return ReferenceScores(train=scores["train"], held_out=scores["held_out"])
