"""The driver side of the vllm backend: the engine lives in a Ray actor (or, on request, here)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from corerl.sdk import (
    CheckpointNaming,
    Config,
    LocalWorkerGroup,
    RayWorkerGroup,
    Sample,
    SamplingSettings,
    SharedWeightWriter,
    dedicated_generation_layout,
    training_layout,
)

ENGINE = "corerl_vllm.engine:VllmEngine"


def inside_ray_actor() -> bool:
    """Whether this process is a Ray actor (asynchronous generation's worker builds its backend in
    one, placed on generation's own resources)."""
    import sys

    if "ray" not in sys.modules:
        return False
    import ray

    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


class VllmGenerationBackend:
    """``policy.generation.vllm_cfg`` decides the engine; ``colocated`` decides its resources.
    It reads a prompt's images (``accepts_images``, contract 2.13) where vLLM's Qwen-VL processor
    imports (torchvision: a GPU machine; refused in one line elsewhere, :mod:`corerl_vllm.support`).
    Built inside a Ray actor (asynchronous generation's worker, already placed for generation), the
    engine lives in that actor's process, on one device or split over several, which also lets the
    worker's ``between_tokens`` hook reach the engine's decoding loop."""

    accepts_images = True
    accepts_bad_words = True  # vLLM's own SamplingParams.bad_words (contract 2.18)
    reports_routed_experts = True  # r3: enable_return_routed_experts, on a GPU (corerl_vllm.support)

    def __init__(self, config: Config) -> None:
        self.config = config
        settings = config.section("policy.generation.vllm_cfg")
        colocated = config.core.policy.generation.colocated
        # in an actor (asynchronous generation's worker, placed in generation's pool) the engine lives
        # in its process, split or not: its ranks are vLLM's worker processes (CPU), or Ray actors in
        # the pool's bundles (GPU; see VllmEngine.load_hf)
        in_actor = inside_ray_actor()
        hosted_here = settings.host == "driver" or in_actor
        if settings.cpu_threads:
            threads = settings.cpu_threads
        elif hosted_here and in_actor:
            import torch

            threads = torch.get_num_threads()  # the worker's share of the cores (algorithm.async.generation_threads)
        else:
            threads = os.cpu_count() or 1
        if hosted_here:
            self.group: Any = LocalWorkerGroup(ENGINE, config=config, threads=threads)
        else:
            # colocated: a share of rank 0's device in the training pool; dedicated: GPUs of its own
            cluster = config.core.cluster
            layout = (training_layout(cluster) if colocated.enabled
                      else dedicated_generation_layout(colocated.resources))
            self.group = RayWorkerGroup(
                ENGINE, 1, ray_address=cluster.ray_address, layout=layout, role="generation engine",
                config=config, threads=threads,
            )

        self.engine_version = self.group.call("check_engine")[0]
        self.shared: SharedWeightWriter | None = None
        if self._engine_on_this_machine():
            self.shared = SharedWeightWriter()

    @property
    def between_tokens(self) -> Any:
        """The hook of asynchronous generation (see :mod:`corerl.asynchronous.worker`), handed to an
        engine in this process; an engine in another process cannot call it."""
        return getattr(getattr(self.group, "worker", None), "between_tokens", None)

    @between_tokens.setter
    def between_tokens(self, hook: Any) -> None:
        if not isinstance(self.group, LocalWorkerGroup):
            raise RuntimeError("the vllm engine runs in another process: between_tokens needs it in this one "
                               "(policy.generation.vllm_cfg.host=driver, or a backend built in a Ray actor)")
        self.group.worker.between_tokens = hook

    @property
    def stream(self) -> Any:
        """The engine, where it runs in this process, for asynchronous generation's one engine loop
        over every caller's requests (``start``, ``step``, ``abort``: see :class:`corerl_vllm.engine.VllmEngine`);
        None where it runs in another process."""
        return self.group.worker if isinstance(self.group, LocalWorkerGroup) else None

    def _engine_on_this_machine(self) -> bool:
        """A Ray-hosted engine on this driver's node (a driver-hosted one needs no transfer at all)."""
        import ray

        nodes = self.group.nodes()
        return bool(nodes) and nodes[0] == ray.get_runtime_context().get_node_id()

    def load_hf(self, model_path: str) -> None:
        from corerl_vllm.engine import auto_config

        self.group.call("load_hf", model_path)
        self.model_path = model_path
        # vLLM loads checkpoint names: a training engine's fused experts go back to per-expert tensors
        self.naming = CheckpointNaming(auto_config(model_path))

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings, n: int = 1) -> list[list[Sample]]:
        return self.group.call("generate", prompts, sampling, n)[0]

    def update_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """In buckets through shared memory where the engine runs on this machine (the next bucket
        packed while the engine loads the last, a small manifest per bucket through Ray:
        :mod:`corerl.generation.weight_buckets`), else as tensors through Ray; either way under the
        checkpoint's names (:class:`corerl.sdk.CheckpointNaming`), which vLLM's loader takes."""
        weights = self.naming(weights)
        if self.shared is None:
            self.group.call("update_weights", list(weights))
            return
        from corerl_vllm.engine import bucket_bytes

        self.last_refit = self.shared.stream(weights, lambda manifest: self.group.call("update_weights_shared", manifest)[0],
                                             bucket_bytes(self.config.section("policy.generation.vllm_cfg")))

    def load_adapter(self, adapter: Any) -> None:
        """A LoRA refit (:class:`corerl.sdk.AdapterWeights`): the adapter's tensors, not the model,
        cross to the engine's process; ``last_refit_bytes`` says how many bytes crossed. On another
        base than the engine's (the SFT warm start's merged model), the engine restarts on it first."""
        if adapter.base != self.model_path:
            self.load_hf(adapter.base)
        self.last_refit_bytes = self.group.call("load_adapter", adapter.config, adapter.tensors())[0]

    def sleep(self) -> None:
        self.group.call("sleep")

    def wake(self) -> None:
        self.group.call("wake")

    def shutdown(self) -> None:
        self.group.call("shutdown")
        self.group.shutdown()
        if self.shared is not None:
            self.shared.close()
