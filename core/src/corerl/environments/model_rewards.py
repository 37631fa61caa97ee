"""Rewards from models (the ``reward_model`` section): a Bradley-Terry reward model served as a
frozen value engine, or an LLM judge, scoring a step's samples in batches instead of the task's
reward. Only training's rollouts are scored this way: held-out figures and ``eval`` keep the
task's own reward, so they measure the task, not the reward model's opinion of it.

- ``bradley_terry``: ``reward_model.model_name`` is an ``rm`` run's ``final/`` (a one-label token
  classifier) or a Hugging Face sequence-classification checkpoint (its ``reward_model/``, or a
  published one), turned once into the former. It runs on the policy's training backend in the
  critic role; a sample's reward is the value slot after its completion (see
  :mod:`corerl.algorithms.reward_model`): the score of prompt + completion.
- ``llm_judge``: ``reward_model.judge_template`` filled with the decoded prompt and completion is
  sampled greedily by a generation engine (the policy's own, or ``model_name`` on the policy's
  generation backend); the first number ``judge_pattern`` finds, over ``judge_max_score``, is the
  reward (clamped to [0, 1]); an answer without one scores 0 and is counted.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from corerl.environments.rollout import Rollout
from corerl.generation.contract import Sample, SamplingSettings

if TYPE_CHECKING:
    import torch

    from corerl.training.contract import Batch


def as_value_model(checkpoint: str, folder: Path) -> str:
    """``checkpoint`` as a one-label token classifier: as it is when it is one, else a
    sequence classifier's backbone and score weight written once to ``folder``."""
    from corerl.complete_folders import write_once
    from corerl.models.value_model import is_value_model

    if is_value_model(checkpoint):
        return checkpoint
    return str(write_once(folder, lambda work: _sequence_to_token_classifier(checkpoint, work)))


def _sequence_to_token_classifier(checkpoint: str, out: Path) -> None:
    from transformers import (
        AutoConfig,
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
        AutoTokenizer,
    )

    from corerl.errors import ConfigError
    from corerl.models.hf_save import save_pretrained

    config = AutoConfig.from_pretrained(checkpoint)
    if getattr(config, "num_labels", None) != 1:
        raise ConfigError(f"{checkpoint} is not a one-score reward model (num_labels is {config.num_labels})",
                          key="reward_model.model_name",
                          hint="give an rm run's final/ or reward_model/, or a sequence classifier with one label")
    source = AutoModelForSequenceClassification.from_pretrained(checkpoint)
    config.architectures = None
    target = AutoModelForTokenClassification.from_config(config)
    state = source.state_dict()
    if getattr(target.score, "bias", None) is not None:
        state["score.bias"] = target.score.bias.detach().new_zeros(target.score.bias.shape)
    target.load_state_dict(state, strict=True)
    save_pretrained(target, str(out))
    AutoTokenizer.from_pretrained(checkpoint).save_pretrained(str(out))


# -- the score slot: one convention for the rm algorithm's training rows (corerl.algorithms.reward_model,
# which re-exports these) and the scoring of samples below; torch is imported when called


def last_token_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """1 on each right-padded row's last token (its score slot), 0 elsewhere."""
    import torch

    mask = torch.zeros_like(attention_mask)
    mask[torch.arange(mask.shape[0]), attention_mask.sum(dim=1) - 1] = 1
    return mask


def slot_token(tokenizer: Any) -> int:
    """The token after a response whose value slot holds its score: end-of-sequence, else padding."""
    token = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.pad_token_id
    return int(token if token is not None else 0)


def slot_scores(engine: Any, batch: Batch) -> torch.Tensor:
    """``[B]``: each row's value at its score slot (``batch["loss_mask"]``) under a value engine."""
    return (engine.values(batch) * batch["loss_mask"]).sum(dim=1)


@attrs.define
class ValueModelScorer:
    """A frozen value engine, behind its :class:`~corerl.offload.ReferenceOffload`, scoring prompt +
    completion rows (``rows`` at a time) at their score slot."""

    offload: Any
    end_token: int
    rows: int = 64

    def row(self, sample: Sample) -> list[int]:
        """Prompt, completion and the slot token, as the reward model's training rows were made
        (:func:`corerl.algorithms.reward_model.scoring_batch`)."""
        return [*sample.prompt_ids, *sample.completion_ids, self.end_token]

    def score(self, groups: Sequence[Sequence[Sample]], items: Sequence[Any]) -> list[list[float]]:
        from corerl.training.batching import right_pad

        samples = [s for group in groups for s in group]
        scores: list[float] = []
        for start in range(0, len(samples), self.rows):
            input_ids, attention = right_pad([self.row(s) for s in samples[start:start + self.rows]])
            batch = {"input_ids": input_ids, "attention_mask": attention, "loss_mask": last_token_mask(attention)}
            with self.offload.scoring() as engine:
                scores += slot_scores(engine, batch).tolist()
        return _regroup(scores, groups)


@attrs.define
class JudgeScorer:
    """A generation engine asked, greedily, to grade each completion."""

    generation: Any
    tokenizer: Any
    template: str
    pattern: str
    max_score: float
    max_new_tokens: int
    max_length: int | None = None  # the judge engine's longest sequence (policy.max_seq_length)
    unparsed: int = 0

    def prompt(self, sample: Sample) -> list[int]:
        text = self.template.format(prompt=self.tokenizer.decode(sample.prompt_ids, skip_special_tokens=True),
                                    response=self.tokenizer.decode(sample.completion_ids, skip_special_tokens=True))
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def grade(self, text: str) -> float | None:
        found = re.search(self.pattern, text)
        if found is None:
            return None
        try:
            value = float(found.group(1) if found.groups() else found.group(0))
        except ValueError:
            return None
        return min(1.0, max(0.0, value / self.max_score))

    def score(self, groups: Sequence[Sequence[Sample]], items: Sequence[Any]) -> list[list[float]]:
        samples = [s for group in groups for s in group]
        eos = self.tokenizer.eos_token_id
        sampling = SamplingSettings(max_new_tokens=self.max_new_tokens, temperature=0.0,
                                    stop_token_ids=(eos,) if eos is not None else ())
        prompts = [self.prompt(s) for s in samples]
        longest = max((len(p) for p in prompts), default=0)
        if self.max_length is not None and longest + self.max_new_tokens > self.max_length:
            from corerl.errors import RunError

            raise RunError(f"a judge prompt of {longest} tokens and {self.max_new_tokens} for its grade exceed the "
                           f"judge's {self.max_length}-token sequences", key="reward_model.judge_template",
                           hint="shorten the template, lower reward_model.judge_max_new_tokens or raise "
                                "policy.max_seq_length")
        answers = self.generation.generate(prompts, sampling, n=1)
        scores = []
        for (answer,) in answers:
            grade = self.grade(self.tokenizer.decode(answer.completion_ids, skip_special_tokens=True))
            self.unparsed += grade is None
            scores.append(0.0 if grade is None else grade)
        return _regroup(scores, groups)


def _regroup(flat: list[float], groups: Sequence[Sequence[Any]]) -> list[list[float]]:
    out, start = [], 0
    for group in groups:
        out.append(flat[start:start + len(group)])
        start += len(group)
    return out


@attrs.define
class ModelScoredRollout:
    """``inner``'s samples (scored by the task's reward), rescored by ``scorer`` in one batch; the
    task's reward is kept as the ``task_reward/mean`` metric."""

    inner: Any
    scorer: Any

    def run(self, prompts: Sequence[Sequence[int]], items: Sequence[Any], sampling: SamplingSettings, n: int,
            max_seq_length: int) -> Rollout:
        rollout = self.inner.run(prompts, items, sampling, n, max_seq_length)
        task = [r for group in rollout.rewards for r in group]
        rewards = self.scorer.score(rollout.groups, items)
        metrics = {**rollout.metrics, "task_reward/mean": sum(task) / max(1, len(task))}
        if isinstance(self.scorer, JudgeScorer):
            metrics["reward_model/unparsed"] = float(self.scorer.unparsed)
        return Rollout(rollout.groups, rewards, metrics)


def check_reward_model(config: Any, algorithm: Any) -> None:
    """Refuses, in one line, a ``reward_model`` that nothing would read: for an algorithm that
    samples nothing, or whose rollouts come from the asynchronous loop (not rescored)."""
    from corerl.config.async_section import async_settings
    from corerl.errors import ConfigError

    if config.core.reward_model.kind is None or algorithm is None:
        return
    if not algorithm.generation:
        raise ConfigError(f"algorithm {algorithm.id!r} samples nothing for a reward model to score",
                          key="reward_model.kind", hint="unset reward_model.kind, or use grpo or ppo")
    if async_settings(config).enabled:
        raise ConfigError("the asynchronous loop's rollouts are scored by the task's reward, not rescored by a "
                          "reward model", key="reward_model.kind",
                          hint="set algorithm.async.enabled=false, or unset reward_model.kind")


def check_reward_model_chosen(config: Any, chosen: Any) -> None:
    """The validation table's row (:mod:`corerl.config.validation`): :func:`check_reward_model`
    against the chosen algorithm."""
    check_reward_model(config, chosen.algorithm)
