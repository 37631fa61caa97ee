"""The planner's vocabulary: what is asked (:class:`PlanRequest`), a candidate layout
(:class:`Layout`), what a training layout holds per GPU (:class:`TrainingMemory`), what a backend
says of the requests it is made for (:class:`Preference`), and the protocols a training backend's
memory model (:class:`MemoryModel`) and a generation engine's (:class:`GenerationMemory`) follow.

A training backend's plugin registers a :class:`corerl.registry.MemoryModel` (its id the
backend's) whose factory returns a :class:`MemoryModel`; a generation engine's plugin registers
one under the engine's id whose factory returns a :class:`GenerationMemory`. The core
(:mod:`corerl.planning.planner`) adds the generation engine and the reference model to each
layout, follows the strongest preference and ranks the layouts.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import attrs

from corerl.models.facts import tensor_parallel_fits
from corerl.planning.shape import ModelShape

GIB = 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@attrs.frozen
class PlanRequest:
    """A model on some hardware with a recipe's batch settings."""

    shape: ModelShape
    gpus_per_node: int = 8
    nodes: int = 1
    gpu_memory: int = 80 * GIB  # bytes per GPU
    precision: str = "bfloat16"
    seq_length: int = 4096
    micro_batch: int = 1
    #: sequences one generation step holds per data-parallel group of the engine
    generation_batch: int = 64
    #: the share of each GPU a colocated generation engine reserves (its memory model reads it
    #: from the engine's section: :meth:`GenerationMemory.memory_fraction`)
    generation_memory_fraction: float = 0.6
    #: a frozen reference for the KL penalty (algorithm.kl_penalty > 0)
    reference: bool = False
    #: asynchronous RL (algorithm.async.enabled): generation needs GPUs of its own
    asynchronous: bool = False

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.precision]


@attrs.frozen
class Layout:
    """One way to lay the training out: the backend, the parallel sizes, the memory switches,
    and the ``key=value`` overrides that select it (``corerl run RECIPE <overrides>``)."""

    backend: str
    name: str
    overrides: tuple[str, ...]
    tp: int = 1
    pp: int = 1
    dp: int = 1
    activation_checkpointing: bool = False
    #: ranks each sequence is split over (context parallelism); counted as model-parallel ranks
    cp: int = 1
    #: the generation backend that samples beside this layout: None, the default engine (the
    #: installed generation memory model of highest priority); a generation backend's id, that
    #: engine; the layout's own backend id, the backend samples with its training weights
    #: (:attr:`TrainingMemory.own_generation` says what that adds)
    generation: str | None = None


@attrs.frozen
class TrainingMemory:
    """Bytes one GPU holds for training: parameters, gradients, optimizer state (moments and
    master copies), activations of one micro-batch, the engine's working buffers, and the frozen
    reference's parameters."""

    parameters: int
    gradients: int
    optimizer: int
    activations: int
    reference: int = 0
    #: what a backend that samples with its own weights adds while generating (its KV buffer);
    #: 0 where a separate engine generates
    own_generation: int = 0
    #: the engine's own working buffers in the training phase beyond its state (DeepSpeed ZeRO-3's
    #: gradient reduce bucket and the full parameters it gathers for a forward); 0 where none is known
    buffers: int = 0

    @property
    def state(self) -> int:
        return self.parameters + self.gradients + self.optimizer

    @property
    def total(self) -> int:
        """The training phase: state, activations, the engine's buffers and the reference."""
        return self.state + self.activations + self.buffers + self.reference


@attrs.frozen
class Preference:
    """What a training backend's memory model says of a request it is the backend for (the
    decision tree's branch: a model size, a node count, a model family), and why, in one line.
    The planner follows the preference of highest ``priority`` among the installed backends (ties:
    the memory models' order): its fitting layouts rank first."""

    why: str
    priority: int = 0
    #: the generation it wants beside its layouts: None, the default engine; an engine's id; the
    #: backend's own id, its own generation (its layouts with that ``Layout.generation``)
    generation: str | None = None
    #: the tensor-parallel size it asks of the generation engine (its smallest fitting one if larger)
    generation_tp: int | None = None


@runtime_checkable
class MemoryModel(Protocol):
    """A training backend's memory model (the factory of a :class:`corerl.registry.MemoryModel`
    returns one).

    It may also have ``preference(request) -> Preference | None`` (contract 2.16): the requests
    this backend is the one for, and why. A memory model without it (an older contract's) is
    planned all the same, and preferred for none."""

    def layouts(self, request: PlanRequest) -> list[Layout]:
        """The layouts worth considering for ``request`` on this backend."""

    def layout_of(self, config: Any, request: PlanRequest) -> Layout:
        """The layout a validated recipe ``config`` asks for (``corerl validate``'s fit check)."""

    def estimate(self, request: PlanRequest, layout: Layout) -> TrainingMemory:
        """Per-GPU bytes of the largest rank of ``layout`` (a separate generation engine's share
        is its own memory model's)."""


@runtime_checkable
class GenerationMemory(Protocol):
    """A generation engine's memory model (registered as a :class:`corerl.registry.MemoryModel`
    under the engine's id; contract 2.16): what the engine takes of each GPU beside a training
    layout, the tensor-parallel size it needs, and the overrides that select it. It may also have
    ``memory_fraction(config) -> float | None``: the share of each GPU its section reserves
    (:attr:`PlanRequest.generation_memory_fraction`; the request's default where absent)."""

    def share(self, request: PlanRequest) -> int:
        """Bytes of each GPU the engine reserves when colocated with training."""

    def tensor_parallel(self, request: PlanRequest, reserved: int) -> int | None:
        """The engine's tensor-parallel size (within a node) with ``reserved`` bytes of each GPU;
        None when no size fits."""

    def overrides(self, tp: int) -> list[str]:
        """``key=value`` overrides that select the engine at tensor-parallel size ``tp``."""

    def label(self, tp: int) -> str:
        """The engine at tensor-parallel size ``tp``, for the plan's table (``Engine TP=2``)."""


def activation_bytes(request: PlanRequest, layers: int, tp: int = 1, checkpointing: bool = False,
                     vocab_split: int = 1) -> int:
    """Activations one micro-batch keeps for the backward pass on one GPU holding ``layers``
    layers: per layer ``34 s b h`` bytes at 16 bits (Korthikanti et al.'s count with fused
    attention, which keeps no ``s x s`` scores) over ``tp``, or just the layer's input ``2 s b h``
    under full activation checkpointing (plus one layer recomputed at a time); and the fp32
    logits with their log-softmax, ``2 x 4 s b V`` over ``vocab_split``."""
    s, b, h = request.seq_length, request.micro_batch, request.shape.hidden
    scale = request.dtype_bytes / 2  # the count is for 16-bit activations
    per_layer = 34 * s * b * h * scale / tp
    kept = layers * 2 * s * b * h * scale + per_layer if checkpointing else layers * per_layer
    logits = 2 * 4 * s * b * request.shape.vocab / vocab_split
    return int(kept + logits)


def adam_state_bytes(parameters: int, precision: str, master_copy: bool | None = None) -> int:
    """Adam's two fp32 moments, plus an fp32 master copy of the weights where they are kept in
    16 bits (``master_copy`` forces either)."""
    master = precision != "float32" if master_copy is None else master_copy
    return parameters * (8 + (4 if master else 0))


def tensor_parallel_sizes(request: PlanRequest, limit: int | None = None) -> list[int]:
    """Tensor-parallel sizes within one node (powers of two up to ``limit``, default the node's
    GPUs) that divide the model's attention and key-value heads and the world size."""
    limit = min(limit or request.gpus_per_node, request.gpus_per_node)
    sizes, tp = [], 1
    while tp <= limit:
        if tensor_parallel_fits(request.shape, tp) and request.world_size % tp == 0:
            sizes.append(tp)
        tp *= 2
    return sizes


def cluster_overrides(request: PlanRequest) -> tuple[str, ...]:
    """The ``cluster.*`` overrides of ``request``'s hardware."""
    return (f"cluster.num_nodes={request.nodes}", f"cluster.gpus_per_node={request.gpus_per_node}")
