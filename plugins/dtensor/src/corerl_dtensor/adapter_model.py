"""The base model ``corerl serve RECIPE`` trains its many LoRA adapters on, built the dtensor way.

The backend's ``adapter_model`` (:class:`corerl.sdk.TrainingBackend`): one
:class:`~corerl_dtensor.worker.DTensorWorker` at world size 1 in the calling process builds the
model as it builds its own (``load_pretrained``, its device, the frozen base kept in
``policy.precision`` as under LoRA, :func:`corerl_dtensor.parallelize.parallelize`: activation
checkpointing from ``policy.dtensor_cfg``, autocast where the precision is not float32), without
the recipe's own ``policy.lora`` adapter and without an optimizer: the service adds an adapter,
an optimizer and a step count per training client.

Several ranks would need the service's adapter engine on every rank (a rank worker holding the
adapters and their optimizers, each call dispatched to all ranks and FSDP2 sharding the adapters
with the base); until then corerl serve refuses a recipe of
more than one rank in one line, before it calls this.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch


def build(config: Any, model_path: str) -> tuple[torch.nn.Module, Callable[[], contextlib.AbstractContextManager]]:
    """(the frozen base model on its device, the context of each forward pass) for ``model_path``."""
    from corerl_dtensor import parallelize
    from corerl_dtensor.worker import DTensorWorker

    worker = DTensorWorker(rank=0, world_size=1, config=config)
    worker.lora = False  # the service's adapters are its own: not the recipe's one policy.lora adapter
    model = worker.load_pretrained(model_path).to(worker.device)
    model.requires_grad_(False)
    if worker.param_dtype != torch.float32:  # frozen: kept in the training precision, as under LoRA
        for param in model.parameters():
            param.data = param.data.to(worker.param_dtype)
    model, autocast, _ = parallelize.parallelize(model, worker.mesh, worker.settings, worker.param_dtype,
                                                 worker.device, worker.expert_mesh)
    model.eval()
    if not autocast:
        return model, contextlib.nullcontext
    device, dtype = worker.device.type, worker.param_dtype
    return model, lambda: torch.autocast(device, dtype=dtype)
