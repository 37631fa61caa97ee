"""The public plugin API: everything a third-party backend, task or reward needs, in one module.

A plugin written against ``corerl.sdk`` alone (and ``corerl.testing.conformance`` in its tests)
keeps working across corerl releases: these names are documented in docs/plugins.md ("The plugin
API") and change only with a deprecation. Everything else under ``corerl`` is internal. Importing
this module imports no engine (no torch): the helpers that need one import it when called.
"""

from __future__ import annotations

from typing import Any

from corerl.algorithms.contract import AlgorithmBase, AlgorithmRun
from corerl.config import Config
from corerl.config.fields import section, setting
from corerl.distributed.group_backend import WorkerGroupBackend, step_result
from corerl.distributed.placement import training_layout
from corerl.distributed.rendezvous import join_process_group
from corerl.distributed.worker_group import LocalWorkerGroup, RayWorkerGroup
from corerl.errors import ConfigError, ConfigErrors, EngineNotAvailable, RunError
from corerl.failures import checkpoint_errors
from corerl.generation.contract import GenerationEngine, Sample, SamplingSettings
from corerl.hookspecs import CONTRACT_VERSION, hookimpl
from corerl.models.value_model import load_pretrained, model_values
from corerl.registry import (
    Algorithm,
    Command,
    GenerationBackend,
    MemoryModel,
    OffloadPolicy,
    PlotSpec,
    Preset,
    Reward,
    SequencePacker,
    Task,
    TrainingBackend,
)
from corerl.run_context import RunContext
from corerl.training.batching import loss_token_count
from corerl.training.contract import Batch, LossFn, StepResult, TrainingEngine, ValueEngine
from corerl.training.grad_norm import clip_grad_norm
from corerl.training.logprobs import model_logprobs
from corerl.training.memory import optimizer_state_tensors, storage_bytes
from corerl.training.microbatching import MicroBatcher
from corerl.training.optim import build_optimizer, build_scheduler
from corerl.training.rank_worker import RankWorker
from corerl.training.weights import EngineWeights

__all__ = [
    # registering
    "hookimpl", "CONTRACT_VERSION", "TrainingBackend", "GenerationBackend", "SequencePacker", "OffloadPolicy", "Task", "Reward",
    "Command", "Preset", "MemoryModel", "Algorithm", "PlotSpec",
    # algorithms
    "AlgorithmRun", "AlgorithmBase", "RunContext", "samples_to_batch", "step_seed",
    # configuration
    "Config", "setting", "section",
    # the training contract and its helpers
    "TrainingEngine", "ValueEngine", "StepResult", "Batch", "LossFn", "RankWorker", "WorkerGroupBackend",
    "step_result", "LocalWorkerGroup", "RayWorkerGroup", "training_layout", "join_process_group", "MicroBatcher",
    "loss_token_count",
    "build_optimizer", "build_scheduler", "clip_grad_norm", "model_logprobs", "model_values", "load_pretrained",
    "EngineWeights", "optimizer_state_tensors", "storage_bytes",
    # generation
    "GenerationEngine", "Sample", "SamplingSettings",
    # errors a plugin raises, and checkpoint failures as one of them
    "ConfigError", "ConfigErrors", "EngineNotAvailable", "RunError", "checkpoint_errors",
]


def samples_to_batch(groups: Any, advantages: Any) -> Any:
    """Training rows from sampled groups: right-padded prompt + completion, a loss mask on the
    completion, each row's advantage on every token (``advantages``: one per sample, in group
    order) and the generation engine's logprobs (``gen_logprobs``). Imports torch when called."""
    from corerl.algorithms.grpo import samples_to_batch as build

    return build(groups, advantages)


def step_seed(seed: int, step: int) -> int:
    """The sampling seed of one step (reproducible, far from the seeds of other steps)."""
    from corerl.algorithms.grpo import step_seed as seed_of

    return seed_of(seed, step)
