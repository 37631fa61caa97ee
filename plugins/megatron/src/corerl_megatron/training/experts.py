"""Experts under expert parallelism: a rank builds ``E / ep`` local experts, numbered from 0;
expert-parallel rank ``r``'s local expert ``i`` is the model's expert ``r * E / ep + i``
(megatron-core's layout). Names move between the local and global numbering here, and the
full set of experts is gathered from the expert-parallel group for export and refit."""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.distributed as dist

_LOCAL_EXPERT = re.compile(r"\.local_experts\.(\d+)\.")


def is_expert(name: str) -> bool:
    """Whether ``name`` is a routed expert's parameter (held by one expert-parallel rank)."""
    return _LOCAL_EXPERT.search(name) is not None


def global_expert_name(name: str, ep_rank: int, per_rank: int) -> str:
    """``name`` with its local expert index replaced by the model's (unchanged for other names)."""
    match = _LOCAL_EXPERT.search(name)
    if match is None or per_rank == 0:
        return name
    return f"{name[:match.start()]}.local_experts.{ep_rank * per_rank + int(match.group(1))}.{name[match.end():]}"


def gather_experts(local: dict[str, torch.Tensor], group: Any, ep: int, per_rank: int) -> dict[str, torch.Tensor]:
    """Every expert-parallel rank's experts, by global name, from this rank's ``local`` ones (named
    with local indices); a collective over ``group``, which every rank of it must call with the
    same names (each holds the same local experts' shapes)."""
    if ep == 1:
        return dict(local)
    out: dict[str, torch.Tensor] = {}
    for name in sorted(local):
        pieces = [torch.empty_like(local[name]) for _ in range(ep)]
        dist.all_gather(pieces, local[name].contiguous(), group=group)
        for rank, piece in enumerate(pieces):
            out[global_expert_name(name, rank, per_rank)] = piece
    return out
