"""The base model ``corerl serve RECIPE`` trains its many LoRA adapters on, loaded the deepspeed way.

The backend's ``adapter_model`` (:class:`corerl.sdk.TrainingBackend`): the model a
:class:`~corerl_deepspeed.worker.DeepSpeedWorker` loads for its policy (``load_hf``: the recipe's
seed, ``load_pretrained`` in float32 on the CPU, MoE router hooks, a vision tower frozen as the
recipe says), without the recipe's own ``policy.lora`` adapter, then cast as ``deepspeed.initialize``
casts it (:func:`cast_as_deepspeed`: parameters into the precision of the generated DeepSpeed config,
``policy.precision`` with ``policy.deepspeed_cfg.config`` merged over it, buffers kept unless its
``data_types`` say otherwise) and moved to the device. Its forward passes run as the engine runs them,
without autocast: the deepspeed backend has no activation checkpointing.

No ZeRO engine, optimizer or process group is built: at one rank ZeRO partitions nothing, and a
frozen base has no gradients or optimizer state to partition; the service adds an adapter, an
optimizer and a step count per training client. So ``zero_stage`` and the offload settings change
nothing here (at one rank they place memory, not numbers). DeepSpeed's ``torch_autocast``, a forward
context of the engine's own, is refused in one line.

Several ranks would need the service's adapter engine on every rank (a rank worker holding the
adapters and their optimizers, each call dispatched to all ranks); until then corerl serve refuses a recipe of
more than one rank in one line, before it calls this.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from corerl.sdk import ConfigError
from corerl_deepspeed.worker import DeepSpeedWorker


class BaseModelLoader(DeepSpeedWorker):
    """A :class:`DeepSpeedWorker` at rank 0 of 1 that only loads the model: no process group, no engine."""

    def setup(self) -> None:
        self.on_gpu = self.device.type == "cuda"
        self.engine = None


def build(config: Any, model_path: str) -> tuple[torch.nn.Module, Callable[[], contextlib.AbstractContextManager]]:
    """(the frozen base model on its device, the context of each forward pass) for ``model_path``."""
    from corerl_deepspeed.ds_config import build_ds_config
    from corerl_deepspeed.runtime import import_deepspeed

    worker = BaseModelLoader(rank=0, world_size=1, config=config)
    ds_config = build_ds_config(config, worker.on_gpu)
    if (ds_config.get("torch_autocast") or {}).get("enabled"):
        raise ConfigError("corerl serve runs the deepspeed backend's model without DeepSpeed's engine, so without "
                          "its torch_autocast", key="policy.deepspeed_cfg.config.torch_autocast",
                          hint="remove torch_autocast from policy.deepspeed_cfg.config for corerl serve")
    import_deepspeed(worker.on_gpu)  # the cast's helpers are DeepSpeed's
    worker.lora = False  # the service's adapters are its own: not the recipe's one policy.lora adapter
    torch.manual_seed(config.core.algorithm.seed)
    model = worker.load_pretrained(model_path)
    model.requires_grad_(False)
    cast_as_deepspeed(model, ds_config)
    model.to(worker.device)
    model.eval()
    return model, contextlib.nullcontext


def cast_as_deepspeed(model: torch.nn.Module, ds_config: dict[str, Any]) -> None:
    """Cast ``model`` in place as ``deepspeed.initialize`` does with ``ds_config`` (outside ZeRO-3's
    partitioned init): under fp16 or bf16 every floating parameter into that precision; buffers only
    where ``data_types.buffer_dtype`` is set, and those ``data_types.keep_in_fp32_modules`` names
    (by default the model's own list) in float32."""
    from deepspeed.runtime.config import DtypeEnum
    from deepspeed.runtime.keep_in_fp32 import (
        KEEP_IN_FP32_AUTO,
        buffers_to_keep_in_fp32,
        keep_in_fp32_pattern,
    )

    if (ds_config.get("fp16") or {}).get("enabled"):
        param_dtype = torch.float16
    elif (ds_config.get("bf16") or {}).get("enabled"):
        param_dtype = torch.bfloat16
    else:
        return
    data_types = ds_config.get("data_types") or {}
    buffer_dtype = data_types.get("buffer_dtype")
    buffer_dtype = DtypeEnum(buffer_dtype).value if buffer_dtype is not None else None
    castable = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    for param in model.parameters():
        if param.dtype in castable:
            param.data = param.data.to(param_dtype)
    pattern = keep_in_fp32_pattern(model, data_types.get("keep_in_fp32_modules", KEEP_IN_FP32_AUTO), param_dtype)
    kept = {id(b) for b in buffers_to_keep_in_fp32(model, pattern)} if pattern is not None else set()
    for buffer in model.buffers():
        if id(buffer) in kept:
            buffer.data = buffer.data.float()
        elif buffer_dtype is not None and buffer.dtype in castable:
            buffer.data = buffer.data.to(buffer_dtype)
