"""``policy.megatron_cfg`` and ``policy.generation.mcore_generation_config``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import attrs

from corerl.sdk import parallel_sizes_divide_world, section, setting


@attrs.define(kw_only=True)
class MegatronOptimizerConfig:
    """``policy.megatron_cfg.optimizer``: replaces ``policy.optimizer`` when Megatron runs."""

    optimizer: Literal["adam", "sgd"] = setting("adam", help="megatron-core's optimizer: adam or sgd")
    lr: float = setting(5e-6, min=0.0, min_exclusive=True, help="peak learning rate")
    min_lr: float = setting(0.0, min=0.0, help="learning rate at the end of the decay")
    weight_decay: float = setting(0.01, min=0.0, help="decoupled weight decay")
    adam_beta1: float = setting(0.9, min=0.0, max=1.0, help="Adam's beta1")
    adam_beta2: float = setting(0.999, min=0.0, max=1.0, help="Adam's beta2")
    adam_eps: float = setting(1e-8, min=0.0, min_exclusive=True, help="Adam's epsilon")
    sgd_momentum: float = setting(0.9, min=0.0, help="sgd only")
    clip_grad: float = setting(1.0, min=0.0, help="clip the gradient's global norm to this (0: no clipping)")
    use_distributed_optimizer: bool = setting(False, help="shard the optimizer state over data-parallel ranks (megatron's ZeRO-1)")


@attrs.define(kw_only=True)
class MegatronSchedulerConfig:
    """``policy.megatron_cfg.scheduler``: replaces ``policy.scheduler`` when Megatron runs."""

    lr_decay_style: Literal["constant", "linear", "cosine"] = setting("constant", help="megatron-core's decay after the warm-up: constant, linear or cosine")
    lr_warmup_iters: int = setting(0, min=0, help="optimizer steps of linear warm-up")
    lr_decay_iters: int | None = setting(None, min=1, help="optimizer steps the decay takes; unset: the run's steps")


@attrs.define(kw_only=True)
class MegatronFp8Config:
    """``policy.megatron_cfg.fp8_cfg``: FP8 training, megatron-core's own (its TransformerConfig's
    ``fp8``, ``fp8_recipe``, ``fp8_param``), run by Transformer Engine's layers on a GPU: the linear
    layers' matrix multiplications in FP8, the parameters, gradients and optimizer state as before."""

    enabled: bool = setting(False, help="train with FP8 matrix multiplications (needs a GPU with FP8 support and "
                                        "Transformer Engine; refused in one line elsewhere)")
    fp8: Literal["e4m3", "hybrid"] = setting("e4m3", help="FP8 format: e4m3 everywhere, or hybrid (e4m3 forward, "
                                                          "e5m2 gradients)")
    fp8_recipe: Literal["tensorwise", "delayed", "mxfp8", "blockwise"] = setting(
        "tensorwise", help="how scales are kept: tensorwise (current scaling), delayed (from an amax history), "
                           "blockwise (DeepSeek-style 128-wide blocks; Hopper), mxfp8 (Blackwell)")
    fp8_param: bool = setting(False, help="keep the parameters themselves in FP8; corerl keeps them in "
                                          "policy.precision and exports them so, so only false is accepted")


@attrs.define(kw_only=True)
class MegatronConfig:
    """Settings of the megatron training backend."""

    enabled: bool = setting(False, help="train with megatron-core (it outranks dtensor and deepspeed when enabled)")
    converter_type: str | None = setting(None, help="architecture, e.g. Qwen2ForCausalLM; unset: from config.json")
    tensor_model_parallel_size: int = setting(1, min=1, help="ranks a layer's weights are split over")
    pipeline_model_parallel_size: int = setting(1, min=1, help="stages the layers are split into, one rank group each")
    num_layers_in_first_pipeline_stage: int | None = setting(
        None, min=1, help="uneven pipeline stages: the first stage's layers (the rest split evenly); unset: even")
    num_layers_in_last_pipeline_stage: int | None = setting(
        None, min=1, help="uneven pipeline stages: the last stage's layers (the rest split evenly); unset: even")
    context_parallel_size: int = setting(1, min=1, help="ranks each row is split over (Transformer Engine's attention, on GPUs; refused without one)")
    expert_model_parallel_size: int = setting(1, min=1, help="ranks a mixture of experts' experts are split over (each holds experts / size)")
    expert_tensor_parallel_size: int = setting(1, min=1, help="ranks each expert's weights are split over (tensor parallelism inside experts)")
    moe_token_dispatcher_type: Literal["allgather", "alltoall", "flex"] = setting(
        "allgather", help="how tokens reach their experts' ranks: allgather (every rank sees every token), alltoall, "
                          "or flex (megatron-core's fused dispatch with DeepEP or HybridEP kernels: GPU only)")
    moe_flex_dispatcher_backend: Literal["deepep", "hybridep"] = setting(
        "deepep", help="the kernels of the flex dispatcher (megatron-core's key; GPU only)")
    moe_enable_deepep: bool = setting(False, help="megatron-core's older switch for the flex dispatcher's DeepEP "
                                                  "kernels (needs moe_token_dispatcher_type=flex; GPU only)")
    moe_grouped_gemm: bool = setting(False, help="run a rank's experts as one grouped GEMM (needs Transformer Engine "
                                                 "or grouped_gemm on a GPU; refused where megatron-core lacks it)")
    moe_expert_capacity_factor: float | None = setting(
        None, min=0.0, min_exclusive=True, help="each expert takes at most this times its even share of the token-slots; "
                                               "the rest are dropped (logged as moe/dropped_tokens); unset: no dropping")
    sequence_parallel: bool = setting(False, help="split activations along the sequence in tensor-parallel regions")
    activation_checkpointing: bool = setting(False, help="recompute activations in the backward pass (less memory, more compute)")
    empty_unused_memory_level: int = setting(0, min=0, max=2, help="megatron's torch.cuda.empty_cache level between phases (0: never, 2: most)")
    freeze_moe_router: bool = setting(False, help="keep mixture-of-experts routers frozen (policy.moe.freeze_router, "
                                                  "on by default, does too)")
    apply_rope_fusion: bool = setting(False, help="megatron's fused rotary-embedding kernel (GPU only; off on CPU)")
    bias_activation_fusion: bool = setting(False, help="megatron's fused bias and activation kernel (GPU only; off on CPU)")
    fp8_cfg: MegatronFp8Config = section(MegatronFp8Config)
    force_reconvert_from_hf: bool = setting(False, help="convert the Hugging Face checkpoint again even when a cached conversion exists")
    lora_type: Literal["canonical_lora", "lora"] = setting(
        "canonical_lora", help="with policy.lora: canonical_lora, one adapter per Hugging Face projection (q, k, v, "
                               "gate, up each with A and B of their own: PEFT's, as on dtensor); lora, one per megatron "
                               "layer (q, k, v share one A and one B over linear_qkv's rows, gate and up over "
                               "linear_fc1's: Megatron-Bridge's LoRA, SkyRL's and NeMo RL's megatron default)")
    mtp_num_layers: int | None = setting(
        0, min=0, help="multi-token-prediction (MTP) draft heads to build and train (megatron-core's MTP block: "
                       "embedding norm, hidden norm, projection and one transformer layer each); 0: none; unset: "
                       "as many as the checkpoint has (num_nextn_predict_layers or mtp_num_hidden_layers)")
    mtp_loss_scaling_factor: float = setting(
        0.1, min=0.0, help="w in policy_loss + w * draft_loss; the draft loss is decoupled (trunk hidden states, "
                           "re-embedding, output layer and the trunk's next-token distribution it is distilled "
                           "from are detached): its gradient reaches the MTP heads only")
    mtp_loss_target: Literal["policy", "labels"] = setting(
        "policy", help="what the MTP heads learn: policy, the trunk's own next-token distribution (the decoupled "
                       "draft loss: a speculative drafter of the policy); labels, the row's tokens themselves "
                       "(megatron-core's and NeMo RL's MTP loss: cross-entropy against the sampled completion), "
                       "whose gradient reaches the trunk too unless mtp_detach_heads")
    mtp_detach_heads: bool = setting(
        False, help="with mtp_loss_target=labels: the MTP loss trains the heads only (the trunk's hidden states, "
                    "the re-embedded tokens and the output layer detached); the policy target always is")
    mtp_use_repeated_layer: bool = setting(
        False, help="one MTP head (the checkpoint's first) applied mtp_num_layers times, its weights shared by "
                    "every depth, instead of one head a depth")
    mtp_loss_topk: int | None = setting(
        None, min=1, help="distil only the trunk's top-k tokens (renormalised) in the draft loss; unset: the "
                          "whole vocabulary")
    mtp_loss_chunk_size: int | None = setting(
        1024, min=1, help="sequence positions per chunk of the draft loss, each recomputed in the backward pass "
                          "(bounds the draft logits' memory; the same loss); unset: one chunk")
    optimizer: MegatronOptimizerConfig = section(MegatronOptimizerConfig)
    scheduler: MegatronSchedulerConfig = section(MegatronSchedulerConfig)

    def check(self, config: Any) -> Iterator[tuple[str, str]]:
        """TP x PP x CP must divide the world size; sequence parallel needs TP > 1."""
        sizes = {
            "tensor_model_parallel_size": self.tensor_model_parallel_size,
            "pipeline_model_parallel_size": self.pipeline_model_parallel_size,
            "context_parallel_size": self.context_parallel_size,
        }
        yield from parallel_sizes_divide_world("tensor_model_parallel_size", sizes, config)
        if self.sequence_parallel and self.tensor_model_parallel_size == 1:
            yield ("sequence_parallel", "needs tensor_model_parallel_size > 1")
        if self.fp8_cfg.enabled and self.fp8_cfg.fp8_param:
            yield ("fp8_cfg.fp8_param", "FP8 parameters are not exported to the generation engine or checkpoints: "
                   "corerl keeps them in policy.precision (the matrix multiplications still run in FP8); set it to false")
        yield from self._check_mtp_heads(config)
        if self.mtp_loss_target == "labels" and self.mtp_loss_topk is not None:
            yield ("mtp_loss_topk", "distils the trunk's top-k tokens, and mtp_loss_target=labels learns the row's "
                   "own tokens: unset it, or set mtp_loss_target=policy")
        if (self.mtp_num_layers or 0) > 0 and self.pipeline_model_parallel_size > 1:
            yield ("mtp_num_layers", "the MTP heads are trained on the last pipeline stage with the embeddings, which "
                   "only the first stage holds: set pipeline_model_parallel_size=1, or mtp_num_layers=0")
        for stage in ("first", "last"):
            if getattr(self, f"num_layers_in_{stage}_pipeline_stage") is not None and \
                    self.pipeline_model_parallel_size == 1:
                yield (f"num_layers_in_{stage}_pipeline_stage", "sets a pipeline stage's layers, and "
                       "pipeline_model_parallel_size is 1 (one stage holds them all); unset it")

    def _check_mtp_heads(self, config: Any) -> Iterator[tuple[str, str]]:
        """Heads asked for that the checkpoint lacks (where its config.json is readable here)."""
        from corerl.sdk import read_hf_config

        if self.mtp_num_layers == 0:
            return
        hf = read_hf_config(config.policy.model_name) or {}
        text = hf.get("text_config") or hf
        heads = int(text.get("num_nextn_predict_layers") or text.get("mtp_num_hidden_layers") or 0)
        if config.policy.lora.enabled and ((self.mtp_num_layers or 0) > 0 or (self.mtp_num_layers is None and heads)):
            yield ("mtp_num_layers", "multi-token-prediction heads are not trained with policy.lora (it freezes every "
                   "base weight, the heads' too): set it to 0 with LoRA")
            return
        if not hf:
            return
        if self.mtp_num_layers is None and heads and config.policy.sequence_packing.enabled:
            yield ("mtp_num_layers", f"is unset, so {config.policy.model_name}'s {heads} multi-token-prediction "
                   "head(s) would be trained, and their draft loss does not run on packed rows yet: set it to 0, "
                   "or policy.sequence_packing.enabled=false")
        elif self.mtp_num_layers is None and heads == 0:
            yield ("mtp_num_layers", f"is unset (the checkpoint's multi-token-prediction heads) and "
                   f"{config.policy.model_name} has none: set it to 0, or use a checkpoint with heads (MiMo)")
        elif self.mtp_use_repeated_layer and (self.mtp_num_layers or 0) > 0 and heads == 0:
            yield ("mtp_use_repeated_layer", f"repeats the checkpoint's first multi-token-prediction head, and "
                   f"{config.policy.model_name} has none: set mtp_num_layers=0, or use a checkpoint with one")
        elif (self.mtp_num_layers or 0) > heads and not self.mtp_use_repeated_layer:
            yield ("mtp_num_layers", f"asks for {self.mtp_num_layers} multi-token-prediction heads and "
                   f"{config.policy.model_name} has {heads}: set it to {heads} or less")


@attrs.define(kw_only=True)
class MegatronGenerationConfig:
    """``policy.generation.mcore_generation_config``: Megatron's own sampling engine."""

    buffer_size_gb: float = setting(20.0, min=0.0, min_exclusive=True, help="memory for megatron-core's inference KV cache, in GiB")
    num_cuda_graphs: int = setting(16, min=0, help="CUDA graphs megatron-core captures for decoding (GPU only)")
    block_size_tokens: int = setting(256, min=1, help="tokens per block of the paged KV cache")
    enable_chunked_prefill: bool = setting(True, help="fill long prompts into the cache in chunks")
