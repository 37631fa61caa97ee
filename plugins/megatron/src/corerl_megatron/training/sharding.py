"""Full (Megatron-named) tensors <-> this rank's shards: tensor-parallel slices and the
pipeline stage's layers (local layer numbers <-> global ones)."""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.distributed as dist

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")


def layer_numbering(model: Any) -> dict[int, int]:
    """Local layer index -> global layer index of this pipeline stage's decoder."""
    layers = getattr(getattr(model, "decoder", None), "layers", [])
    return {local: layer.layer_number - 1 for local, layer in enumerate(layers)}


def renumber(name: str, mapping: dict[int, int]) -> str:
    match = _LAYER.match(name)
    return name if match is None else f"decoder.layers.{mapping[int(match.group(1))]}.{name[match.end():]}"


def _is_gated_fc1(name: str) -> bool:
    """A gated MLP's fc1 (gate and up stacked): the MLP's, or a MoE layer's shared expert's."""
    return name.endswith(("mlp.linear_fc1.weight", "mlp.shared_experts.linear_fc1.weight"))


def partition_dim(full_shape: torch.Size, local_shape: torch.Size) -> int | None:
    """The dimension a tensor-parallel shard is cut along (None: the rank holds it whole)."""
    cut = [d for d, (a, b) in enumerate(zip(full_shape, local_shape, strict=True)) if a != b]
    if len(cut) > 1:
        raise ValueError(f"a shard {tuple(local_shape)} of {tuple(full_shape)} is cut along several dimensions")
    return cut[0] if cut else None


def shard(name: str, full: torch.Tensor, dim: int | None, rank: int, size: int) -> torch.Tensor:
    """This tensor-parallel rank's slice of ``full`` along ``dim`` (whole when None)."""
    if dim is None:
        return full
    if _is_gated_fc1(name):  # [gate; up]: each half is split, the rank keeps [gate_r; up_r]
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(size, dim=0)[rank], up.chunk(size, dim=0)[rank]], dim=0)
    return full.chunk(size, dim=dim)[rank]


def gather(name: str, local: torch.Tensor, dim: int | None, group: Any, size: int) -> torch.Tensor:
    """The full tensor from every tensor-parallel rank's ``local`` slice along ``dim`` (a collective)."""
    if dim is None:
        return local
    pieces = [torch.empty_like(local) for _ in range(size)]
    dist.all_gather(pieces, local.contiguous(), group=group)
    if _is_gated_fc1(name):
        halves = [p.chunk(2, dim=0) for p in pieces]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return torch.cat(pieces, dim=dim)
