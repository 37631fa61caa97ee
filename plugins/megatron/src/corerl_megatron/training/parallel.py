"""torch.distributed and megatron-core's parallel state for one rank."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def init_parallel(*, rank: int, world_size: int, tensor: int, pipeline: int, context: int = 1, expert: int = 1,
                  seed: int = 0) -> None:
    """Join the process group (gloo on CPU, nccl on GPU; a private one at world size 1) and lay
    out megatron-core's tensor/pipeline/context/expert groups. With a GPU, seed megatron-core's
    CUDA RNG tracker (its layers fork the "model-parallel-rng" state in every forward); without
    one, redirect megatron-core's CUDA-only calls. Call it after the rank's device is set."""
    from megatron.core import parallel_state

    if not dist.is_initialized():
        if world_size == 1:
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            if "MASTER_PORT" not in os.environ:
                from corerl.sdk import free_port

                os.environ["MASTER_PORT"] = str(free_port())
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        from corerl.sdk import join_process_group

        join_process_group(backend, rank, world_size)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tensor, pipeline_model_parallel_size=pipeline,
            context_parallel_size=context, expert_model_parallel_size=expert,
        )
    # the modules a backend uses, imported before their CUDA-only calls are redirected
    import megatron.core.distributed  # noqa: F401
    import megatron.core.models.common.language_module.language_module  # noqa: F401
    import megatron.core.models.gpt  # noqa: F401
    import megatron.core.optimizer  # noqa: F401
    import megatron.core.optimizer_param_scheduler  # noqa: F401
    import megatron.core.pipeline_parallel.p2p_communication  # noqa: F401
    import megatron.core.pipeline_parallel.schedules  # noqa: F401

    if torch.cuda.is_available():
        from megatron.core import tensor_parallel

        tensor_parallel.model_parallel_cuda_manual_seed(seed)
        return
    from corerl_megatron.training.cpu_redirect import install

    install()
