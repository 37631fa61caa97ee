"""Weights handed between processes of one machine through one shared-memory file.

A refit to a generation engine in another process (a Ray actor) used to pickle every tensor
through Ray's object store and then serialise it again for the engine. Here the writer copies
each tensor once into a file under ``/dev/shm`` that both processes map (``torch.from_file``
with ``shared=True``); only a small manifest (names, dtypes, shapes, offsets) crosses the
process boundary, and the reader's tensors are views of the mapping: no copy on its side.
Tensors that share storage (tied embeddings) are written once and named twice. A refit to a
generation engine streams through two such files, one bucket at a time
(:mod:`corerl.generation.weight_buckets`); asynchronous generation's worker, which holds an update
until its engine can take it and hands the newest to a restarted worker, gets the whole model in one.

The file is named after the process that writes it (``corerl-weights-<pid>-<random>``), which holds
a shared ``flock`` on it while it lives, and is removed when the writer closes. A writer killed with
SIGKILL cannot remove it; the next writer on the machine, and every run that starts a local Ray
runtime, removes those whose owner is gone (:func:`remove_stale_shared_memory`: no such process,
and no lock held, so a live run in another PID namespace sharing ``/dev/shm`` keeps its files), as
Ray's stale session folders are removed (:mod:`corerl.distributed.ray_sessions`).
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from .weight_buckets import RefitStats

log = logging.getLogger(__name__)

_ALIGN = 64  # bytes: every tensor starts on a cache line
_PREFIX = "corerl-weights-"
#: what corerl writes into shared memory, each named after the process that owns it: weight files,
#: and the vLLM plugin's LoRA scratch folders (``corerl-lora-<pid>-...``)
_OWNED = re.compile(r"corerl-(?:weights|lora)-(?P<pid>\d+)-")


@dataclass(frozen=True)
class WeightManifest:
    """Where each named tensor lies in the shared file: ``(name, dtype name, shape, byte offset)``."""

    path: str
    size: int
    entries: tuple[tuple[str, str, tuple[int, ...], int], ...]


def _shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


class SharedWeightWriter:
    """The writing side: one file, grown when the weights outgrow it, removed by :meth:`close`."""

    def __init__(self) -> None:
        import fcntl

        remove_stale_shared_memory()
        self.handle, self.path = tempfile.mkstemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=_shm_dir())
        fcntl.flock(self.handle, fcntl.LOCK_SH)  # held while this writer lives: the file is not stale
        self.size = 0
        self.buffer: Any = None
        self.partner: SharedWeightWriter | None = None  # the second buffer of a bucketed refit (stream)

    def write(self, weights: Iterable[tuple[str, torch.Tensor]]) -> WeightManifest:
        """Copy ``weights`` into the file; the manifest a reader needs to see them."""
        import torch

        pairs = [(name, tensor.detach()) for name, tensor in weights]
        placed: dict[tuple[int, torch.dtype, tuple[int, ...]], int] = {}
        layout: list[tuple[str, torch.Tensor, int, bool]] = []
        end = 0
        for name, tensor in pairs:
            key = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape))
            if key in placed:  # the same storage under a second name (tied weights)
                layout.append((name, tensor, placed[key], False))
                continue
            offset = -(-end // _ALIGN) * _ALIGN
            placed[key] = offset
            layout.append((name, tensor, offset, True))
            end = offset + tensor.numel() * tensor.element_size()
        if end > self.size or self.buffer is None:
            with open(self.path, "r+b") as handle:
                handle.truncate(max(end, 1))
            self.size = max(end, 1)
            self.buffer = torch.from_file(self.path, shared=True, size=self.size, dtype=torch.uint8)
        for _, tensor, offset, first in layout:
            if first:
                _view(self.buffer, tensor.dtype, tuple(tensor.shape), offset).copy_(tensor)
        return WeightManifest(self.path, self.size, tuple(
            (name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), offset)
            for name, tensor, offset, _ in layout))

    def stream(self, weights: Iterable[tuple[str, torch.Tensor]], load: Callable[[WeightManifest], Any],
               bucket_bytes: int) -> RefitStats:
        """A refit in buckets of at most ``bucket_bytes`` through this file and a second one (made at
        the first call), ``load(manifest)`` called here for each bucket while the next is packed:
        see :mod:`corerl.generation.weight_buckets`. Each file is overwritten once its bucket's
        ``load`` has returned."""
        from .weight_buckets import send_buckets

        if self.partner is None:
            self.partner = SharedWeightWriter()
        return send_buckets((self, self.partner), weights, load, bucket_bytes)

    def close(self) -> None:
        if self.partner is not None:
            self.partner.close()
            self.partner = None
        self.buffer = None
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        if self.handle is not None:
            os.close(self.handle)
            self.handle = None


def remove_stale_shared_memory(directory: str | None = None) -> list[str]:
    """Remove this user's weight files and LoRA scratch folders under ``directory`` (default: the
    shared-memory folder) whose owning process is gone; returns the paths removed."""
    import shutil
    import stat

    import psutil

    folder = directory or _shm_dir()
    removed = []
    for name in os.listdir(folder):
        owner = _OWNED.match(name)
        path = os.path.join(folder, name)
        if owner is None or psutil.pid_exists(int(owner["pid"])):
            continue
        try:
            info = os.lstat(path)
            if info.st_uid != os.getuid() or stat.S_ISLNK(info.st_mode) or _locked(path):
                continue
            if stat.S_ISDIR(info.st_mode):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except OSError:  # removed meanwhile, or not ours to remove
            continue
        removed.append(path)
    if removed:
        log.info("removed %d file(s) and folder(s) of killed runs from %s", len(removed), folder)
    return removed


def _locked(path: str) -> bool:
    """Whether a live process holds a lock on ``path`` (a file or folder): its owner, maybe in
    another PID namespace, where the pid in its name means nothing."""
    import fcntl

    handle = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(handle)
    return False


def _view(buffer: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...], offset: int) -> torch.Tensor:
    import math

    nbytes = math.prod(shape) * dtype.itemsize
    return buffer[offset: offset + nbytes].view(dtype).view(shape)


#: the reader's mappings of the newest files, reused: a bucketed refit reads the same few buffers
#: again and again (:mod:`corerl.generation.weight_buckets`), and a mapping made once is not faulted
#: in again at every read. Keyed by path and size (a writer grows its file to a new size).
_MAPPINGS: dict[tuple[str, int], Any] = {}
_MAPPINGS_KEPT = 4


def _mapping(path: str, size: int) -> torch.Tensor:
    import torch

    key = (path, size)
    buffer = _MAPPINGS.pop(key, None)
    if buffer is None:
        buffer = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
    _MAPPINGS[key] = buffer  # the newest last
    while len(_MAPPINGS) > _MAPPINGS_KEPT:  # the oldest goes: its file may be gone (a closed writer)
        del _MAPPINGS[next(iter(_MAPPINGS))]
    return buffer


def read_shared(manifest: WeightManifest | Mapping[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """The named tensors of ``manifest``, as views of the shared file (valid until it is rewritten).
    A manifest that crossed vLLM's multi-process RPC (msgpack) arrives as a mapping of its fields."""
    import torch

    if isinstance(manifest, Mapping):
        manifest = WeightManifest(**manifest)
    buffer = _mapping(manifest.path, manifest.size)
    return [(name, _view(buffer, getattr(torch, dtype), shape, offset)) for name, dtype, shape, offset in manifest.entries]
