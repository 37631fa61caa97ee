"""Counting each expert's tokens for the routers' per-expert bias (aux-loss-free balancing).

megatron-core moves a router's ``expert_bias`` after each step from the tokens each expert took
(``local_tokens_per_expert``, summed over the data-parallel ranks in ``finalize_model_grads``).
In megatron-core 0.16 the count leaves the padding out with ``routing_map & ~padding_mask``: a
``[tokens, experts]`` map and a ``[tokens]`` mask, which do not broadcast (the step fails). corerl
passes a padding mask whenever the model has experts (so the router's losses skip the padding),
so :func:`count_real_tokens_only` puts the same count in place with the mask's expert axis added.
"""

from __future__ import annotations

from typing import Any

import torch


def _apply_expert_bias(self: Any, routing_map: torch.Tensor, padding_mask: torch.Tensor | None = None) -> None:
    """The tokens each expert took in a training forward, padding left out (megatron-core's count)."""
    if self.enable_expert_bias and torch.is_grad_enabled():
        with torch.no_grad():
            if padding_mask is not None:
                routing_map = routing_map & ~padding_mask.reshape(-1, 1)
            self.local_tokens_per_expert += routing_map.sum(dim=0)


def count_real_tokens_only() -> None:
    """Replace megatron-core's ``TopKRouter._apply_expert_bias`` by :func:`_apply_expert_bias` (idempotent)."""
    from megatron.core.transformer.moe.router import TopKRouter

    TopKRouter._apply_expert_bias = _apply_expert_bias
