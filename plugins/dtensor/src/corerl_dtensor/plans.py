"""Ready-made tensor-parallel plans for ``policy.dtensor_cfg.custom_parallel_plan``.

A plan is named by import path and is either a dict ``{module path: ParallelStyle}`` applied
to the whole model, or a callable ``plan(model, tp_mesh)`` that parallelizes the model itself.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from corerl_dtensor.decoder import decoder_layers


def mlp_only(model: nn.Module, tp_mesh: Any) -> None:
    """Shard only the MLPs (gate/up by output, down by input); attention stays replicated."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    plan = {"mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel()}
    for layer in decoder_layers(model):
        parallelize_module(layer, tp_mesh, plan)
