"""Evaluation of a policy on the task's held-out prompts: the reward of greedy answers, and over
``eval.num_samples`` sampled answers a prompt, mean@n and pass@k.

- ``eval/greedy``: the mean reward of one greedy answer a prompt (the held-out reward the run
  reports before and after training, on the same prompts and settings);
- ``eval/mean@{n}``: the mean reward of all ``n = eval.num_samples`` sampled answers a prompt;
- ``eval/pass@{k}``: the chance that at least one of ``k = eval.pass_k`` answers is correct, by the
  unbiased estimator over the ``n`` samples drawn, ``1 - C(n - c, k) / C(n, k)`` for ``c`` correct
  ones, averaged over the prompts. An answer is correct when its reward is above
  :data:`CORRECT_ABOVE` (0.5): the tasks' rewards lie in [0, 1], 1 for a right answer, and a
  partial credit (the digit_echo task's share of right tokens) counts once it is more than half.

The samples are drawn at ``eval.temperature`` (else ``policy.generation.temperature``) with the
recipe's other sampling settings and ``algorithm.seed``, so that two evaluations of the same
weights draw the same answers. Both passes go through the run's rollout stage (one turn scored
by the reward, or episodes against the environment): nothing generates here.

In a run (``eval.every_n_steps``) the figures are a row of ``metrics.jsonl`` whose ``phase`` is
``eval`` (keys ``greedy``, ``mean@{n}``, ``pass@{k}``, ``seconds``), which the experiment loggers
name ``eval/...``; ``corerl eval RECIPE CHECKPOINT`` prints them for one checkpoint.

Light to import: validation calls :func:`check_evaluation` without torch.
"""

from __future__ import annotations

import difflib
import math
import time
from collections.abc import Sequence
from typing import Any, NoReturn

import attrs

from corerl.generation.contract import SamplingSettings
from corerl.reporting.phases import EVAL_PHASE  # re-exported

#: an answer whose reward is above this is correct (for pass@k)
CORRECT_ABOVE = 0.5


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from ``n`` samples of which ``c`` are correct: the chance
    that ``k`` of the ``n``, drawn without replacement, hold at least one correct one."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@{k} of {c} correct in {n} samples: need 0 <= c <= n and 1 <= k <= n")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def metric_keys(num_samples: int, pass_k: int | None) -> list[str]:
    """The evaluation row's metrics (without the ``eval/`` prefix), greedy first."""
    return ["greedy", f"mean@{num_samples}", f"pass@{pass_k or num_samples}"]


def metric_names(config: Any) -> list[str]:
    """The evaluation metrics a run of ``config`` logs, as the loggers name them (``eval/greedy``...);
    none without ``eval.every_n_steps``."""
    settings = config.core.eval
    if not settings.every_n_steps:
        return []
    return [f"{EVAL_PHASE}/{key}" for key in metric_keys(settings.num_samples, settings.pass_k)]


@attrs.frozen(kw_only=True)
class EvalPlan:
    """What one evaluation draws: the greedy and sampled settings, ``num_samples`` answers a prompt
    for mean@n, the ``pass_k`` of pass@k, at most ``max_prompts`` held-out prompts (None: all),
    each prompt and completion within ``max_seq_length`` tokens."""

    greedy: SamplingSettings
    sampled: SamplingSettings
    num_samples: int
    pass_k: int
    max_prompts: int | None
    max_seq_length: int

    @classmethod
    def from_config(cls, config: Any) -> EvalPlan:
        """The ``eval`` section of a validated config, over its ``policy.generation`` settings."""
        core = config.core
        settings, generation = core.eval, core.policy.generation
        temperature = settings.temperature if settings.temperature is not None else generation.temperature
        return cls(greedy=greedy_settings(config),
                   sampled=SamplingSettings.from_config(config, temperature=temperature),
                   num_samples=settings.num_samples, pass_k=settings.pass_k or settings.num_samples,
                   max_prompts=settings.max_prompts, max_seq_length=core.policy.max_seq_length)

    @property
    def keys(self) -> list[str]:
        return metric_keys(self.num_samples, self.pass_k)


def greedy_settings(config: Any) -> SamplingSettings:
    """How held-out answers are drawn greedily (the run's held-out reward, ``eval/greedy``): the
    recipe's ``policy.generation`` (``max_new_tokens``, its stop strings and stop ids, as training's
    samples end) at temperature 0."""
    return SamplingSettings.from_config(config, temperature=0.0)


def held_out_rewards(rollout: Any, task: Any, sampling: SamplingSettings, n: int, max_seq_length: int,
                     max_prompts: int | None = None) -> list[list[float]]:
    """The rewards of ``n`` answers to each of the task's held-out prompts (the first
    ``max_prompts``), through ``rollout`` (answers, or episodes, of at most ``max_seq_length`` tokens)."""
    prompts, examples = task.held_out()
    if max_prompts is not None:
        prompts, examples = prompts[:max_prompts], examples[:max_prompts]
    return rollout.run(prompts, examples, sampling, n, max_seq_length).rewards


def greedy_reward(rollout: Any, task: Any, greedy: SamplingSettings, max_seq_length: int,
                  max_prompts: int | None = None) -> float:
    """Mean held-out reward of greedy answers drawn with ``greedy`` (:func:`greedy_settings`)."""
    rewards = held_out_rewards(rollout, task, greedy, 1, max_seq_length, max_prompts)
    return sum(group[0] for group in rewards) / len(rewards)


@attrs.frozen
class Evaluation:
    """One evaluation's figures (keyed as in the metrics row: ``greedy``, ``mean@4``, ``pass@4``),
    over ``prompts`` held-out prompts, and the seconds it took."""

    figures: dict[str, float]
    prompts: int
    seconds: float

    def named(self) -> dict[str, float]:
        """The figures as the loggers name them (``eval/greedy``...)."""
        return {f"{EVAL_PHASE}/{key}": value for key, value in self.figures.items()}


def sampled_figures(rewards: Sequence[Sequence[float]], pass_k: int) -> tuple[float, float]:
    """mean@n (the mean over every answer) and pass@k (averaged over the prompts) of ``rewards``,
    ``n`` answers to each prompt."""
    every = [r for group in rewards for r in group]
    passes = [pass_at_k(len(group), sum(r > CORRECT_ABOVE for r in group), pass_k) for group in rewards]
    return sum(every) / len(every), sum(passes) / len(passes)


def evaluate_policy(rollout: Any, task: Any, plan: EvalPlan) -> Evaluation:
    """Greedy answers, then ``plan.num_samples`` sampled ones, to the held-out prompts, through
    ``rollout`` over a generation engine that holds the weights to evaluate."""
    begin = time.perf_counter()
    greedy = held_out_rewards(rollout, task, plan.greedy, 1, plan.max_seq_length, plan.max_prompts)
    sampled = held_out_rewards(rollout, task, plan.sampled, plan.num_samples, plan.max_seq_length, plan.max_prompts)
    mean, passed = sampled_figures(sampled, plan.pass_k)
    greedy_key, mean_key, pass_key = plan.keys
    figures = {greedy_key: sum(g[0] for g in greedy) / len(greedy), mean_key: mean, pass_key: passed}
    return Evaluation(figures, len(greedy), time.perf_counter() - begin)


def describe(figures: dict[str, float]) -> str:
    """``greedy 0.412  mean@4 0.380  pass@4 0.700``."""
    return "  ".join(f"{key} {value:.3f}" for key, value in figures.items())


# -- validation ----------------------------------------------------------------------------------

def check_evaluation(config: Any, algorithm: Any) -> None:
    """Refuse, in one line naming the key: evaluation during training for an algorithm that samples
    nothing or runs asynchronously, ``eval.at_start`` without ``eval.every_n_steps``,
    ``checkpointing.keep_top_k`` with checkpoints off, and a ``checkpointing.metric_name`` the run
    never logs (an ``eval/`` metric the eval section does not produce, or a near miss of a metric
    the algorithm declares in its :class:`~corerl.registry.PlotSpec`)."""
    from corerl.asynchronous.settings import async_settings
    from corerl.config.tree import origin_of
    from corerl.errors import ConfigError

    core, origins = config.core, config.origins

    def refuse(key: str, message: str, hint: str) -> NoReturn:
        raise ConfigError(message, key=key, source=origin_of(key, origins), hint=hint)

    every = core.eval.every_n_steps
    if every and algorithm is not None and not algorithm.generation:
        refuse("eval.every_n_steps", f"{algorithm.id} samples nothing, so no generation engine answers the held-out "
                                     "prompts during training", "unset eval.every_n_steps (the run still reports its "
                                                                "held-out figures before and after training)")
    if every and async_settings(config).enabled:
        refuse("eval.every_n_steps", "asynchronous GRPO's generation worker runs ahead of training, so it evaluates "
                                     "only before and after training", "unset eval.every_n_steps, or set "
                                                                       "algorithm.async.enabled=false")
    if core.eval.at_start and not every:
        refuse("eval.at_start", "evaluating at step 0 is the first point of the eval.every_n_steps schedule",
               "set eval.every_n_steps (e.g. eval.every_n_steps=10), or unset eval.at_start")
    checkpointing = core.checkpointing
    if checkpointing.keep_top_k is not None and not checkpointing.enabled:
        refuse("checkpointing.keep_top_k", "checkpoints are off, so there is none to keep",
               "set checkpointing.enabled=true, or unset checkpointing.keep_top_k")
    name = checkpointing.metric_name
    evaluated = metric_names(config)
    if name is None or name in evaluated:
        return
    if name.startswith(f"{EVAL_PHASE}/"):
        if not evaluated:
            keys = ", ".join(f"{EVAL_PHASE}/{k}" for k in metric_keys(core.eval.num_samples, core.eval.pass_k))
            refuse("checkpointing.metric_name", f"{name} is logged only when the run evaluates during training",
                   f"set eval.every_n_steps (its metrics: {keys}), or name a training metric such as reward/mean")
        near = difflib.get_close_matches(name, evaluated, n=1, cutoff=0.6)
        refuse("checkpointing.metric_name", f"this run does not log {name} during training",
               (f"did you mean {near[0]}? " if near else "") + f"its eval metrics are {', '.join(evaluated)} "
               "(eval.num_samples and eval.pass_k set the n and k)")
    if algorithm is None:
        return
    declared = _declared_metrics(algorithm)
    bare = name.removeprefix(f"{algorithm.id}/")
    near = difflib.get_close_matches(bare, [*declared, *evaluated], n=1, cutoff=0.8)
    if bare not in declared and near:
        refuse("checkpointing.metric_name", f"{name} is not a metric {algorithm.id} declares", f"did you mean {near[0]}?")


def check_evaluation_chosen(config: Any, chosen: Any) -> None:
    """The validation table's row (:mod:`corerl.config.validation`): :func:`check_evaluation`
    against the chosen algorithm."""
    check_evaluation(config, chosen.algorithm)


def _declared_metrics(algorithm: Any) -> list[str]:
    """The metrics an algorithm says its steps log: what its curves plot, and its losses."""
    plot = getattr(algorithm, "plot", None)
    return [*plot.metrics, *plot.losses] if plot is not None else ["loss"]
