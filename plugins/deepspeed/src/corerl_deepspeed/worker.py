"""One rank of the deepspeed backend: a DeepSpeed engine (ZeRO stage 0-3) around the
Hugging Face model, and the work on it. Every rank is a Ray actor (DeepSpeed keeps
process-wide communication state), data parallel over all ranks."""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

import torch

from corerl.sdk import RankWorker, local_gpu_index, model_logprobs
from corerl_deepspeed.memory import gradient_bytes
from corerl_deepspeed.runtime import import_deepspeed

log = logging.getLogger(__name__)

class DeepSpeedWorker(RankWorker):
    """The rank-local half of the deepspeed backend."""

    settings_key = "policy.deepspeed_cfg"
    quiet_warnings = (r".*all_gather_into_tensor. is deprecated.*", r".*reduce_scatter_tensor. is deprecated.*")

    def setup(self) -> None:
        self.on_gpu = torch.cuda.is_available()
        os.environ.update(RANK=str(self.rank), WORLD_SIZE=str(self.world_size), LOCAL_RANK=str(local_gpu_index()))
        self.deepspeed = import_deepspeed(self.on_gpu)
        if self.world_size > 1 and not torch.distributed.is_initialized():  # DeepSpeed keeps a group it finds
            from corerl.sdk import join_process_group

            join_process_group("nccl" if self.on_gpu else "gloo", self.rank, self.world_size)
        self.deepspeed.init_distributed(dist_backend="nccl" if self.on_gpu else "gloo", verbose=False,
                                        rank=self.rank, world_size=self.world_size)
        self.engine: Any = None

    def load_hf(self, model_path: str) -> None:
        from corerl.sdk import build_optimizer, build_scheduler
        from corerl_deepspeed.ds_config import build_ds_config

        policy = self.config.core.policy
        torch.manual_seed(self.config.core.algorithm.seed)
        model = self.load_pretrained(model_path)  # a causal LM, or a critic's value model
        self.model_path, self.hf_config = model_path, model.config
        if self.world_size > 1:  # a vision-language model: every rank runs its tower, images or not
            from corerl.sdk import run_vision_on_every_rank

            run_vision_on_every_rank(model)
        if self.engine is not None:  # a reload (e.g. after SFT): free the old engine's partitions first
            self.engine.destroy()
            self.engine = None
        optimizer = None if self.settings.use_deepspeed_optimizer else build_optimizer(model.parameters(), policy.optimizer, fused=False)
        total = self.config.core.algorithm.max_steps
        self.engine, self.optimizer, _, self.scheduler = self.deepspeed.initialize(
            model=model, optimizer=optimizer, config=build_ds_config(self.config, self.on_gpu),
            lr_scheduler=lambda opt: build_scheduler(opt, policy.scheduler, total),
        )
        self.step = 0
        self.grad_bytes = 0

    # -- the step: gradients accumulate until the last micro-batch, where DeepSpeed reduces
    # (and partitions) them and steps -----------------------------------------------------

    def set_mode(self, training: bool) -> None:
        self.engine.train(training)

    def forward_logprobs(self, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        return model_logprobs(self.engine, mb)

    def forward_values(self, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        from corerl.sdk import model_values

        return model_values(self.engine, mb)

    def before_micro_batch(self, index: int, last: bool) -> None:
        self.engine.set_gradient_accumulation_boundary(last)

    def backward(self, loss: torch.Tensor) -> None:
        # DeepSpeed averages gradients over the ranks; the loss is a sum over them
        self.engine.backward(loss * self.world_size, scale_wrt_gas=False)

    def optimizer_step(self) -> tuple[float, float]:
        lr = self.scheduler.get_last_lr()[0]
        self.grad_bytes = gradient_bytes(self.engine)  # gradients live now; after the step some are freed
        self.engine.step()
        grad_norm = self.engine.get_global_grad_norm()
        return (float(grad_norm) if grad_norm is not None else 0.0), lr

    # -- checkpoints: DeepSpeed's own (model, partitioned optimizer, scheduler) ----------------

    def save_state(self, path: str) -> dict[str, Any]:
        # with LoRA the frozen base is left out: it is the model folder's, loaded again by load_hf
        self.engine.save_checkpoint(path, tag="deepspeed", save_latest=False, exclude_frozen_parameters=self.lora)
        return {}

    def load_state(self, path: str, sidecar: dict[str, Any]) -> None:
        self.engine.load_checkpoint(path, tag="deepspeed", load_optimizer_states=True, load_lr_scheduler_states=True,
                                    load_module_strict=not self.lora)

    # -- weights out -------------------------------------------------------------------------

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Every rank must call this; rank 0 gets the full weights (Hugging Face names, on CPU).
        Under ZeRO-3 each parameter is gathered from its shards in turn, so no rank ever holds
        more than one whole parameter beyond its own shards."""
        self.require_resident("parameters")
        out: dict[str, torch.Tensor] = {}
        for name, param in self.engine.module.named_parameters(remove_duplicate=False):
            gathered = (self.deepspeed.zero.GatheredParameters([param], modifier_rank=None)
                        if self.settings.zero_stage == 3 else contextlib.nullcontext())
            with gathered:
                if self.rank == 0:
                    out[name] = param.detach().to("cpu", copy=True)
        return out if self.rank == 0 else None

    def adapter_state(self) -> dict[str, torch.Tensor] | None:
        """The LoRA adapter on rank 0, each adapter parameter gathered from its ZeRO-3 shards in turn."""
        from corerl.sdk import adapter_tensors, is_adapter_name

        out = []
        for name, param in self.engine.module.named_parameters():
            if not is_adapter_name(name):
                continue
            gathered = (self.deepspeed.zero.GatheredParameters([param], modifier_rank=None)
                        if self.settings.zero_stage == 3 else contextlib.nullcontext())
            with gathered:
                if self.rank == 0:
                    out.append((name, param.detach().to("cpu", copy=True)))
        return adapter_tensors(out) if self.rank == 0 else None

    # -- memory ------------------------------------------------------------------------------

    def move(self, device: torch.device, parts: list[str]) -> None:
        """On a GPU: DeepSpeed's own ``offload_states`` under ZeRO-3 with its FusedAdam; otherwise
        the parts are parked in host memory (:meth:`phase_tensors`, as on a CPU)."""
        if self.settings.zero_stage != 3:
            super().move(device, parts)
            return
        from deepspeed.ops.adam.fused_adam import FusedAdam

        inner = type(getattr(self.engine.optimizer, "optimizer", None))
        if inner is not FusedAdam:  # DeepSpeed's offload_states asserts on any other optimizer
            log.info("deepspeed rank %d: DeepSpeed offloads ZeRO-3 states only for its FusedAdam, not %s: the "
                     "states are parked in host memory instead", self.rank, inner.__name__)
            super().move(device, parts)
            return
        if device.type != "cpu":
            self.engine.reload_states()
            return
        from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum

        kinds = []
        if "optimizer" in parts:
            kinds += [OffloadStateTypeEnum.optim_states, OffloadStateTypeEnum.lp_grads, OffloadStateTypeEnum.hp_params]
        if "parameters" in parts:
            kinds += [OffloadStateTypeEnum.lp_params]
        self.engine.offload_states(include=kinds)

    def phase_tensors(self, part: str) -> list[torch.Tensor] | None:
        """What the engine holds of ``part``: the module's parameters (their ZeRO-3 partitions; under
        ZeRO-1/2 views into its flat buffers), or the optimizer's state with ZeRO's fp32 master
        partitions (:mod:`corerl_deepspeed.memory`)."""
        from corerl_deepspeed.memory import optimizer_tensors, parameter_tensors

        if part == "parameters":
            return parameter_tensors(self.engine, self.settings.zero_stage)
        if part == "optimizer":
            return optimizer_tensors(self.engine)
        return None

    def state_bytes(self) -> dict[str, int]:
        """Bytes this rank holds on its device for parameters, gradients (at the last step's
        boundary) and optimizer state (see bench/memory.py); 0 for a part offloaded."""
        return {"parameters": self.resident_bytes(self.phase_tensors("parameters")),
                "gradients": self.grad_bytes, "optimizer": self.resident_bytes(self.phase_tensors("optimizer"))}

    def release(self) -> None:
        if self.engine is not None:
            self.engine.destroy()
