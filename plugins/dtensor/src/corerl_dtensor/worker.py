"""One rank of the dtensor backend: the model shard, its optimizer, and the work on it.

Built by a worker group (a Ray actor per rank, or in-process for world size 1). Ranks are
laid out row-major over a ``(dp, tp)`` mesh: rank ``r`` is data-parallel rank ``r // tp``
(with ``dp_replicate_size`` > 1 the mesh is ``(dp_replicate, dp_shard, tp)``, the same ranks in
the same order, and FSDP2 runs as HSDP over its first two dimensions); with expert parallelism a
second mesh ``(edp, ep)`` over the same ranks places the experts. With context parallelism
(``cp`` > 1) the layout is ``(dp, cp, tp)``: rank ``r`` is data-parallel rank ``r // (cp x tp)``,
FSDP2 shards over all ``dp x cp`` ranks of a tensor-parallel shard, and the ``cp`` ranks of a
data-parallel rank that hold the same shard form the ring that splits each of its sequences
(:mod:`corerl_dtensor.context_parallel`; attention heads are split over ``tp`` as without it).
The step, checkpoint sidecar and device plumbing come from :class:`corerl.training.rank_worker.RankWorker`.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from corerl.sdk import (
    RankWorker,
    build_optimizer,
    build_scheduler,
    clip_grad_norm,
    model_logprobs,
    move_optimizer_state,
    optimizer_state_tensors,
    storage_bytes,
)
from corerl_dtensor import parallelize

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class DTensorWorker(RankWorker):
    """The rank-local half of the dtensor backend."""

    settings_key = "policy.dtensor_cfg"
    # a world-size-1 save runs in one process, as it is meant to
    quiet_warnings = ("torch.distributed is disabled, unavailable or uninitialized",
                      # FSDP1 with LoRA: frozen and trained weights share a unit (docs/lora.md says what it costs)
                      r"(?s).*has both parameters with requires_grad=True and False")

    def setup(self) -> None:
        logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
        self.tp = self.settings.tensor_parallel_size
        self.cp = self.settings.context_parallel_size
        self.dp = self.world_size // (self.tp * self.cp)
        self.ring = None  # the context-parallel ranks of this rank's sequences (cp > 1)
        self.param_dtype = DTYPES[self.config.core.policy.precision]
        self.mesh = None
        self.expert_mesh = None
        if self.world_size > 1:
            if not dist.is_initialized():
                backend = "nccl" if self.device.type == "cuda" else "gloo"
                from corerl.sdk import join_process_group

                join_process_group(backend, self.rank, self.world_size)
            from torch.distributed.device_mesh import init_device_mesh

            replicate = self.settings.dp_replicate_size
            if replicate > 1:  # HSDP: FSDP shards within a "dp_shard" group, replicated over "dp_replicate"
                self.mesh = init_device_mesh(self.device.type, (replicate, self.dp // replicate, self.tp),
                                             mesh_dim_names=("dp_replicate", "dp_shard", "tp"))
            else:
                # FSDP2 shards over the context-parallel ranks too: "dp" is every rank of a model replica's shards
                self.mesh = init_device_mesh(self.device.type, (self.dp * self.cp, self.tp), mesh_dim_names=("dp", "tp"))
            if self.cp > 1:  # the ring: the ranks of one data-parallel rank holding the same tensor-parallel shard
                from corerl_dtensor.ring_attention import ProcessGroupRing

                cp_mesh = init_device_mesh(self.device.type, (self.dp, self.cp, self.tp),
                                           mesh_dim_names=("data", "cp", "model"))
                self.ring = ProcessGroupRing(cp_mesh["cp"].get_group())
            ep = self.settings.expert_parallel_size
            if ep > 1:  # experts over "ep"; the ranks holding the same experts ("edp") shard them with FSDP
                self.expert_mesh = init_device_mesh(self.device.type, (self.world_size // ep, ep),
                                                    mesh_dim_names=("edp", "ep"))
        self.model: nn.Module | None = None

    def load_hf(self, model_path: str) -> None:
        policy = self.config.core.policy
        torch.manual_seed(self.config.core.algorithm.seed)
        extra = {}
        if policy.sequence_packing.enabled:  # packed rows: attention per sequence, not over the whole row
            from corerl.sdk import register_segment_attention

            extra["attn_implementation"] = register_segment_attention()
        elif self.ring is not None:  # a sequence split over the ring: attention over all of it
            from corerl_dtensor.ring_attention import register_with_transformers

            extra["attn_implementation"] = register_with_transformers()
        model = self.load_pretrained(model_path, **extra).to(self.device)
        self.model_path, self.hf_config = model_path, model.config
        if self.lora and self.param_dtype != torch.float32 and self.mesh is None:
            # frozen: kept in the training precision, no optimizer state (under FSDP2 the sharded
            # weights stay float32: its mixed precision casts them per layer for compute)
            for param in model.parameters():
                if not param.requires_grad:
                    param.data = param.data.to(self.param_dtype)
        model, self.autocast, self.fsdp1 = parallelize.parallelize(model, self.mesh, self.settings,
                                                                    self.param_dtype, self.device, self.expert_mesh)
        self.model = model
        self.optimizer = build_optimizer(model.parameters(), policy.optimizer)
        self.scheduler = build_scheduler(self.optimizer, policy.scheduler, self.config.core.algorithm.max_steps)
        self.step = 0
        self.grad_bytes = 0

    def _require_model(self) -> nn.Module:
        if self.model is None:
            raise RuntimeError("load_hf() must be called before using the backend")
        return self.model

    # -- the step --------------------------------------------------------------------------

    def set_mode(self, training: bool) -> None:
        self._require_model().train(training)

    def forward_logprobs(self, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        context = (torch.autocast(self.device.type, dtype=self.param_dtype) if self.autocast
                   else contextlib.nullcontext())
        with context:
            if self.ring is not None:
                from corerl_dtensor.context_parallel import context_parallel_logprobs

                return context_parallel_logprobs(self._require_model(), mb, self.ring, self.router)
            return model_logprobs(self._require_model(), mb)

    def forward_values(self, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        from corerl.sdk import model_values

        context = (torch.autocast(self.device.type, dtype=self.param_dtype) if self.autocast
                   else contextlib.nullcontext())
        with context:
            if self.ring is not None:
                from corerl_dtensor.context_parallel import context_parallel_values

                return context_parallel_values(self._require_model(), mb, self.ring, self.router)
            return model_values(self._require_model(), mb)

    def before_micro_batch(self, index: int, last: bool) -> None:
        sync = getattr(self.model, "set_requires_gradient_sync", None)  # FSDP2: reduce once per step
        if sync is not None:
            sync(last)

    def data_parallel_size(self) -> int:
        return self.dp

    def parallel_layout(self) -> dict[str, Any]:
        """Where this rank stands: the parallel sizes, its place in the context-parallel ring and the
        attention its model runs (what a test or a person debugging a layout asks a rank)."""
        model = self._require_model()
        return {"dp": self.dp, "tp": self.tp, "cp": self.cp,
                "ring_rank": self.ring.rank if self.ring is not None else None,
                "attention": getattr(model.config, "_attn_implementation", None)}

    def optimizer_step(self) -> tuple[float, float]:
        model = self._require_model()
        max_norm = self.config.core.policy.max_grad_norm
        if self.fsdp1:  # its flat shards are plain tensors: only the wrapper knows the global norm
            grad_norm = float(model.clip_grad_norm_(max_norm if max_norm is not None else float("inf")))
        else:
            grad_norm = clip_grad_norm(model.parameters(), max_norm)
        lr = self.optimizer.param_groups[0]["lr"]
        self.grad_bytes = storage_bytes(p.grad for p in model.parameters())
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm, lr

    # -- checkpoints: torch.distributed.checkpoint, each rank writing its shards -------------

    def save_state(self, path: str) -> dict[str, Any]:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = self._trained_state(get_state_dict(self._require_model(), self.optimizer))
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=os.path.join(path, "weights"),
                 no_dist=not dist.is_initialized())
        return {"scheduler": self.scheduler.state_dict()}

    def load_state(self, path: str, sidecar: dict[str, Any]) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_state_dict,
            set_state_dict,
        )

        model = self._require_model()
        model_sd, optim_sd = self._trained_state(get_state_dict(model, self.optimizer))
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=os.path.join(path, "weights"), no_dist=not dist.is_initialized())
        set_state_dict(model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=StateDictOptions(strict=not self.lora))
        self.scheduler.load_state_dict(sidecar["scheduler"])

    def _trained_state(self, state: tuple[dict[str, Any], dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
        """(model, optimizer) state as a checkpoint holds it: with LoRA, the adapter only (the
        frozen base is the model folder's, loaded again by ``load_hf``)."""
        model_sd, optim_sd = state
        if self.lora:
            from corerl.sdk import is_adapter_name

            model_sd = {k: v for k, v in model_sd.items() if is_adapter_name(k)}
        return model_sd, optim_sd

    # -- weights out -------------------------------------------------------------------------

    def adapter_state(self) -> dict[str, torch.Tensor] | None:
        if not self.fsdp1:
            return super().adapter_state()
        from corerl.sdk import adapter_tensors

        # FSDP1's parameters are views of flat shards: only its own full state dict is whole
        state = self.full_state_dict()
        return adapter_tensors(state.items()) if state is not None else None

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Every rank must call this; rank 0 gets the full weights (Hugging Face names, on CPU)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        self.require_resident("parameters")
        model = self._require_model()
        if self.fsdp1:
            state = parallelize.fsdp1_full_state_dict(model)
        else:
            state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {k: v.detach().cpu() for k, v in state.items()} if self.rank == 0 else None

    # -- memory ------------------------------------------------------------------------------

    def move(self, device: torch.device, parts: list[str]) -> None:
        model = self._require_model()
        if "parameters" in parts:
            model.to(device)
        if "optimizer" in parts:
            move_optimizer_state(self.optimizer, device)
        if device.type == "cpu":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def phase_tensors(self, part: str) -> list[torch.Tensor] | None:
        """This rank's shards of the model's parameters (a DTensor's local shard, FSDP1's flat
        shards), or its optimizer's state tensors: what offload parks on a CPU."""
        if part == "parameters":
            return list(self._require_model().parameters())
        if part == "optimizer":
            return optimizer_state_tensors(self.optimizer)
        return None

    def state_bytes(self) -> dict[str, int]:
        """Bytes this rank holds on its device for parameters (its shards), gradients (at the last
        step, before the optimizer ran) and optimizer state (see bench/memory.py); 0 for a part
        offloaded."""
        return {"parameters": self.resident_bytes(self.phase_tensors("parameters")), "gradients": self.grad_bytes,
                "optimizer": self.resident_bytes(self.phase_tensors("optimizer"))}
