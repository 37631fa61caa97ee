"""What an algorithm (``corerl_register_algorithms``) needs beyond :mod:`corerl.sdk.registering`:
the algorithm contract, the run services its factory gets, and the batch helpers. Importing this
module imports no engine: the helpers import torch when called.

``RunContext``, what the services were typed as before contract 2.15, stays importable from
:mod:`corerl.sdk` only."""

from __future__ import annotations

from typing import Any

from corerl.algorithms.contract import AlgorithmBase, AlgorithmRun, RunServices, StepCountError
from corerl.generation.contract import Sample, SamplingSettings
from corerl.training.contract import Batch, LossFn, StepResult

__all__ = [
    # the algorithm contract, its defaults, the run's services, the error of a wrong step count
    "AlgorithmRun", "AlgorithmBase", "RunServices", "StepCountError",
    # batches: from sampled groups, cut into mini-batches, a step's sampling seed
    "samples_to_batch", "minibatches", "step_seed",
    # what an algorithm hands the engines and gets back
    "Sample", "SamplingSettings", "Batch", "LossFn", "StepResult",
]


def samples_to_batch(groups: Any, advantages: Any) -> Any:
    """Training rows from sampled groups: right-padded prompt + completion, a loss mask on the
    completion, each row's advantage on every token (``advantages``: one per sample, in group
    order) and the generation engine's logprobs (``gen_logprobs``). Imports torch when called."""
    from corerl.algorithms.batches import samples_to_batch as build

    return build(groups, advantages)


def minibatches(batch: Any, rows: int | None, weights: Any = None) -> Any:
    """The batch cut into consecutive mini-batches of ``rows`` rows, one optimizer step each
    (``rows`` must divide the batch; with a loss's ``aggregation_weights``, each part gets its
    own). Imports torch when called."""
    from corerl.algorithms.batches import minibatches as cut

    return cut(batch, rows, weights)


def step_seed(seed: int, step: int) -> int:
    """The sampling seed of one step (reproducible, far from the seeds of other steps)."""
    from corerl.generation.seeds import step_seed as seed_of

    return seed_of(seed, step)
