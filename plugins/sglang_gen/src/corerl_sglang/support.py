"""What the sglang generation backend refuses for a validated config, from the config and the
model's ``config.json`` alone (no SGLang import: ``corerl validate`` stays fast). Called by
selection as the registration's ``check_supported``."""

from __future__ import annotations

import importlib.util
from typing import Any

from corerl.sdk import (
    Config,
    ConfigError,
    EngineNotAvailable,
    check_tensor_parallel,
    model_shape,
    runs_here,
    runs_here_without_gpu,
)

INSTALL = "pip install './plugins/sglang_gen[gpu]'"


def check_supported(config: Config) -> None:
    """Refuse, in one line, what the sglang backend cannot run on any machine: generation on GPUs
    of its own (the engine runs on the training ranks' GPUs), more GPUs than a node has, a
    vision-language model (it reads no images)."""
    settings = config.section("policy.generation.sglang_cfg")
    if not config.core.policy.generation.colocated.enabled:
        raise ConfigError("the sglang engine runs colocated with training only: on the training ranks' GPUs, "
                          "which it frees while they train", key="policy.generation.colocated.enabled",
                          hint="set it to true, or sample on GPUs of their own with policy.generation.backend=vllm")
    check_tensor_parallel(config, settings.tp_size, "policy.generation.sglang_cfg.tp_size")
    gpus = settings.tp_size * settings.dp_size * settings.pp_size
    per_node = config.core.cluster.gpus_per_node
    if settings.base_gpu_id + gpus > per_node:
        raise ConfigError(f"the sglang engine takes {gpus} GPUs (tp_size x dp_size x pp_size) from GPU "
                          f"{settings.base_gpu_id} on, and a node has {per_node} (cluster.gpus_per_node)",
                          key="policy.generation.sglang_cfg.tp_size",
                          hint="make tp_size x dp_size x pp_size, from base_gpu_id, fit cluster.gpus_per_node")
    shape = model_shape(config)
    if shape is not None and shape.vision:
        raise ConfigError(f"the sglang backend does not read images: {config.core.policy.model_name} is a "
                          "vision-language model", key="policy.generation.backend",
                          hint="sample it with policy.generation.backend=vllm (or hf)")


def check_machine(config: Config, chosen: Any) -> None:
    """What this machine lacks for SGLang: a GPU (SGLang has no CPU build on PyPI), or SGLang
    itself. A check of the table run after the core's (corerl_checks), so that what the backend
    refuses on any machine (LoRA, ...) is said first and this line only where nothing else stops
    the recipe."""
    backend = chosen.generation_backend
    if backend is None or backend.id != "sglang":
        return
    if runs_here_without_gpu(config):
        raise EngineNotAvailable("the sglang generation backend needs a GPU (SGLang has no CPU build on PyPI); this "
                                 "machine has none", key="policy.generation.backend",
                                 hint="sample with policy.generation.backend=vllm (or hf) on this machine, or run on "
                                      "a GPU machine")
    check_installed(config)


def check_installed(config: Config) -> None:
    """A GPU machine running the recipe without SGLang (the plugin installs without it)."""
    if runs_here(config) and importlib.util.find_spec("sglang") is None:
        raise EngineNotAvailable("SGLang is not installed", key="policy.generation.backend",
                                 hint=f"install it with: {INSTALL}")
