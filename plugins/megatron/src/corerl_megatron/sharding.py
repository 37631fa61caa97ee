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
    return name.endswith("mlp.linear_fc1.weight")


def shard(name: str, full: torch.Tensor, param: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """This tensor-parallel rank's slice of ``full`` for ``param`` (whole when not partitioned)."""
    if size == 1 or not getattr(param, "tensor_model_parallel", False):
        return full
    dim = param.partition_dim
    if _is_gated_fc1(name):  # [gate; up]: each half is split, the rank keeps [gate_r; up_r]
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(size, dim=0)[rank], up.chunk(size, dim=0)[rank]], dim=0)
    return full.chunk(size, dim=dim)[rank]


def gather(name: str, local: torch.Tensor, param: torch.Tensor, group: Any, size: int) -> torch.Tensor:
    """The full tensor from every tensor-parallel rank's ``local`` slice (a collective)."""
    if size == 1 or not getattr(param, "tensor_model_parallel", False):
        return local
    pieces = [torch.empty_like(local) for _ in range(size)]
    dist.all_gather(pieces, local.contiguous(), group=group)
    if _is_gated_fc1(name):
        halves = [p.chunk(2, dim=0) for p in pieces]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return torch.cat(pieces, dim=param.partition_dim)
