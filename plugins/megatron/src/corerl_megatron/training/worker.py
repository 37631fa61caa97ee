"""One rank of the megatron backend: its GPTModel stage and shard, megatron's optimizer and
schedule, and the work on them. Every rank is a Ray actor (megatron-core keeps process-wide
parallel state), laid out by megatron-core's parallel_state (TP innermost, then PP, then DP)."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Any

import torch

from corerl.sdk import TOPK_REQUEST, RankWorker, barrier, batch_logprobs, join_topk

# megatron-core's import-time and per-call notices that say nothing about this run: the optional
# CUDA packages it falls back from, and CUDA-only tuning advice
_QUIET = (r".*(Apex|Transformer Engine).* not installed.*", r".*CUDA_DEVICE_MAX_CONNECTIONS.*",
          r".*all_gather_into_tensor. is deprecated.*", r".*full scope is deprecated.*")


class MegatronWorker(RankWorker):
    """The rank-local half of the megatron backend. Its own schedule (megatron's pipeline
    forward/backward) replaces the template's micro-batch loop; the rest is the template's."""

    settings_key = "policy.megatron_cfg"
    quiet_warnings = _QUIET

    def setup(self, checkpoint_dir: str | None = None) -> None:
        from corerl_megatron.training.parallel import init_parallel

        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        s = self.settings
        init_parallel(rank=self.rank, world_size=self.world_size, tensor=s.tensor_model_parallel_size,
                      pipeline=s.pipeline_model_parallel_size, context=s.context_parallel_size,
                      expert=s.expert_model_parallel_size, seed=self.config.core.algorithm.seed)
        from megatron.core import parallel_state as ps

        self.ps = ps
        self.tp_rank, self.tp = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
        self.dp = ps.get_data_parallel_world_size()
        #: each row split over the context-parallel ranks (None without context parallelism)
        self.split: Any = None
        if ps.get_context_parallel_world_size() > 1:
            from corerl_megatron.training.context_parallel import SequenceSplit

            # with sequence parallelism each rank's share is split over the tensor-parallel ranks again
            self.split = SequenceSplit(ps.get_context_parallel_group(), ps.get_context_parallel_rank(),
                                       ps.get_context_parallel_world_size(),
                                       tensor_parallel=self.tp if s.sequence_parallel else 1)
        self.model: Any = None
        self.head: Any = None  # the output layer's tap (set by load_hf on a policy's last stage)
        #: the logits of every position through GPTModel's own output layer instead of the head's
        #: chunks at the positions that need them (a reference for tests and benches)
        self.full_logits = False
        self.head_chunk_elements: int | None = None  # None: response_head.CHUNK_ELEMENTS
        self.draft: Any = None  # the multi-token-prediction heads' draft loss (set by load_hf when it builds heads)
        self.routing: Any = None  # a mixture of experts' load counters and router replay (set by load_hf)
        self.replay: Any = None
        self.given_routes: Any = None  # router replay r3 (set by load_hf)
        self.vision: Any = None  # a vision-language model's inputs (corerl_megatron.training.vision; set by load_hf)

    # -- set-up ------------------------------------------------------------------------

    def load_hf(self, model_path: str) -> None:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from safetensors.torch import load_file

        from corerl_megatron.conversion.store import WEIGHTS, ensure_converted, load_hf_model_config
        from corerl_megatron.training.model import build_gpt, engine_spec_here, transformer_config
        from corerl_megatron.training.routing import GivenRoutes, RouteReplay, RoutingStats
        from corerl_megatron.training.stage_weights import StageWeights, freeze_routers

        torch.manual_seed(self.config.core.algorithm.seed)
        hf, self.family, self.shape = load_hf_model_config(model_path, self.settings.converter_type)
        self.hf_config, self.model_path = hf, model_path
        if self.lora and self.shape.experts:  # validation says so where it can read the model's config
            from corerl.sdk import EngineNotAvailable

            raise EngineNotAvailable(f"{model_path} is a mixture of experts; the megatron backend's LoRA adapts dense "
                                     "decoder layers only (adapters on expert layers are not wired)",
                                     key="policy.lora.enabled", hint="train this model's LoRA with "
                                     "policy.training_backend=dtensor, or train it whole (policy.lora.enabled=false)")
        convert = partial(ensure_converted, model_path, converter_type=self.settings.converter_type, root=self.checkpoint_dir)
        folder = convert(force=self.settings.force_reconvert_from_hf) if self._first_in_node() else None
        barrier()  # one rank converts; the others then find the complete conversion
        if folder is None:
            folder = convert()
        full = load_file(str(folder / WEIGHTS))
        if self.shape.value_head != self.critic:
            have, role = ("a value model", "a policy") if self.shape.value_head else ("a causal LM", "a critic")
            raise ValueError(f"{model_path} holds {have}, and this megatron backend was built as {role}")
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
        moe = self.config.core.policy.moe
        self.mconfig = transformer_config(
            hf, self.settings, dtype[self.config.core.policy.precision], tensor_parallel=self.tp,
            pipeline_parallel=self.settings.pipeline_model_parallel_size, qkv_bias=self.shape.qkv_bias, moe=moe)
        from corerl_megatron.training.mtp import DraftHeads, heads_to_build

        heads = 0 if self.critic else heads_to_build(self.settings.mtp_num_layers, self.shape.mtp_layers, model_path,
                                                     lora=self.lora, stages=self.settings.pipeline_model_parallel_size,
                                                     repeated=self.settings.mtp_use_repeated_layer)
        local_spec = self.lora or self.config.core.policy.sequence_packing.enabled
        if self.split is not None and not engine_spec_here(local_spec):  # validation refuses what gets here
            from corerl.sdk import EngineNotAvailable

            raise EngineNotAvailable("context parallelism runs in Transformer Engine's attention, and this model "
                                     "would be built on megatron-core's local layer spec (no GPU, no "
                                     "transformer_engine, or LoRA or packed rows)",
                                     key="policy.megatron_cfg.context_parallel_size", hint="set it to 1")
        model = build_gpt(hf, self.mconfig, pre_process=self.ps.is_pipeline_first_stage(),
                          post_process=self.ps.is_pipeline_last_stage(), value_head=self.shape.value_head,
                          local_spec=local_spec,  # packed rows: the local spec's attention takes their mask
                          mtp_layers=heads, mtp_repeated=self.settings.mtp_use_repeated_layer)
        self.draft = DraftHeads(model, self.settings) if heads else None  # multi-token-prediction heads
        from corerl_megatron.training.response_head import HiddenTap

        # the policy's last stage: logprobs at the positions that need them, through the head in chunks
        self.head = HiddenTap(model) if not self.critic and self.ps.is_pipeline_last_stage() else None
        if self.draft is not None:  # the heads' teacher: the trunk's distribution from its hidden states
            self.draft.tap = self.head
        if self.shape.experts and (moe.freeze_router or self.settings.freeze_moe_router):
            freeze_routers(model)
        from corerl_megatron.training.vision import VisionInputs, is_vision_language

        self.vision = VisionInputs(hf) if is_vision_language(hf) else None
        frozen_tower = self.config.core.policy.freeze_vision_tower is not False  # unset: frozen (RL's default)
        if self.vision is not None and frozen_tower and hasattr(model, "vision_model"):
            model.vision_model.requires_grad_(False)  # before DDP: no gradient buffers, no optimizer state
        self.ep = self.ps.get_expert_model_parallel_world_size() if self.shape.experts else 1
        self.layout = StageWeights.of(model, full, self.shape.tied, self.tp_rank, self.tp,
                                      self.ps.get_expert_model_parallel_rank() if self.shape.experts else 0,
                                      self.shape.experts // self.ep)
        self.routing = RoutingStats(model, self.mconfig) if self.shape.experts else None
        self.replay = RouteReplay() if self.shape.experts and moe.router_replay == "r2" else None
        self.given_routes = (GivenRoutes(model, self.tp_rank, self.tp, bool(self.settings.sequence_parallel))
                             if self.shape.experts and moe.router_replay == "r3" and not self.critic else None)
        # the router's loss terms weighted by each micro-batch's share of the step's loss tokens, as
        # on every backend (corerl.training.moe_router), not megatron's 1 / micro-batches
        self.share_weighted_router_terms = bool(self.shape.experts) and (moe.aux_loss_coeff > 0 or moe.z_loss_coeff > 0)
        self.router_term_weight = 1.0
        self.layout.copy_in(model, full)
        if self.lora:  # before DDP and the optimizer: only the adapters get gradient buffers and state
            from corerl_megatron.training.lora import attach

            attach(model, self.config.core.policy.lora, self.layout.numbering, hf.num_hidden_layers,
                   tp_rank=self.tp_rank, tp=self.tp, seed=self.config.core.algorithm.seed,
                   fused=self.settings.lora_type == "lora")
        ddp = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                            use_distributed_optimizer=False)
        self.model = DistributedDataParallel(self.mconfig, ddp, model)
        from corerl_megatron.training.optimizer import build_optimizer

        self.optimizer, self.scheduler = build_optimizer(self.settings, self.mconfig, self.model,
                                                         self.config.core.algorithm.max_steps)
        self.step = 0

    def load_weights(self, full: dict[str, torch.Tensor]) -> None:
        """Replace the model's weights in place from a full Megatron state (a refit from elsewhere)."""
        with torch.no_grad():
            self.layout.copy_in(self.model.module, full)
        if hasattr(self.optimizer, "reload_model_params"):  # bf16: the fp32 main copies follow
            self.optimizer.reload_model_params()

    def _first_in_node(self) -> bool:
        return int(os.environ.get("LOCAL_RANK", self.rank)) == 0

    # -- work --------------------------------------------------------------------------

    def _run(self, mbs: list[dict[str, torch.Tensor]], loss_fn: Any, normaliser: float, forward_only: bool) -> list[Any]:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        from corerl_megatron.training.packed_rows import is_packed, same_width, segment_mask

        packed = is_packed(mbs)
        if packed:  # one shape for the schedule: every packed row as wide as the widest
            mbs = same_width(mbs)
        count, width = len(mbs), int(mbs[0]["input_ids"].shape[1])
        split = self.split  # context parallelism: this rank runs its chunks of each row
        scale = count * self.dp  # the schedule divides by the micro-batch count, DDP averages over dp
        weighted = self.share_weighted_router_terms and not forward_only
        tap = self.head if self.head is not None and not self.full_logits else None

        def forward_step(data: Any, model: Any) -> tuple[torch.Tensor, Any]:
            mb = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in next(data).items()}
            if weighted:  # megatron scales the router terms' gradient by grad_scale_func(1) / count
                self.router_term_weight = float(mb["loss_mask"][:, 1:].sum()) / normaliser * scale
            ids = mb["input_ids"]
            positions = torch.arange(ids.shape[1], device=self.device).expand_as(ids)
            mask = None  # causal: right padding never reaches a real token
            padding = mb["attention_mask"] == 0
            if split is not None:  # the rotary embeddings take this rank's positions in the same layout
                ids, padding = split.local(ids), split.local(mb["attention_mask"]) == 0  # the row's padding too
                positions = split.positions(width, self.device).expand_as(ids)
            if packed:  # each sequence sees itself only, rotated from its own position 0
                positions, mask = mb["position_ids"], segment_mask(mb["position_ids"])
                self._restarted_rope().positions = positions
            images: dict[str, Any] = {}
            if self.vision is not None:  # multimodal rotary positions; the image features in the first stage's input
                positions, decoder_input = self.vision.inputs(model.module, mb, self.ps.is_pipeline_first_stage())
                if decoder_input is not None:
                    images["decoder_input"] = decoder_input
            if self.replay is not None and not forward_only:
                self.replay.replay(mb)
            if self.given_routes is not None:  # r3: the generation engine's experts, in both passes
                self.given_routes.replay(mb, split)
            if tap is not None:  # the model's output: its final hidden states, not logits
                tap.active = True
            try:
                if self.mconfig.num_moe_experts:  # the routers (their losses, load and dropping) skip the padding
                    output = model(ids, positions, attention_mask=mask, padding_mask=padding, **images)
                else:
                    output = model(ids, positions, attention_mask=mask, **images)
            finally:
                if tap is not None:
                    tap.active = False
                if packed:
                    self._restarted_rope().positions = None
            if self.replay is not None and forward_only and not self.critic:
                self.replay.keep(mb)
            # grad_scale_func also scales the main loss in the backward: the loss is divided by it first
            divisor = self.router_term_weight if weighted and self.router_term_weight > 0 else 1.0
            head = (tap, self.head_chunk_elements) if tap is not None else None
            loss = partial(self._loss, mb, loss_fn, normaliser, scale / divisor, forward_only, self.critic, head)
            if split is not None:  # the last stage's output, every rank's positions in row order, whole rows
                return output, partial(self._whole_rows_loss, split, width, loss)
            return output, loss

        self.mconfig.finalize_model_grads_func = None if forward_only else _finalize
        self.mconfig.grad_scale_func = (lambda t: t * self.router_term_weight) if weighted else None
        return get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(mbs), model=[self.model], num_microbatches=count,
            seq_length=split.padded(width) if split is not None else width,  # megatron divides it by cp
            micro_batch_size=int(mbs[0]["input_ids"].shape[0]), forward_only=forward_only,
        )

    def _restarted_rope(self) -> Any:
        """The rotary-position hook packed rows use, on the model this rank holds now (made at its first
        packed call)."""
        rope = getattr(self, "restarted_rope", None)
        if rope is None or rope.gpt is not self.model.module:
            from corerl_megatron.training.packed_rows import RestartedRope

            rope = self.restarted_rope = RestartedRope(self.model.module)
        return rope

    @staticmethod
    def _whole_rows_loss(split: Any, width: int, loss: Any, mine: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        """``loss`` of the rows whole (context parallelism): every rank's output gathered into row order.
        Divided by the context-parallel size: megatron's schedule multiplies a loss by it (its own
        losses are each rank's chunks'), and this one, on every rank, is the whole rows'."""
        value, out = loss(split.gather(mine, width))
        return value / split.size, out

    @staticmethod
    def _loss(mb: dict[str, torch.Tensor], loss_fn: Any, normaliser: float, scale: float, forward_only: bool,
              critic: bool, head: Any, logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        """The micro-batch's loss (or, forward only, its logprobs or values) from the model's output:
        logits, or with ``head`` (the output layer's tap and the chunk size) the final hidden states."""
        from corerl.sdk import needed_positions
        from corerl_megatron.training.packed_rows import scored_positions
        from corerl_megatron.training.response_head import head_logprobs

        if critic:  # a value head's one output per token: values lined up with the logprobs
            from corerl.sdk import shift_values

            # a packed sequence's first token has no context in its row: no value there
            logprobs = shift_values(logits[..., 0], scored_positions(mb) if "position_ids" in mb else mb["attention_mask"])
        elif head is not None:  # logits at the positions that need them only, a chunk at a time
            tap, chunk = head
            topk = int(mb[TOPK_REQUEST]) if TOPK_REQUEST in mb else None
            logprobs = head_logprobs(logits, tap.weight(), mb, topk=topk,
                                     **({"chunk_elements": chunk} if chunk else {}))
        else:  # with the candidates' logprobs or the top-k the micro-batch asks for (distillation)
            logprobs = batch_logprobs(logits, mb, needed_positions(mb).to(mb["attention_mask"].dtype))
        if forward_only:
            out = join_topk(logprobs, mb) if TOPK_REQUEST in mb else logprobs
            return logits.new_zeros(()), {"logprobs": out.detach().float().cpu()}
        loss, metrics = loss_fn(logprobs, mb, normaliser)
        return loss * scale, {"loss": float(loss.detach()), "metrics": metrics}

    def _empty_unused_memory(self, level: int) -> None:
        """megatron's ``empty_unused_memory_level``: 1 empties the CUDA cache after the forward and
        backward passes, 2 after the optimizer step as well (nothing to empty on the CPU)."""
        if self.settings.empty_unused_memory_level >= level and torch.cuda.is_available():
            torch.cuda.empty_cache()

    def logprobs(self, mbs: list[dict[str, torch.Tensor]]) -> list[torch.Tensor] | None:
        if self.critic:
            raise RuntimeError("a critic computes values, not logprobs")
        if self.replay is None:
            try:
                return self._forward_only(mbs)
            finally:
                if self.given_routes is not None:
                    self.given_routes.stop()
        self.replay.start_recording()  # r2: these are the old-policy logprobs; training routes as they did
        try:
            out = self._forward_only(mbs)
        finally:
            self.replay.stop()
        self.replay.share()
        return out

    def base_logprobs(self, mbs: list[dict[str, torch.Tensor]]) -> list[torch.Tensor] | None:
        """Logprobs with the LoRA adapters switched off: the base model's (a LoRA policy's KL reference)."""
        from corerl_megatron.training.lora import set_enabled

        if not self.lora:
            raise RuntimeError("base_logprobs() needs a LoRA policy (policy.lora.enabled)")
        set_enabled(self.model.module, False)
        try:
            return self._forward_only(mbs)
        finally:
            set_enabled(self.model.module, True)

    def topk_logprobs(self, mbs: list[dict[str, torch.Tensor]], k: int) -> list[torch.Tensor] | None:
        """The logprobs and top-k next tokens of this rank's micro-batches (the last pipeline stage
        reports them), laid out by ``join_topk``."""
        if self.critic:
            raise RuntimeError("a critic computes values, not logprobs")
        return self._forward_only([{**mb, TOPK_REQUEST: torch.tensor(k)} for mb in mbs])

    def values(self, mbs: list[dict[str, torch.Tensor]]) -> list[torch.Tensor] | None:
        """Values of this rank's micro-batches on a critic (the last pipeline stage reports them)."""
        return self._forward_only(mbs)

    def _forward_only(self, mbs: list[dict[str, torch.Tensor]]) -> list[torch.Tensor] | None:
        self.require_resident("parameters")
        self.model.eval()
        with torch.no_grad():
            out = self._run(mbs, None, 1.0, forward_only=True)
        return [o["logprobs"] for o in out] if self.ps.is_pipeline_last_stage() else None

    def train_step(self, mbs: list[dict[str, torch.Tensor]], loss_fn: Any, normaliser: float) -> dict[str, Any]:
        self.require_resident("parameters", "optimizer")
        self.model.train()
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        if self.routing is not None:
            self.routing.active = True
        if self.draft is not None:  # the MTP heads' decoupled draft loss joins each micro-batch's loss
            loss_fn = self.draft.wrap(loss_fn)
        try:
            out = self._run(mbs, loss_fn, normaliser, forward_only=False)
            if self.vision is not None:  # the replicated tower's copies stay equal over tensor-parallel ranks
                from corerl_megatron.training.vision import average_tower_gradients

                average_tower_gradients(self.model.module, self.ps.get_tensor_model_parallel_group(), self.tp)
        finally:
            if self.routing is not None:
                self.routing.active = False
            if self.replay is not None:
                self.replay.stop()
            if self.given_routes is not None:
                self.given_routes.stop()
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
        if self.routing is not None:  # every rank takes part (collectives); the reporting ranks log it
            # over every rank whose tokens differ: the data- and context-parallel ranks
            metrics.update(self.routing.metrics(len(mbs), self.ps.get_data_parallel_group(with_context_parallel=True),
                                                self.ps.get_pipeline_model_parallel_group(), self.dp))
        last = self.ps.is_pipeline_last_stage()
        return {"loss": sum(o["loss"] for o in out) if last else None, "grad_norm": float(grad_norm or 0.0),
                "lr": lr, "step": self.step, "metrics": metrics if last else None}

    # -- generation ------------------------------------------------------------------

    def generate(self, rows: list[list[int]], sampling: Any, stop_ids: list[int]) -> list[Any] | None:
        """Completions of this data-parallel group's ``rows``; returned by the rank that reports,
        None elsewhere (see :mod:`corerl_megatron.generation.rank_decode`). Generation runs on the
        training model itself: parameters offloaded (the 'full' offload policy) come back for the
        call and leave again after it."""
        from corerl_megatron.generation.rank_decode import generate

        away = "parameters" in self.parked
        if away:
            self.reload(["parameters"])
        try:
            return generate(self, rows, sampling, stop_ids)
        finally:
            if away:
                self.offload(["parameters"])

    # -- checkpoints -------------------------------------------------------------------

    def save_state(self, path: str) -> dict[str, Any]:
        """Each rank writes its shard and optimizer state; the scheduler goes in its sidecar."""
        model = self.model.module.state_dict()
        if self.lora:  # the base is frozen (load_hf reads it again): the adapters and their optimizer state
            from corerl_megatron.training.lora import is_adapter

            model = {name: tensor for name, tensor in model.items() if is_adapter(name)}
        state = {"model": model, "optimizer": self.optimizer.state_dict()}
        torch.save(state, os.path.join(path, f"megatron_rank{self.rank}.pt"))
        return {"scheduler": self.scheduler.state_dict()}

    def load_state(self, path: str, sidecar: dict[str, Any]) -> None:
        from corerl.sdk import load_plain

        state = load_plain(os.path.join(path, f"megatron_rank{self.rank}.pt"), map_location=self.device)
        self.model.module.load_state_dict(state["model"], strict=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.num_steps = 0  # its load_state_dict steps forward by the saved count
        self.scheduler.load_state_dict(sidecar["scheduler"])

    # -- memory ------------------------------------------------------------------------

    def phase_tensors(self, part: str) -> list[torch.Tensor] | None:
        """What offload parks (on a GPU too: the template's :meth:`move`): this rank's shard of the
        model's parameters, or its optimizer's state with the fp32 main copies."""
        from corerl.sdk import optimizer_state_tensors

        if part == "parameters":
            return list(self.model.module.parameters())
        if part == "optimizer":
            mains = [p for group in getattr(self.optimizer, "fp32_from_float16_groups", None) or [] for p in group]
            return [*optimizer_state_tensors(self.optimizer), *mains]
        return None

    def state_bytes(self) -> dict[str, int]:
        """Bytes this rank holds on its device for parameters (its shards), gradients (megatron's
        gradient buffer) and optimizer state, fp32 main copies included (see bench/memory.py); 0
        for a part offloaded."""
        module = self.model.module
        return {"parameters": self.resident_bytes(self.phase_tensors("parameters")),
                "gradients": self.resident_bytes(getattr(p, "main_grad", None) for p in module.parameters()),
                "optimizer": self.resident_bytes(self.phase_tensors("optimizer"))}

    def coordinates(self) -> dict[str, Any]:
        """This rank's data-parallel index, and whether it reports losses and logprobs (the last
        pipeline stage's first tensor- and context-parallel rank)."""
        return {"dp": self.ps.get_data_parallel_rank(),
                "reports": self.ps.is_pipeline_last_stage() and self.tp_rank == 0
                and self.ps.get_context_parallel_rank() == 0}

    # -- weights out -------------------------------------------------------------------

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Every rank must call this; each pipeline stage's first tensor-parallel rank returns
        its stage's full tensors with global Megatron names (the driver merges the stages). With
        ``policy.lora`` the weights are the merged ones, W + scale B A (what a generation engine
        gets whole and ``final/merged`` holds); the adapters themselves are :meth:`adapter_state`."""
        from corerl_megatron.training.experts import gather_experts, is_expert
        from corerl_megatron.training.lora import merged
        from corerl_megatron.training.model import spec_neutral_name
        from corerl_megatron.training.sharding import gather, renumber
        from corerl_megatron.training.stage_weights import routed_buffers

        self.require_resident("parameters")
        module = self.model.module
        group = self.ps.get_tensor_model_parallel_group()
        out, experts = {}, {}
        for name, param in module.named_parameters():
            if name not in self.layout.partition:  # a LoRA adapter: merged into its layer's weight
                continue
            local = merged(module, name, param.detach()) if self.lora else param.detach()
            full = gather(name, local, self.layout.partition[name], group, self.tp)
            target = experts if is_expert(name) else out
            target[spec_neutral_name(renumber(name, self.layout.numbering))] = full.cpu()
        for name, buffer in routed_buffers(module):  # the routers' per-expert biases (the same on every rank)
            out[spec_neutral_name(renumber(name, self.layout.numbering))] = buffer.detach().cpu()
        if experts:  # each expert-parallel rank holds E / ep of them
            out.update(gather_experts(experts, self.ps.get_expert_model_parallel_group(), self.ep,
                                      self.layout.experts_per_rank))
        if self.shape.tied:
            out.pop("output_layer.weight", None)
        keep = self.tp_rank == 0 and self.ps.get_data_parallel_rank() == 0 and self.ps.get_context_parallel_rank() == 0
        return out if keep else None

    def adapter_state(self) -> dict[str, torch.Tensor] | None:
        """The LoRA adapters whole, under PEFT's saved names in the Hugging Face layout, on the
        first rank (every pipeline stage's); None elsewhere. Every rank calls it."""
        import torch.distributed as dist

        from corerl_megatron.training.lora import peft_tensors

        self.require_resident("parameters")
        stage = peft_tensors(self.model.module, self.layout.numbering, self.ps.get_tensor_model_parallel_group(),
                             self.tp)
        if self.settings.pipeline_model_parallel_size > 1:  # each stage holds its layers' adapters
            stages: list[Any] = [None] * self.settings.pipeline_model_parallel_size
            dist.all_gather_object(stages, stage, group=self.ps.get_pipeline_model_parallel_group())
            stage = {name: tensor for part in stages for name, tensor in part.items()}
        return stage if self.rank == 0 else None

    def export_adapter(self, path: str) -> None:
        """Rank 0 writes the PEFT adapter folder (and the tokenizer) at ``path``; the others wait.
        Its ``adapter_config.json`` names the Hugging Face projections adapted
        (:func:`corerl_megatron.training.lora.peft_config`), not megatron's layers."""
        from corerl.sdk import barrier, copy_tokenizer, write_adapter
        from corerl_megatron.training.lora import peft_config

        state = self.adapter_state()
        if self.rank == 0:
            assert state is not None and self.model_path is not None
            write_adapter(path, state, peft_config(self.config.core.policy.lora, self.hf_config.num_hidden_layers,
                                                  self.model_path))
            copy_tokenizer(self.model_path, path)
        barrier()


def _finalize(*args: Any, **kwargs: Any) -> None:
    from megatron.core.distributed import finalize_model_grads

    finalize_model_grads(*args, **kwargs)
