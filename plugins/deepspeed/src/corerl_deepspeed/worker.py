"""One rank of the deepspeed backend: a DeepSpeed engine (ZeRO stage 0-3) around the
Hugging Face model, and the work on it. Every rank is a Ray actor (DeepSpeed keeps
process-wide communication state), data parallel over all ranks."""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from typing import Any

import torch

from corerl.config import Config
from corerl.distributed.devices import RankDeviceReport, local_gpu_index, rank_device
from corerl.distributed.rank_state import barrier, capture_rng, restore_rng
from corerl.training.logprobs import model_logprobs
from corerl.training.step_totals import StepTotals
from corerl_deepspeed.memory import gradient_bytes

log = logging.getLogger(__name__)

# DeepSpeed's notices that say nothing about this run
_QUIET = (r".*all_gather_into_tensor. is deprecated.*", r".*reduce_scatter_tensor. is deprecated.*")


def _prepare_deepspeed(on_gpu: bool) -> Any:
    """Import DeepSpeed for this machine. Without a GPU: the CPU accelerator, and no shared-memory
    all-reduce op (DeepSpeed would JIT-compile it for about 85 s in every fresh environment;
    gloo does the reductions training needs)."""
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if on_gpu else "cpu")
    if on_gpu:
        from corerl_deepspeed.cuda_arch import fix_arch_list_for_deepspeed

        fix_arch_list_for_deepspeed()  # before any op is JIT-built
    import deepspeed

    if not on_gpu:
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    for name in ("DeepSpeed", "deepspeed"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return deepspeed


class DeepSpeedWorker(RankDeviceReport):
    """The rank-local half of the deepspeed backend."""

    def __init__(self, *, rank: int, world_size: int, config: Config, threads: int | None = None) -> None:
        if threads:
            torch.set_num_threads(threads)
        for pattern in _QUIET:
            warnings.filterwarnings("ignore", message=pattern)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.rank, self.world_size, self.config = rank, world_size, config
        self.settings = config.section("policy.deepspeed_cfg")
        self.on_gpu = torch.cuda.is_available()
        self.device = rank_device()  # the GPU of this rank's Ray bundle (the one it sees), else the CPU
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(local_gpu_index()))
        self.deepspeed = _prepare_deepspeed(self.on_gpu)
        self.deepspeed.init_distributed(dist_backend="nccl" if self.on_gpu else "gloo", verbose=False,
                                        rank=rank, world_size=world_size)
        self.engine: Any = None

    # -- set-up ------------------------------------------------------------------------

    def load_hf(self, model_path: str) -> None:
        from transformers import AutoModelForCausalLM

        from corerl.training.optim import build_optimizer, build_scheduler
        from corerl_deepspeed.ds_config import build_ds_config

        policy = self.config.core.policy
        torch.manual_seed(self.config.core.algorithm.seed)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.model_path, self.hf_config = model_path, model.config
        if self.engine is not None:  # a reload (e.g. after SFT): free the old engine's partitions first
            self.engine.destroy()
            self.engine = None
        optimizer = None if self.settings.use_deepspeed_optimizer else build_optimizer(model.parameters(), policy.optimizer)
        total = self.config.core.algorithm.max_steps
        self.engine, self.optimizer, _, self.scheduler = self.deepspeed.initialize(
            model=model, optimizer=optimizer, config=build_ds_config(self.config, self.on_gpu),
            lr_scheduler=lambda opt: build_scheduler(opt, policy.scheduler, total),
        )
        self.step = 0
        self.grad_bytes = 0

    def _to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(self.device) for k, v in batch.items()}

    # -- work --------------------------------------------------------------------------

    def logprobs(self, mbs: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
        """Logprobs of each of this rank's micro-batches (planned by the driver)."""
        self.engine.eval()
        with torch.no_grad():
            return [model_logprobs(self.engine, self._to_device(mb)).float().cpu() for mb in mbs]

    def train_step(self, mbs: list[dict[str, torch.Tensor]], loss_fn: Any, normaliser: float) -> dict[str, Any]:
        """One optimizer step over this rank's micro-batches: gradients accumulate until the last
        one, where DeepSpeed reduces (and partitions) them and steps."""
        engine = self.engine
        engine.train()
        totals = StepTotals()
        for index, mb in enumerate(mbs):
            engine.set_gradient_accumulation_boundary(index == len(mbs) - 1)
            mb = self._to_device(mb)
            logprobs = model_logprobs(engine, mb)
            loss, mb_metrics = loss_fn(logprobs, mb, normaliser)
            # DeepSpeed averages gradients over the ranks; the loss is a sum over them
            engine.backward(loss * self.world_size, scale_wrt_gas=False)
            totals.add(loss, mb_metrics)
        total, metrics = totals.result()
        lr = self.scheduler.get_last_lr()[0]
        self.grad_bytes = gradient_bytes(engine)  # gradients live now; after the step some are freed
        engine.step()
        self.step += 1
        grad_norm = engine.get_global_grad_norm()
        return {"loss": total, "grad_norm": float(grad_norm) if grad_norm is not None else 0.0, "lr": lr,
                "step": self.step, "metrics": metrics}

    # -- checkpoints -------------------------------------------------------------------

    def save_checkpoint(self, path: str) -> None:
        """DeepSpeed's own checkpoint (model, partitioned optimizer, scheduler), plus the step and
        this rank's RNG state."""
        self.engine.save_checkpoint(path, tag="deepspeed", client_state={"step": self.step}, save_latest=False)
        torch.save(capture_rng(), os.path.join(path, f"rng_rank{self.rank}.pt"))
        barrier()

    def load_checkpoint(self, path: str) -> None:
        _, client = self.engine.load_checkpoint(path, tag="deepspeed", load_optimizer_states=True,
                                                load_lr_scheduler_states=True)
        self.step = client["step"]
        restore_rng(torch.load(os.path.join(path, f"rng_rank{self.rank}.pt"), weights_only=False))
        barrier()

    # -- weights out -------------------------------------------------------------------

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Every rank must call this; rank 0 gets the full weights (Hugging Face names, on CPU).
        Under ZeRO-3 each parameter is gathered from its shards in turn, so no rank ever holds
        more than one whole parameter beyond its own shards."""
        out: dict[str, torch.Tensor] = {}
        for name, param in self.engine.module.named_parameters(remove_duplicate=False):
            gathered = (self.deepspeed.zero.GatheredParameters([param], modifier_rank=None)
                        if self.settings.zero_stage == 3 else contextlib.nullcontext())
            with gathered:
                if self.rank == 0:
                    out[name] = param.detach().to("cpu", copy=True)
        return out if self.rank == 0 else None

    def export_hf(self, path: str) -> None:
        from corerl.training.hf_export import export_on_rank_zero

        export_on_rank_zero(self.rank, self.full_state_dict(), self.hf_config, self.model_path, path)

    # -- memory ------------------------------------------------------------------------

    def offload(self, parts: list[str]) -> None:
        if not self.on_gpu:
            log.info("deepspeed rank %d: moving %s is a no-op on CPU", self.rank, " and ".join(parts))
            return
        if self.settings.zero_stage != 3:
            log.info("deepspeed rank %d: offloading between phases needs ZeRO-3 (DeepSpeed's offload_states)", self.rank)
            return
        from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum

        kinds = []
        if "optimizer" in parts:
            kinds += [OffloadStateTypeEnum.optim_states, OffloadStateTypeEnum.lp_grads, OffloadStateTypeEnum.hp_params]
        if "parameters" in parts:
            kinds += [OffloadStateTypeEnum.lp_params]
        self.engine.offload_states(include=kinds)

    def reload(self, parts: list[str]) -> None:
        if self.on_gpu and self.settings.zero_stage == 3:
            self.engine.reload_states()

    def state_bytes(self) -> dict[str, int]:
        """Bytes this rank holds for parameters, gradients (at the last step's boundary) and
        optimizer state (see bench/memory.py)."""
        from corerl_deepspeed.memory import optimizer_bytes, parameter_bytes

        return {"parameters": parameter_bytes(self.engine, self.settings.zero_stage),
                "gradients": self.grad_bytes, "optimizer": optimizer_bytes(self.engine)}

    def pid(self) -> int:
        return os.getpid()

    def shutdown(self) -> None:
        import torch.distributed as dist

        if self.engine is not None:
            self.engine.destroy()
        if dist.is_initialized():
            dist.destroy_process_group()
