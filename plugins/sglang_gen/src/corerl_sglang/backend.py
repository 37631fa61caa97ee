"""The driver side of the sglang generation backend: SGLang's offline engine (``sglang.Engine``)
in a Ray actor of its own (:mod:`corerl_sglang.engine`), on the training ranks' first node and
GPUs, its tensor-parallel ranks SGLang's worker processes there.

Colocated with training only (:mod:`corerl_sglang.support`): the engine takes
``mem_fraction_static`` of the GPUs from ``base_gpu_id`` on, sleeps while the training ranks
train (SGLang's memory saver releases its KV cache, CUDA graphs and, with
``enable_weights_cpu_backup``, its weights) and takes each refit in place
(``update_weights_from_tensor``, in buckets, under the checkpoint's names)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from corerl.sdk import (
    CheckpointNaming,
    Config,
    RayWorkerGroup,
    Sample,
    SamplingSettings,
    training_layout,
)
from corerl_sglang import requests

ENGINE = "corerl_sglang.engine:SglangEngine"


class SglangGenerationBackend:
    """``policy.generation.sglang_cfg`` decides the engine; it starts at :meth:`load_hf`."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.settings = config.section("policy.generation.sglang_cfg")
        cluster = config.core.cluster
        # a share of rank 0's GPU in the training pool (colocated), seeing every GPU of its node: the
        # engine's ranks are SGLang's processes on GPUs base_gpu_id onwards
        every_gpu = ",".join(str(i) for i in range(cluster.gpus_per_node))
        self.group = RayWorkerGroup(ENGINE, 1, ray_address=cluster.ray_address, layout=training_layout(cluster),
                                    role="generation engine", env={"CUDA_VISIBLE_DEVICES": every_gpu}, config=config)
        self.model_path: str | None = None

    def load_hf(self, model_path: str) -> None:
        from transformers import AutoConfig

        self.group.call("load_hf", model_path)
        self.model_path = model_path
        # SGLang loads checkpoint names: a training engine's fused experts go back to per-expert tensors
        self.naming = CheckpointNaming(AutoConfig.from_pretrained(model_path))

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings, n: int = 1) -> list[list[Sample]]:
        return self.group.call("generate", prompts, sampling, n)[0]

    def update_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """The weights in buckets of about ``refit_bucket_mib`` (on the CPU through Ray), inside one
        of SGLang's weight-update sessions; its prefix cache is flushed at the end."""
        limit = int(self.settings.refit_bucket_mib * 2**20)
        self.group.call("begin_refit")
        for bucket in requests.buckets(self.naming(weights), limit):
            self.group.call("refit_bucket", [(name, tensor.detach().cpu()) for name, tensor in bucket])
        self.group.call("end_refit")

    def sleep(self) -> None:
        self.group.call("sleep")

    def wake(self) -> None:
        self.group.call("wake")

    def shutdown(self) -> None:
        self.group.call("shutdown")
        self.group.shutdown()
