"""One rank of the megatron backend: its GPTModel stage and shard, megatron's optimizer and
schedule, and the work on them. Every rank is a Ray actor (megatron-core keeps process-wide
parallel state), laid out by megatron-core's parallel_state (TP innermost, then PP, then DP)."""

from __future__ import annotations

import logging
import os
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import torch

from corerl.config import Config
from corerl.distributed.devices import RankDeviceReport, rank_device
from corerl.distributed.rank_state import barrier, capture_rng, restore_rng
from corerl.training.logprobs import token_logprobs

log = logging.getLogger(__name__)

# megatron-core's import-time and per-call notices that say nothing about this run: the optional
# CUDA packages it falls back from, and CUDA-only tuning advice
_QUIET = (r".*(Apex|Transformer Engine).* not installed.*", r".*CUDA_DEVICE_MAX_CONNECTIONS.*",
          r".*all_gather_into_tensor. is deprecated.*", r".*full scope is deprecated.*")


class MegatronWorker(RankDeviceReport):
    """The rank-local half of the megatron backend."""

    def __init__(self, *, rank: int, world_size: int, config: Config, threads: int | None = None,
                 checkpoint_dir: str | None = None) -> None:
        if threads:
            torch.set_num_threads(threads)
        for pattern in _QUIET:
            warnings.filterwarnings("ignore", message=pattern)
        from corerl_megatron.parallel import init_parallel

        self.rank, self.world_size, self.config = rank, world_size, config
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.settings = config.section("policy.megatron_cfg")
        s = self.settings
        self.device = rank_device()  # the GPU of this rank's Ray bundle, else the CPU
        init_parallel(rank=rank, world_size=world_size, tensor=s.tensor_model_parallel_size,
                      pipeline=s.pipeline_model_parallel_size, context=s.context_parallel_size,
                      expert=s.expert_model_parallel_size, seed=config.core.algorithm.seed)
        from megatron.core import parallel_state as ps

        self.ps = ps
        self.tp_rank, self.tp = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
        self.dp = ps.get_data_parallel_world_size()
        self.model: Any = None

    # -- set-up ------------------------------------------------------------------------

    def load_hf(self, model_path: str) -> None:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from safetensors.torch import load_file

        from corerl_megatron.conversion import WEIGHTS, ensure_converted, load_hf_model_config
        from corerl_megatron.model import build_gpt, transformer_config
        from corerl_megatron.sharding import layer_numbering, partition_dim

        torch.manual_seed(self.config.core.algorithm.seed)
        hf, self.family, self.shape = load_hf_model_config(model_path, self.settings.converter_type)
        self.hf_config, self.model_path = hf, model_path
        convert = partial(ensure_converted, model_path, converter_type=self.settings.converter_type, root=self.checkpoint_dir)
        folder = convert(force=self.settings.force_reconvert_from_hf) if self._first_in_node() else None
        barrier()  # one rank converts; the others then find the complete conversion
        if folder is None:
            folder = convert()
        full = load_file(str(folder / WEIGHTS))
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
        self.mconfig = transformer_config(
            hf, self.settings, dtype[self.config.core.policy.precision], tensor_parallel=self.tp,
            pipeline_parallel=self.settings.pipeline_model_parallel_size, qkv_bias=self.shape.qkv_bias)
        model = build_gpt(hf, self.mconfig, pre_process=self.ps.is_pipeline_first_stage(),
                          post_process=self.ps.is_pipeline_last_stage())
        if self.settings.freeze_moe_router:
            self._freeze_routers(model)
        self.numbering = layer_numbering(model)
        self.partition = {}
        for name, param in model.named_parameters():
            self.partition[name] = partition_dim(full[self._source_name(name)].shape, param.shape)
            # megatron marks these while initialising weights, which conversion skips; its grad
            # norm counts a tensor-parallel-duplicated parameter once by them
            dim = self.partition[name]
            param.tensor_model_parallel = dim is not None
            param.partition_dim = dim if dim is not None else -1
            param.partition_stride = 1
        self._copy_in(model, full)
        ddp = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                            use_distributed_optimizer=False)
        self.model = DistributedDataParallel(self.mconfig, ddp, model)
        self._build_optimizer()
        self.step = 0

    def _freeze_routers(self, model: Any) -> None:
        """``freeze_moe_router``: the MoE routers' weights take no gradient (set before DDP
        builds its gradient buffers, which then leave them out)."""
        routers = [name for name, param in model.named_parameters() if ".router." in name]
        for name, param in model.named_parameters():
            if name in routers:
                param.requires_grad_(False)
        if not routers:
            log.info("megatron rank %d: freeze_moe_router is set but the model has no MoE router", self.rank)

    def _source_name(self, local_name: str) -> str:
        """The global Megatron name a local parameter is cut from."""
        from corerl_megatron.model import spec_neutral_name
        from corerl_megatron.sharding import renumber

        name = spec_neutral_name(renumber(local_name, self.numbering))
        # tied embeddings: the last pipeline stage's copy of the word embeddings is the same tensor
        if name == "output_layer.weight" and self.shape.tied:
            return "embedding.word_embeddings.weight"
        return name

    def _copy_in(self, module: Any, full: dict[str, torch.Tensor]) -> None:
        """This rank's shard of every parameter of ``module`` from the full Megatron state."""
        from corerl_megatron.sharding import shard

        names = {name for name, _ in module.named_parameters()}
        local = {name: shard(name, full[self._source_name(name)], self.partition[name], self.tp_rank, self.tp)
                 for name in names}
        missing, unexpected = module.load_state_dict(local, strict=False)
        missing = [m for m in missing if not m.endswith("_extra_state")]
        if missing or unexpected:
            raise RuntimeError(f"megatron rank {self.rank}: missing {missing[:3]}, unexpected {unexpected[:3]}")

    def load_weights(self, full: dict[str, torch.Tensor]) -> None:
        """Replace the model's weights in place from a full Megatron state (a refit from elsewhere)."""
        with torch.no_grad():
            self._copy_in(self.model.module, full)
        if hasattr(self.optimizer, "reload_model_params"):  # bf16: the fp32 main copies follow
            self.optimizer.reload_model_params()

    def _build_optimizer(self) -> None:
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

        opt, sched = self.settings.optimizer, self.settings.scheduler
        self.optimizer = get_megatron_optimizer(OptimizerConfig(
            optimizer=opt.optimizer, lr=opt.lr, min_lr=opt.min_lr, weight_decay=opt.weight_decay,
            adam_beta1=opt.adam_beta1, adam_beta2=opt.adam_beta2, adam_eps=opt.adam_eps,
            sgd_momentum=opt.sgd_momentum, clip_grad=opt.clip_grad, bf16=self.mconfig.bf16,
            params_dtype=self.mconfig.params_dtype, use_distributed_optimizer=opt.use_distributed_optimizer,
        ), [self.model])
        total = self.config.core.algorithm.max_steps
        self.scheduler = OptimizerParamScheduler(
            self.optimizer, init_lr=0.0 if sched.lr_warmup_iters else opt.lr, max_lr=opt.lr, min_lr=opt.min_lr,
            lr_warmup_steps=sched.lr_warmup_iters, lr_decay_steps=sched.lr_decay_iters or total,
            lr_decay_style=sched.lr_decay_style, start_wd=opt.weight_decay, end_wd=opt.weight_decay,
            wd_incr_steps=total, wd_incr_style="constant",
        )
        # megatron's warm-up gives step 0 the initial lr (0): count the first step as 1, so every
        # optimizer step learns (warm-up w: lr/w, 2 lr/w, ... lr)
        self.scheduler.step(increment=1)

    def _first_in_node(self) -> bool:
        return int(os.environ.get("LOCAL_RANK", self.rank)) == 0

    # -- work --------------------------------------------------------------------------

    def _run(self, mbs: list[dict[str, torch.Tensor]], loss_fn: Any, normaliser: float, forward_only: bool) -> list[Any]:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        count, width = len(mbs), int(mbs[0]["input_ids"].shape[1])
        scale = count * self.dp  # the schedule divides by the micro-batch count, DDP averages over dp

        def forward_step(data: Any, model: Any) -> tuple[torch.Tensor, Any]:
            mb = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in next(data).items()}
            ids = mb["input_ids"]
            positions = torch.arange(ids.shape[1], device=self.device).expand_as(ids)
            output = model(ids, positions, attention_mask=None)
            return output, partial(self._loss, mb, loss_fn, normaliser, scale, forward_only)

        self.mconfig.finalize_model_grads_func = None if forward_only else _finalize
        return get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(mbs), model=[self.model], num_microbatches=count,
            seq_length=width, micro_batch_size=int(mbs[0]["input_ids"].shape[0]), forward_only=forward_only,
        )

    @staticmethod
    def _loss(mb: dict[str, torch.Tensor], loss_fn: Any, normaliser: float, scale: float, forward_only: bool,
              logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        logprobs = token_logprobs(logits, mb["input_ids"], mb["attention_mask"])
        if forward_only:
            return logits.new_zeros(()), {"logprobs": logprobs.detach().float().cpu()}
        loss, metrics = loss_fn(logprobs, mb, normaliser)
        return loss * scale, {"loss": float(loss.detach()), "metrics": metrics}

    def _empty_unused_memory(self, level: int) -> None:
        """megatron's ``empty_unused_memory_level``: 1 empties the CUDA cache after the forward and
        backward passes, 2 after the optimizer step as well (nothing to empty on the CPU)."""
        if self.settings.empty_unused_memory_level >= level and torch.cuda.is_available():
            torch.cuda.empty_cache()

    def logprobs(self, mbs: list[dict[str, torch.Tensor]]) -> list[torch.Tensor] | None:
        self.model.eval()
        with torch.no_grad():
            out = self._run(mbs, None, 1.0, forward_only=True)
        return [o["logprobs"] for o in out] if self.ps.is_pipeline_last_stage() else None

    def train_step(self, mbs: list[dict[str, torch.Tensor]], loss_fn: Any, normaliser: float) -> dict[str, Any]:
        self.model.train()
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        out = self._run(mbs, loss_fn, normaliser, forward_only=False)
        self._empty_unused_memory(1)
        lr = self.optimizer.param_groups[0]["lr"]
        _, grad_norm, _ = self.optimizer.step()
        self._empty_unused_memory(2)
        self.scheduler.step(increment=1)
        self.step += 1
        metrics: dict[str, float] = {}
        for o in out:
            for key, value in o["metrics"].items():
                metrics[key] = metrics.get(key, 0.0) + float(value)
        last = self.ps.is_pipeline_last_stage()
        return {"loss": sum(o["loss"] for o in out) if last else None, "grad_norm": float(grad_norm or 0.0),
                "lr": lr, "step": self.step, "metrics": metrics if last else None}

    # -- generation --------------------------------------------------------------------

    def generate(self, rows: list[list[int]], sampling: Any, stop_ids: list[int]) -> list[Any] | None:
        """Completions of this data-parallel group's ``rows`` (see :mod:`corerl_megatron.decode`);
        returned by the rank that reports, None elsewhere."""
        from megatron.core.inference import contexts  # noqa: F401  (loaded before the redirect below)

        from corerl_megatron import cpu_redirect
        from corerl_megatron.decode import decode_rows

        cpu_redirect.install()  # the KV cache is allocated on torch.cuda.current_device()
        if self.mconfig.sequence_parallel:
            raise RuntimeError("megatron generation does not run with sequence_parallel (a decode step "
                               "is one token wide); set policy.megatron_cfg.sequence_parallel=false")
        self.model.eval()
        with torch.no_grad():
            out = decode_rows(rows, sampling, stop_ids, self._last_logits, self._share_tokens,
                              self._kv_bytes_per_token(), self._kv_budget_bytes(), self.device) if rows else []
        return out if self.coordinates()["reports"] else None

    def _kv_bytes_per_token(self) -> int:
        """KV-cache bytes of one cached token of one row on a rank (the same on every rank)."""
        pp = self.settings.pipeline_model_parallel_size
        layers = -(-self.shape.num_layers // pp)
        kv_heads = max(1, self.shape.num_kv_heads // self.tp)
        size = torch.empty((), dtype=self.mconfig.params_dtype).element_size()
        return 2 * layers * kv_heads * self.shape.head_dim * size

    def _kv_budget_bytes(self) -> float:
        return self.config.section("policy.generation.mcore_generation_config").buffer_size_gb * 2**30

    def _last_logits(self, ids: torch.Tensor, positions: torch.Tensor, cache: Any) -> torch.Tensor | None:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        def forward_step(data: Any, model: Any) -> tuple[torch.Tensor, Any]:
            next(data)
            logits = model(ids, positions, attention_mask=None, inference_context=cache, runtime_gather_output=True)
            return logits, lambda out: (out.new_zeros(()), {"logits": out[:, -1].float()})

        self.mconfig.finalize_model_grads_func = None
        out = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter([None]), model=[self.model], num_microbatches=1,
            seq_length=int(ids.shape[1]), micro_batch_size=int(ids.shape[0]), forward_only=True,
        )
        return out[0]["logits"] if self.ps.is_pipeline_last_stage() else None

    def _share_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.ps.get_pipeline_model_parallel_world_size() > 1:
            import torch.distributed as dist

            dist.broadcast(tokens, src=self.ps.get_pipeline_model_parallel_last_rank(),
                           group=self.ps.get_pipeline_model_parallel_group())
        return tokens

    # -- checkpoints -------------------------------------------------------------------

    def save_checkpoint(self, path: str) -> None:
        """Each rank writes its shard, optimizer and scheduler state, RNG and step."""
        state = {"model": self.model.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict(), "step": self.step, "rng": capture_rng()}
        torch.save(state, os.path.join(path, f"megatron_rank{self.rank}.pt"))
        barrier()

    def load_checkpoint(self, path: str) -> None:
        state = torch.load(os.path.join(path, f"megatron_rank{self.rank}.pt"), weights_only=False,
                           map_location=self.device)
        self.model.module.load_state_dict(state["model"], strict=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.num_steps = 0  # its load_state_dict steps forward by the saved count
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = state["step"]
        restore_rng(state["rng"])
        barrier()

    # -- memory ------------------------------------------------------------------------

    def offload(self, parts: list[str]) -> None:
        if not torch.cuda.is_available():
            log.info("megatron rank %d: moving %s is a no-op on CPU", self.rank, " and ".join(parts))
            return
        if "optimizer" in parts and hasattr(self.optimizer, "offload_to_cpu"):
            self.optimizer.offload_to_cpu()
        torch.cuda.empty_cache()

    def reload(self, parts: list[str]) -> None:
        if torch.cuda.is_available() and "optimizer" in parts and hasattr(self.optimizer, "restore_from_cpu"):
            self.optimizer.restore_from_cpu()

    def state_bytes(self) -> dict[str, int]:
        """Bytes this rank holds for parameters (its shards), gradients (megatron's gradient
        buffer) and optimizer state, fp32 main copies included (see bench/memory.py)."""
        from corerl.training.memory import optimizer_state_tensors, storage_bytes

        module = self.model.module
        mains = [p for group in getattr(self.optimizer, "fp32_from_float16_groups", None) or [] for p in group]
        return {"parameters": storage_bytes(module.parameters()),
                "gradients": storage_bytes(getattr(p, "main_grad", None) for p in module.parameters()),
                "optimizer": storage_bytes([*optimizer_state_tensors(self.optimizer), *mains])}

    def coordinates(self) -> dict[str, Any]:
        """This rank's data-parallel index, and whether it reports losses and logprobs (the last
        pipeline stage's first tensor-parallel rank)."""
        return {"dp": self.ps.get_data_parallel_rank(),
                "reports": self.ps.is_pipeline_last_stage() and self.tp_rank == 0}

    # -- weights out -------------------------------------------------------------------

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Every rank must call this; each pipeline stage's first tensor-parallel rank returns
        its stage's full tensors with global Megatron names (the driver merges the stages)."""
        from corerl_megatron.model import spec_neutral_name
        from corerl_megatron.sharding import gather, renumber

        module = self.model.module
        group = self.ps.get_tensor_model_parallel_group()
        out = {}
        for name, param in module.named_parameters():
            full = gather(name, param.detach(), self.partition[name], group, self.tp)
            out[spec_neutral_name(renumber(name, self.numbering))] = full.cpu()
        if self.shape.tied:
            out.pop("output_layer.weight", None)
        keep = self.tp_rank == 0 and self.ps.get_data_parallel_rank() == 0
        return out if keep else None

    def pid(self) -> int:
        return os.getpid()

    def shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _finalize(*args: Any, **kwargs: Any) -> None:
    from megatron.core.distributed import finalize_model_grads

    finalize_model_grads(*args, **kwargs)
