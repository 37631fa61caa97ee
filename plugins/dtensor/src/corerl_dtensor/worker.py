"""One rank of the dtensor backend: the model shard, its optimizer, and the work on it.

Built by a worker group (a Ray actor per rank, or in-process for world size 1). Ranks are
laid out row-major over a ``(dp, tp)`` mesh: rank ``r`` is data-parallel rank ``r // tp``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from corerl.config import Config
from corerl.distributed.actor import resolve
from corerl.distributed.devices import RankDeviceReport, rank_device
from corerl.distributed.rank_state import barrier, capture_rng, restore_rng
from corerl.training.grad_norm import clip_grad_norm
from corerl.training.hf_export import export_on_rank_zero
from corerl.training.logprobs import model_logprobs
from corerl.training.memory import optimizer_state_tensors, storage_bytes
from corerl.training.optim import build_optimizer, build_scheduler
from corerl.training.step_totals import StepTotals
from corerl_dtensor import parallelize

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class DTensorWorker(RankDeviceReport):
    """The rank-local half of the dtensor backend."""

    def __init__(self, *, rank: int, world_size: int, config: Config, threads: int | None = None) -> None:
        if threads:
            torch.set_num_threads(threads)
        _quiet_libraries()
        self.rank, self.world_size, self.config = rank, world_size, config
        self.settings = config.section("policy.dtensor_cfg")
        self.tp = self.settings.tensor_parallel_size
        self.dp = world_size // self.tp
        self.device = rank_device()
        self.param_dtype = DTYPES[config.core.policy.precision]
        self.mesh = None
        if world_size > 1:
            if not dist.is_initialized():
                backend = "nccl" if self.device.type == "cuda" else "gloo"
                dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size)
            from torch.distributed.device_mesh import init_device_mesh

            self.mesh = init_device_mesh(self.device.type, (self.dp, self.tp), mesh_dim_names=("dp", "tp"))
        self.model: nn.Module | None = None

    # -- set-up ------------------------------------------------------------------------

    def load_hf(self, model_path: str) -> None:
        from transformers import AutoModelForCausalLM

        policy = self.config.core.policy
        torch.manual_seed(self.config.core.algorithm.seed)
        extra = {}
        if policy.sequence_packing.enabled:  # packed rows: attention per sequence, not over the whole row
            from corerl.training.segment_attention import register

            extra["attn_implementation"] = register()
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, **extra).to(self.device)
        self.model_path = model_path
        self.hf_config = model.config
        if self.mesh is not None and self.tp > 1:
            plan = resolve(self.settings.custom_parallel_plan) if self.settings.custom_parallel_plan else None
            parallelize.apply_tensor_parallel(model, self.mesh["tp"], plan, self.settings.sequence_parallel)
        if self.settings.activation_checkpointing:
            parallelize.apply_activation_checkpointing(model)
        self.autocast = self.param_dtype != torch.float32
        self.fsdp1 = False
        if self.mesh is not None and self.settings.fsdp_version == 2:
            parallelize.apply_fsdp2(model, self.mesh["dp"], self.param_dtype, self.settings.cpu_offload)
            self.autocast = False
        elif self.mesh is not None:
            model = parallelize.apply_fsdp1(model, self.param_dtype, self.settings.cpu_offload, self.device)
            self.autocast = False
            self.fsdp1 = True
        self.model = model
        self.optimizer = build_optimizer(model.parameters(), policy.optimizer)
        self.scheduler = build_scheduler(self.optimizer, policy.scheduler, self.config.core.algorithm.max_steps)
        self.step = 0
        self.grad_bytes = 0

    def _require_model(self) -> nn.Module:
        if self.model is None:
            raise RuntimeError("load_hf() must be called before using the backend")
        return self.model

    def _forward_context(self) -> Any:
        if self.autocast:
            return torch.autocast(self.device.type, dtype=self.param_dtype)
        return contextlib.nullcontext()

    def _to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(self.device) for k, v in batch.items()}

    # -- work --------------------------------------------------------------------------

    def logprobs(self, mbs: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
        """Logprobs of each of this rank's micro-batches (planned by the driver)."""
        model = self._require_model()
        model.eval()
        with torch.no_grad(), self._forward_context():
            return [model_logprobs(model, self._to_device(mb)).float().cpu() for mb in mbs]

    def train_step(self, mbs: list[dict[str, torch.Tensor]], loss_fn: Any, normaliser: float) -> dict[str, Any]:
        """One optimizer step over this rank's micro-batches, gradients accumulated."""
        model = self._require_model()
        model.train()
        mbs = [self._to_device(mb) for mb in mbs]
        totals = StepTotals()
        sync = getattr(model, "set_requires_gradient_sync", None)  # FSDP2: reduce once per step
        for index, mb in enumerate(mbs):
            if sync is not None:
                sync(index == len(mbs) - 1)
            with self._forward_context():
                logprobs = model_logprobs(model, mb)
            loss, mb_metrics = loss_fn(logprobs, mb, normaliser)
            # FSDP averages gradients over the dp ranks; the loss is a sum over ranks.
            (loss * self.dp).backward()
            totals.add(loss, mb_metrics)
        total, metrics = totals.result()
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
        self.step += 1
        return {"loss": total, "grad_norm": grad_norm, "lr": lr, "step": self.step, "metrics": metrics}

    # -- checkpoints -------------------------------------------------------------------

    def save_checkpoint(self, path: str) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model = self._require_model()
        model_sd, optim_sd = get_state_dict(model, self.optimizer)
        dcp.save(
            {"model": model_sd, "optim": optim_sd}, checkpoint_id=os.path.join(path, "weights"),
            no_dist=not dist.is_initialized(),
        )
        extra = {"scheduler": self.scheduler.state_dict(), "step": self.step, "rng": capture_rng()}
        torch.save(extra, os.path.join(path, f"rank{self.rank}.pt"))
        barrier()

    def load_checkpoint(self, path: str) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model = self._require_model()
        model_sd, optim_sd = get_state_dict(model, self.optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=os.path.join(path, "weights"), no_dist=not dist.is_initialized())
        set_state_dict(model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        extra = torch.load(os.path.join(path, f"rank{self.rank}.pt"), weights_only=False)
        self.scheduler.load_state_dict(extra["scheduler"])
        self.step = extra["step"]
        restore_rng(extra["rng"])
        barrier()

    # -- weights out -------------------------------------------------------------------

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Every rank must call this; rank 0 gets the full weights (Hugging Face names, on CPU)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        model = self._require_model()
        if self.fsdp1:  # torch's generic full-state-dict path crashes FSDP1 on CPU; use FSDP1's own
            from torch.distributed.fsdp import FullStateDictConfig, StateDictType
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            with warnings.catch_warnings():  # "state_dict_type is being deprecated": still FSDP1's own way
                warnings.simplefilter("ignore", FutureWarning)
                with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=True)):
                    state = model.state_dict()
        else:
            state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {k: v.detach().cpu() for k, v in state.items()} if self.rank == 0 else None

    def export_hf(self, path: str) -> None:
        export_on_rank_zero(self.rank, self.full_state_dict(), self.hf_config, self.model_path, path)

    # -- memory ------------------------------------------------------------------------

    def offload(self, parts: list[str]) -> None:
        self._move(torch.device("cpu"), parts)

    def reload(self, parts: list[str]) -> None:
        self._move(self.device, parts)

    def _move(self, device: torch.device, parts: list[str]) -> None:
        if self.device.type == "cpu":
            log.info("dtensor rank %d: moving %s is a no-op on CPU", self.rank, " and ".join(parts))
            return
        model = self._require_model()
        if "parameters" in parts:
            model.to(device)
        if "optimizer" in parts:
            for state in self.optimizer.state.values():
                for key, value in state.items():
                    if isinstance(value, torch.Tensor) and value.dim() > 0:
                        state[key] = value.to(device, non_blocking=True)
        if device.type == "cpu":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def state_bytes(self) -> dict[str, int]:
        """Bytes this rank holds for parameters (its shards), gradients (at the last step, before
        the optimizer ran) and optimizer state (see bench/memory.py)."""
        model = self._require_model()
        return {"parameters": storage_bytes(model.parameters()), "gradients": self.grad_bytes,
                "optimizer": storage_bytes(optimizer_state_tensors(self.optimizer))}

    def pid(self) -> int:
        return os.getpid()

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def _quiet_libraries() -> None:
    """No per-load progress bars from transformers; no per-step DTensor redistribution notes; no
    note per checkpoint that a world-size-1 save runs in one process (it is meant to)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

