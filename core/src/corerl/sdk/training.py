"""What a training backend (``corerl_register_training_backends``), and its memory model for
``corerl plan`` (``corerl_register_memory_models``), need beyond :mod:`corerl.sdk.registering`: the
training contract, the rank-side template and the driver-side base, worker groups and dispatch,
micro-batching, optimizers, logprobs and values, weights and checkpoints, LoRA, vision, and the
engine-side helpers the first-party backends share. Importing this module imports no engine."""

from __future__ import annotations

from corerl.checkpoint_safety import load_plain
from corerl.complete_folders import is_complete, write_complete
from corerl.config.checks import parallel_sizes_divide_world
from corerl.distributed.devices import local_gpu_index, runs_here, runs_here_without_gpu
from corerl.distributed.dispatch import Dispatch, RankLayout
from corerl.distributed.group_backend import WorkerGroupBackend, step_result
from corerl.distributed.placement import training_layout
from corerl.distributed.rank_state import barrier
from corerl.distributed.rendezvous import join_process_group
from corerl.distributed.worker_group import LocalWorkerGroup, RayWorkerGroup, free_port
from corerl.failures import checkpoint_errors
from corerl.lora.adapter import adapter_tensors, is_adapter_name, lora_enabled, write_adapter
from corerl.lora.weights import AdapterWeights
from corerl.models.facts import (
    check_expert_parallel,
    check_hf_router,
    check_tensor_parallel,
    model_shape,
)
from corerl.models.tokenizer import load_tokenizer_folder
from corerl.models.value_model import load_pretrained, model_values, shift_values
from corerl.models.vision import is_vision_language, read_hf_config, vision_token_ids
from corerl.planning.memory import (
    GIB,
    Layout,
    PlanRequest,
    Preference,
    TrainingMemory,
    activation_bytes,
    adam_state_bytes,
    cluster_overrides,
    tensor_parallel_sizes,
)
from corerl.training.batching import loss_token_count
from corerl.training.contract import Batch, LossFn, StepResult, TrainingEngine, ValueEngine
from corerl.training.grad_norm import clip_grad_norm
from corerl.training.head_logprobs import needed_positions
from corerl.training.hf_export import copy_tokenizer, write_hf_checkpoint
from corerl.training.image_rows import image_inputs
from corerl.training.logprobs import (
    TOPK_REQUEST,
    batch_logprobs,
    join_topk,
    model_logprobs,
    picked_logprobs,
    picked_topk,
    token_logprobs,
)
from corerl.training.memory import move_optimizer_state, optimizer_state_tensors, storage_bytes
from corerl.training.microbatching import MicroBatcher
from corerl.training.moe_router import check_router_replay
from corerl.training.optim import build_optimizer, build_scheduler
from corerl.training.rank_worker import RankWorker
from corerl.training.segment_attention import register as register_segment_attention
from corerl.training.sequence_chunks import context_parallel_chunks, context_parallel_positions
from corerl.training.vision_ranks import run_vision_on_every_rank, vision_tower
from corerl.training.weights import CheckpointNaming, EngineWeights, checkpoint_weights

__all__ = [
    # the training contract
    "TrainingEngine", "ValueEngine", "StepResult", "Batch", "LossFn",
    # the rank-side template, the driver-side base, dispatch and worker groups
    "RankWorker", "WorkerGroupBackend", "step_result", "Dispatch", "RankLayout", "LocalWorkerGroup",
    "RayWorkerGroup", "training_layout", "join_process_group", "barrier", "free_port", "local_gpu_index",
    "runs_here_without_gpu", "runs_here",
    # micro-batches, the loss's normaliser, optimizers, gradient clipping
    "MicroBatcher", "loss_token_count", "build_optimizer", "build_scheduler", "clip_grad_norm",
    # logprobs and values
    "model_logprobs", "needed_positions", "model_values", "load_pretrained", "token_logprobs", "picked_logprobs", "picked_topk",
    "TOPK_REQUEST",
    "batch_logprobs", "join_topk", "shift_values", "register_segment_attention",
    # context parallelism's load-balanced chunks of a sequence
    "context_parallel_chunks", "context_parallel_positions",
    # weights: the stream, under checkpoint names, the optimizer's state and what it holds
    "EngineWeights", "CheckpointNaming", "checkpoint_weights", "optimizer_state_tensors", "storage_bytes",
    "move_optimizer_state",
    # checkpoints and exports
    "checkpoint_errors", "load_plain", "is_complete", "write_complete", "copy_tokenizer", "write_hf_checkpoint",
    "load_tokenizer_folder",
    # the model: shape, refusals of parallel sizes and router modes it cannot take
    "model_shape", "check_tensor_parallel", "check_expert_parallel", "check_router_replay", "check_hf_router",
    "parallel_sizes_divide_world",
    # LoRA (policy.lora)
    "lora_enabled", "is_adapter_name", "adapter_tensors", "AdapterWeights", "write_adapter",
    # vision-language models
    "image_inputs", "is_vision_language", "read_hf_config", "vision_token_ids", "vision_tower",
    "run_vision_on_every_rank",
    # memory models for `corerl plan`
    "GIB", "Layout", "PlanRequest", "Preference", "TrainingMemory", "activation_bytes", "adam_state_bytes", "cluster_overrides",
    "tensor_parallel_sizes",
]
