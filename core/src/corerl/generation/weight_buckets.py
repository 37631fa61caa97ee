"""A refit streamed to an engine in another process of this machine in fixed-size buckets.

The weights go through a ring of two shared-memory buffers
(:meth:`corerl.generation.shared_weights.SharedWeightWriter.stream`: files named after this process,
locked while it lives, removed on close or by the next run once it is gone): a helper thread copies
bucket ``k + 1`` into one buffer while the engine loads bucket ``k`` from the other, and only each
bucket's :class:`~corerl.generation.shared_weights.WeightManifest` (names, dtypes, shapes, offsets)
crosses the process boundary (``collective_rpc`` to every vLLM worker, or a Ray actor call). No
archive is built and nothing is written to disk. The engine must have copied a bucket's tensors
into its own weights when its ``load`` returns: the buffer is then reused.

A bucket holds whole *groups* of tensors, never part of one: the tensors of one decoder block's
submodule (``model.layers.3.self_attn``, ``model.layers.3.mlp``) go together, because an engine
fuses some of them into one weight (vLLM's ``qkv_proj``, ``gate_up_proj``) and processes that
weight once all its parts are loaded. A group bigger than the bucket size goes alone into a bucket
of its own size (the buffer grows to hold it); a tensor is never split. Tensors that share storage
(tied embeddings) are written once, in the bucket of the first name, and named there twice.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


class BucketWriter(Protocol):
    """One buffer of the ring: :class:`corerl.generation.shared_weights.SharedWeightWriter`."""

    def write(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Any:
        """Copy ``weights`` into the buffer; the manifest (a ``WeightManifest``) a reader needs."""


#: the default bucket size (``policy.generation.vllm_cfg.refit_bucket_mib``)
DEFAULT_BUCKET_MIB = 128

_BLOCK = re.compile(r"^(?P<block>(?:.*?\.)?\d+\.[^.]+)\.")  # up to a numbered block's submodule


def group_of(name: str) -> str:
    """The group a tensor travels with: its numbered block's submodule (``model.layers.3.mlp`` for
    ``model.layers.3.mlp.experts.7.up_proj.weight``), else its own module (``model.embed_tokens``)."""
    block = _BLOCK.match(name)
    return block["block"] if block else name.rpartition(".")[0]


def plan_buckets(weights: Sequence[tuple[str, torch.Tensor]], bucket_bytes: int) -> list[list[tuple[str, torch.Tensor]]]:
    """``weights`` cut into buckets of at most ``bucket_bytes`` (see the module doc): whole groups,
    in stream order, a group bigger than the size alone; a tensor sharing storage with an earlier
    one moves into that one's group (counted once)."""
    groups: dict[str, list[tuple[str, torch.Tensor]]] = {}
    sizes: dict[str, int] = {}
    owner: dict[tuple[int, Any, tuple[int, ...]], str] = {}  # a storage -> the group that carries it
    for name, tensor in weights:
        key = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape))
        group = owner.get(key)
        if group is None:
            group = group_of(name)
            owner[key] = group
            sizes[group] = sizes.get(group, 0) + tensor.numel() * tensor.element_size()
        groups.setdefault(group, []).append((name, tensor))
    buckets: list[list[tuple[str, torch.Tensor]]] = []
    current: list[tuple[str, torch.Tensor]] = []
    used = 0
    for group, members in groups.items():
        if current and used + sizes[group] > bucket_bytes:
            buckets.append(current)
            current, used = [], 0
        current.extend(members)
        used += sizes[group]
    if current:
        buckets.append(current)
    return buckets


@dataclass
class RefitStats:
    """What one refit moved: buckets, bytes written to shared memory, the manifests' pickled bytes
    (what crossed the process boundary), seconds, and what each ``load`` returned."""

    buckets: int = 0
    bytes: int = 0
    manifest_bytes: int = 0
    seconds: float = 0.0
    loaded: list[Any] = field(default_factory=list)


def send_buckets(writers: Sequence[BucketWriter], weights: Iterable[tuple[str, torch.Tensor]],
                 load: Callable[[Any], Any], bucket_bytes: int = DEFAULT_BUCKET_MIB * 2**20) -> RefitStats:
    """Stream ``weights`` through ``writers`` (the ring of buffers, each reused once the engine has
    loaded what it held), calling ``load(manifest)`` for each bucket in the calling thread (an
    engine's RPC client is only ever used there) while a helper thread packs the next bucket.
    :meth:`SharedWeightWriter.stream` is the usual way in (a ring of two)."""
    import pickle

    if bucket_bytes < 1 or not writers:
        raise ValueError(f"bucket_bytes ({bucket_bytes}) must be at least 1 and writers ({len(writers)}) at least one")
    start = time.perf_counter()
    pairs = [(name, tensor.detach()) for name, tensor in weights]
    plan = plan_buckets(pairs, bucket_bytes)
    ring = len(writers)
    free = [threading.Semaphore(1) for _ in range(ring)]  # a buffer the engine is done with
    ready: queue.Queue[tuple[Any, BaseException | None]] = queue.Queue()
    stop = threading.Event()

    def pack() -> None:
        try:
            for k, bucket in enumerate(plan):
                free[k % ring].acquire()
                if stop.is_set():
                    return
                ready.put((writers[k % ring].write(bucket), None))
        except BaseException as exc:  # handed to the loading thread, which raises it
            ready.put((None, exc))

    packer = threading.Thread(target=pack, name="corerl-refit-pack", daemon=True)
    packer.start()
    stats = RefitStats(buckets=len(plan))
    try:
        for k in range(len(plan)):
            manifest, error = ready.get()
            if error is not None:
                raise error
            assert manifest is not None
            stats.bytes += _written(manifest)
            stats.manifest_bytes += len(pickle.dumps(manifest))
            stats.loaded.append(load(manifest))
            free[k % ring].release()
    finally:
        stop.set()
        for semaphore in free:  # a packer waiting for a buffer sees the stop
            semaphore.release()
        packer.join()
    stats.seconds = time.perf_counter() - start
    return stats


def _written(manifest: Any) -> int:
    """The bytes a manifest's bucket holds (a tied name counted once)."""
    import math

    import torch

    seen: dict[int, int] = {}
    for _, dtype, shape, offset in manifest.entries:
        seen[offset] = max(seen.get(offset, 0), math.prod(shape) * getattr(torch, dtype).itemsize)
    return sum(seen.values())
