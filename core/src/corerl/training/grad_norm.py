"""Gradient clipping that works for plain, FSDP2 and tensor-parallel (DTensor) parameters alike."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def clip_grad_norm(params: Iterable[torch.nn.Parameter], max_norm: float | None) -> float:
    """Scale gradients so their global L2 norm is at most ``max_norm``; returns the norm before.

    Each parameter's norm is reduced over its own mesh (DTensor gradients may live on different
    meshes: dp-only for norms and embeddings, dp x tp for projections), so the total is exact.
    Same formula as ``torch.nn.utils.clip_grad_norm_``.
    """
    import torch
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    norms = []
    for grad in grads:
        norm = torch.linalg.vector_norm(grad, 2)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    total = torch.linalg.vector_norm(torch.stack([n.float() for n in norms]), 2)
    if max_norm is not None:
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for grad in grads:
            grad.mul_(coef.to(grad.dtype))
    return float(total.item())
