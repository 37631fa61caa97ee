"""What the deepspeed backend refuses for a validated config: called by selection (its registration's
``check_supported``), so ``corerl validate`` refuses what ``corerl run`` would at start-up. Config
logic only; GPU-only options are refused where the recipe runs on this machine and it has no GPU
(asked without importing torch)."""

from __future__ import annotations

from corerl.sdk import Config, EngineNotAvailable, check_hf_router


def check_supported(config: Config) -> None:
    """Refuse, in one line, what this machine cannot run. A mixture-of-experts model trains under
    every ZeRO stage (its experts are ordinary parameters, partitioned like the rest; the router
    terms and replay are the core's RankWorker's)."""
    from corerl.sdk import runs_here_without_gpu

    settings = config.section("policy.deepspeed_cfg")
    on_gpu = not runs_here_without_gpu(config)
    check_hf_router(config, "deepspeed", "train on the megatron backend (policy.megatron_cfg.enabled=true)")
    if config.core.policy.precision == "float16" and not on_gpu:
        raise EngineNotAvailable("float16 training needs a GPU (DeepSpeed's loss scaling runs with CUDA); this "
                                 "machine has none", key="policy.precision", hint="use float32 or bfloat16")
    if "nvme" in (settings.offload_optimizer, settings.offload_param) and not on_gpu:
        key = "policy.deepspeed_cfg." + ("offload_optimizer" if settings.offload_optimizer == "nvme" else "offload_param")
        raise EngineNotAvailable("nvme offload needs a GPU (DeepSpeed's async I/O swaps accelerator memory)",
                                 key=key, hint="use cpu on this machine")
