"""The public plugin API: everything a third-party backend, task or reward needs, in one module.

A plugin written against ``corerl.sdk`` alone (and ``corerl.testing.conformance`` in its tests)
keeps working across corerl releases: these names are documented in docs/plugins.md ("The plugin
API") and change only with a deprecation. Everything else under ``corerl`` is internal. Importing
this module imports no engine (no torch): the helpers that need one import it when called.
"""

from __future__ import annotations

from typing import Any

from corerl import component_kinds
from corerl.algorithms.contract import AlgorithmBase, AlgorithmRun, RunServices, StepCountError

# what the first-party backends share with any other (engine-side helpers)
from corerl.checkpoint_safety import load_plain
from corerl.complete_folders import is_complete, write_complete
from corerl.component_kinds import *  # noqa: F403  (registering: hookimpl, CONTRACT_VERSION, the registration classes)
from corerl.config import Config
from corerl.config.checks import parallel_sizes_divide_world
from corerl.config.fields import section, setting
from corerl.distributed.devices import local_gpu_index, runs_here_without_gpu
from corerl.distributed.dispatch import Dispatch, RankLayout
from corerl.distributed.group_backend import WorkerGroupBackend, step_result
from corerl.distributed.placement import dedicated_generation_layout, training_layout
from corerl.distributed.rank_state import barrier
from corerl.distributed.rendezvous import join_process_group
from corerl.distributed.worker_group import LocalWorkerGroup, RayWorkerGroup, free_port
from corerl.environments.contract import Environment as EnvironmentProtocol
from corerl.environments.contract import EnvironmentContext, EnvironmentSettings, EpisodeView, Turn
from corerl.environments.tools import ToolCall, ToolResult, execute, parse_hermes
from corerl.errors import ConfigError, ConfigErrors, EngineNotAvailable, PluginError, RunError
from corerl.failures import checkpoint_errors
from corerl.generation.contract import (
    GenerationEngine,
    ImagePrompt,
    Images,
    Sample,
    SamplingSettings,
    images_of,
)
from corerl.generation.sampling import (
    choose_tokens,
    choose_tokens_per_row,
    cut_at_stop_strings,
    row_generators,
    row_seeds,
)
from corerl.generation.shared_weights import SharedWeightWriter, read_shared
from corerl.import_paths import code_runner_problem, resolve
from corerl.lora.adapter import adapter_tensors, is_adapter_name, lora_enabled, write_adapter
from corerl.lora.weights import AdapterWeights
from corerl.models.facts import check_expert_parallel, check_tensor_parallel, model_shape
from corerl.models.tokenizer import load_tokenizer_folder
from corerl.models.value_model import load_pretrained, model_values, shift_values
from corerl.models.vision import is_vision_language, read_hf_config, vision_token_ids
from corerl.planning.memory import (
    GIB,
    Layout,
    PlanRequest,
    TrainingMemory,
    activation_bytes,
    adam_state_bytes,
    cluster_overrides,
    tensor_parallel_sizes,
)
from corerl.reporting.loggers.contract import LoggerContext, LoggerSettings
from corerl.run.context import RunContext  # what RunServices was typed as before contract 2.15
from corerl.environments.sandbox import SandboxResult
from corerl.training.batching import loss_token_count
from corerl.training.contract import Batch, LossFn, StepResult, TrainingEngine, ValueEngine
from corerl.training.grad_norm import clip_grad_norm
from corerl.training.hf_export import copy_tokenizer, write_hf_checkpoint
from corerl.training.image_rows import image_inputs
from corerl.training.logprobs import (
    TOPK_REQUEST,
    batch_logprobs,
    join_topk,
    model_logprobs,
    picked_logprobs,
    token_logprobs,
)
from corerl.training.memory import move_optimizer_state, optimizer_state_tensors, storage_bytes
from corerl.training.microbatching import MicroBatcher
from corerl.training.moe_router import check_router_replay
from corerl.training.optim import build_optimizer, build_scheduler
from corerl.training.rank_worker import RankWorker
from corerl.training.segment_attention import register as register_segment_attention
from corerl.training.vision_ranks import run_vision_on_every_rank, vision_tower
from corerl.training.weights import CheckpointNaming, EngineWeights, checkpoint_weights

__all__ = [
    # registering: hookimpl, CONTRACT_VERSION and the registration classes come from corerl.component_kinds (below)
    # experiment loggers
    "LoggerContext", "LoggerSettings",
    # environments
    "EnvironmentProtocol", "EnvironmentContext", "EnvironmentSettings", "EpisodeView", "Turn", "ToolCall", "ToolResult",
    "execute", "parse_hermes",
    # algorithms
    "AlgorithmRun", "AlgorithmBase", "RunServices", "RunContext", "samples_to_batch", "minibatches", "step_seed", "StepCountError",
    # configuration
    "Config", "setting", "section",
    # the training contract and its helpers
    "TrainingEngine", "ValueEngine", "StepResult", "Batch", "LossFn", "RankWorker", "WorkerGroupBackend",
    "step_result", "Dispatch", "RankLayout", "LocalWorkerGroup", "RayWorkerGroup", "training_layout", "join_process_group", "MicroBatcher",
    "loss_token_count", "check_router_replay",
    "build_optimizer", "build_scheduler", "clip_grad_norm", "model_logprobs", "model_values", "load_pretrained",
    "EngineWeights", "optimizer_state_tensors", "storage_bytes",
    # weights under their checkpoint names (a MoE's fused experts back to per-expert tensors)
    "CheckpointNaming", "checkpoint_weights",
    # generation
    "GenerationEngine", "Sample", "SamplingSettings", "Images", "ImagePrompt", "images_of", "image_inputs",
    "is_vision_language", "read_hf_config", "vision_token_ids", "vision_tower", "run_vision_on_every_rank",
    # LoRA (policy.lora): adapter names, the refit's adapter, the adapter folder
    "lora_enabled", "is_adapter_name", "adapter_tensors", "AdapterWeights", "write_adapter",
    # sandboxes (corerl_register_sandboxes): what a runner's run returns
    "SandboxResult",
    # errors a plugin raises, and checkpoint failures as one of them
    "ConfigError", "ConfigErrors", "EngineNotAvailable", "PluginError", "RunError", "checkpoint_errors",
    # memory models for `corerl plan`
    "GIB", "Layout", "PlanRequest", "TrainingMemory", "activation_bytes", "adam_state_bytes", "cluster_overrides",
    "tensor_parallel_sizes",
    # engine-side helpers the first-party backends use
    "load_plain", "is_complete", "write_complete", "parallel_sizes_divide_world", "resolve", "local_gpu_index",
    "runs_here_without_gpu", "dedicated_generation_layout", "barrier", "free_port", "choose_tokens",
    "choose_tokens_per_row", "row_generators", "row_seeds",
    "cut_at_stop_strings", "SharedWeightWriter", "read_shared", "code_runner_problem", "shift_values",
    "copy_tokenizer", "write_hf_checkpoint", "load_tokenizer_folder", "model_shape", "check_tensor_parallel", "check_expert_parallel", "token_logprobs", "picked_logprobs", "TOPK_REQUEST", "batch_logprobs", "join_topk", "move_optimizer_state", "register_segment_attention",
]
# the one list of registering names, which `corerl` exports too
__all__ += component_kinds.__all__


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
