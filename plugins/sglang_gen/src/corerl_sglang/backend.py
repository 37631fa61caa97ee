"""The sglang generation backend: SGLang's offline engine (``sglang.Engine``) in the driver's
process, its tensor-parallel ranks SGLang's own worker processes on the driver machine's GPUs.

Colocated with training only (:mod:`corerl_sglang.support`): the engine takes
``mem_fraction_static`` of the GPUs from ``base_gpu_id`` on, sleeps while the training ranks
train (SGLang's memory saver releases its KV cache, CUDA graphs and, with
``enable_weights_cpu_backup``, its weights) and takes each refit in place
(``update_weights_from_tensor``, in buckets, under the checkpoint's names)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

from corerl.sdk import CheckpointNaming, Config, Sample, SamplingSettings
from corerl_sglang import requests

log = logging.getLogger(__name__)


class SglangGenerationBackend:
    """``policy.generation.sglang_cfg`` decides the engine; it starts at :meth:`load_hf`."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.settings = config.section("policy.generation.sglang_cfg")
        self.engine: Any = None
        self.model_path: str | None = None
        self.asleep = False

    def _engine_arguments(self, model_path: str) -> dict[str, Any]:
        policy, settings = self.config.core.policy, self.settings
        seed = settings.random_seed if settings.random_seed is not None else self.config.core.algorithm.seed
        return {
            "model_path": model_path,
            "tokenizer_path": model_path,  # stop strings are matched on the decoded text
            "dtype": policy.precision,
            "context_length": settings.context_length or policy.max_seq_length,
            "random_seed": seed,
            "enable_memory_saver": True,  # the engine sleeps while the training ranks train
            "log_level": "error",
            **settings.server_arguments(),
            **settings.engine_args,
        }

    def load_hf(self, model_path: str) -> None:
        """Start the engine on ``model_path`` (a running one is shut down first)."""
        import sglang
        from transformers import AutoConfig

        if self.engine is not None:
            self.shutdown()
        os.environ.update(requests.ORIGINAL_LOGPROBS)  # the engine's processes read it as they start
        self.engine = sglang.Engine(**self._engine_arguments(model_path))
        self.model_path = model_path
        self.asleep = False
        # SGLang loads checkpoint names: a training engine's fused experts go back to per-expert tensors
        self.naming = CheckpointNaming(AutoConfig.from_pretrained(model_path))

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings, n: int = 1) -> list[list[Sample]]:
        ids, params = requests.expand(prompts, sampling, n)
        if not ids:
            return [[] for _ in prompts]
        outputs = self.engine.generate(input_ids=ids, sampling_params=params, return_logprob=True)
        return requests.group(prompts, outputs, n)

    def update_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """The weights in buckets of about ``refit_bucket_mib``, each moved to the engine's first
        GPU and handed over through CUDA IPC; SGLang casts each to its parameter's type."""
        import torch

        device = torch.device("cuda", self.settings.base_gpu_id)
        limit = int(self.settings.refit_bucket_mib * 2**20)
        self.engine.begin_weight_update(selector="all")
        try:
            for bucket in requests.buckets(self.naming(weights), limit):
                done, message = self.engine.update_weights_from_tensor(
                    [(name, tensor.detach().to(device)) for name, tensor in bucket], flush_cache=False)
                if not done:
                    raise RuntimeError(f"SGLang refused a refit: {message}")
        finally:
            self.engine.end_weight_update()
        self.engine.flush_cache()

    def _tags(self) -> list[str]:
        return ["kv_cache", "weights", "cuda_graph"] if self.settings.enable_weights_cpu_backup else \
            ["kv_cache", "cuda_graph"]

    def sleep(self) -> None:
        if self.engine is not None and not self.asleep:
            self.engine.release_memory_occupation(tags=self._tags())
            self.asleep = True

    def wake(self) -> None:
        if self.engine is not None and self.asleep:
            self.engine.resume_memory_occupation(tags=self._tags())
            self.asleep = False

    def shutdown(self) -> None:
        if self.engine is not None:
            engine, self.engine = self.engine, None
            engine.shutdown()
