"""The sglang engine's own process: a Ray actor on the training ranks' first node that holds
``sglang.Engine``, whose tensor-parallel ranks are SGLang's worker processes on that node's GPUs.

Not the driver's process: ``Engine.shutdown()`` (and its exit hook, and its handler of a failed
worker) kills every process below the one that started the engine, which in the driver would be
the local Ray runtime and the training ranks; here it is the engine's workers alone."""

from __future__ import annotations

import os
from typing import Any

from corerl.sdk import Sample, SamplingSettings
from corerl_sglang import requests

#: set before the engine starts (its worker processes read them as they import SGLang): logprobs
#: of the model's own distribution (SGLang reports the distribution it sampled, after temperature,
#: unless told otherwise; corerl's samples carry the untempered ones), and a context 2 tokens past
#: the model's own limit accepted (SGLang ends a request 2 tokens before its context length:
#: :func:`engine_context_length`)
ENGINE_ENVIRONMENT = {"SGLANG_RETURN_ORIGINAL_LOGPROB": "1", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}
#: SGLang caps a request's prompt and completion at its context length less this
CONTEXT_MARGIN = 2


def engine_context_length(longest: int) -> int:
    """SGLang's ``context_length`` for sequences of up to ``longest`` tokens."""
    return longest + CONTEXT_MARGIN


def engine_arguments(config: Any, model_path: str) -> dict[str, Any]:
    """``sglang.Engine``'s arguments for ``model_path`` under the run's ``config``."""
    policy, settings = config.core.policy, config.section("policy.generation.sglang_cfg")
    seed = settings.random_seed if settings.random_seed is not None else config.core.algorithm.seed
    return {
        "model_path": model_path,
        "tokenizer_path": model_path,  # stop strings are matched on the decoded text
        "dtype": policy.precision,
        "context_length": engine_context_length(settings.context_length or policy.max_seq_length),
        "random_seed": seed,
        "enable_memory_saver": True,  # the engine sleeps while the training ranks train
        "enable_deterministic_inference": settings.seeded,  # SGLang reads sampling_seed only then
        "log_level": "error",
        **settings.server_arguments(),
        **settings.engine_args,
    }


def _checked(result: Any, what: str) -> None:
    """SGLang's ``(success, message)`` answers (and objects with ``success``) as an error where it failed."""
    done, message = (result[0], result[1]) if isinstance(result, tuple) else (getattr(result, "success", True), "")
    if not done:
        raise RuntimeError(f"SGLang refused to {what}: {message}")


class SglangEngine:
    """The rank worker of the engine's one-rank group (:class:`corerl.sdk.RayWorkerGroup`)."""

    def __init__(self, *, rank: int = 0, world_size: int = 1, config: Any) -> None:
        self.config = config
        self.settings = config.section("policy.generation.sglang_cfg")
        self.engine: Any = None
        self.asleep = False

    def load_hf(self, model_path: str) -> None:
        """Start the engine on ``model_path`` (a running one is shut down first)."""
        import sglang

        self.shutdown()
        os.environ.update(ENGINE_ENVIRONMENT)
        self.engine = sglang.Engine(**engine_arguments(self.config, model_path))
        self.asleep = False

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings, n: int) -> list[list[Sample]]:
        ids, params = requests.expand(prompts, sampling, n, seeded=self.settings.seeded)
        if not ids:
            return [[] for _ in prompts]
        outputs = self.engine.generate(input_ids=ids, sampling_params=params, return_logprob=True)
        return requests.group(prompts, outputs, n)

    def begin_refit(self) -> None:
        _checked(self.engine.begin_weight_update(selector="all"), "begin a weight update")

    def refit_bucket(self, bucket: list[tuple[str, Any]]) -> None:
        """One bucket of the refit, moved to the engine's first GPU (SGLang's ranks take it from
        there through CUDA IPC and cast it to their parameters' types)."""
        import torch

        device = torch.device("cuda", self.settings.base_gpu_id)
        _checked(self.engine.update_weights_from_tensor([(name, tensor.to(device)) for name, tensor in bucket],
                                                        flush_cache=False), "take a refit")

    def end_refit(self) -> None:
        _checked(self.engine.end_weight_update(), "end a weight update")
        _checked(self.engine.flush_cache(), "flush its prefix cache after a refit")

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
