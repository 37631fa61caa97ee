"""What a validated recipe asks of each GPU (:class:`~corerl.planning.memory.PlanRequest`): the
model's shape, the cluster, precision, sequence length, batch sizes, whether a frozen reference
runs. ``corerl plan`` (:mod:`corerl.planning.command`, which re-exports these names) and
``corerl validate``'s fit check (:func:`corerl.planning.planner.fit_warning`) both start here.
"""

from __future__ import annotations

from typing import Any

from corerl.config.async_section import async_settings
from corerl.models.facts import local_model_name
from corerl.models.shape import ModelShape
from corerl.planning.installed import default_generation, installed_generation_models
from corerl.planning.memory import GIB, PlanRequest

DEFAULT_GPU_MEMORY_GIB = 80.0
DEFAULT_MEMORY_FRACTION = PlanRequest.__attrs_attrs__.generation_memory_fraction.default


def needs_reference(config: Any) -> bool:
    """Whether the recipe keeps a frozen reference model on the GPUs: a KL penalty, or DPO
    scoring each batch with one (``algorithm.dpo.precompute_reference_logprobs=false``); never with
    ``policy.lora``, whose reference is the policy with its adapter off."""
    if config.core.policy.lora.enabled:
        return False
    algorithm = config.core.algorithm
    dpo = config.section("algorithm.dpo")
    return algorithm.kl_penalty > 0 or (dpo is not None and not dpo.precompute_reference_logprobs)


def generation_memory_fraction(config: Any, host: Any = None) -> float:
    """The share of each GPU the recipe's generation engine reserves, as its memory model reads it
    from the engine's section (``policy.generation.backend``, else the default engine); the
    request's default where the engine has no memory model or it does not say."""
    engines = installed_generation_models(host)
    engine = engines.get(config.core.policy.generation.backend or default_generation(engines) or "")
    read = getattr(engine, "memory_fraction", None)
    fraction = read(config) if read is not None else None
    return float(fraction) if fraction is not None else DEFAULT_MEMORY_FRACTION


def request_of(config: Any, gpus: int | None = None, nodes: int | None = None,
               gpu_memory_gib: float | None = None, host: Any = None) -> PlanRequest:
    """What a validated recipe asks of each GPU, on its cluster or the one given (``host``: whose
    generation engines' memory models to ask; None, this process's)."""
    core = config.core
    fraction = generation_memory_fraction(config, host)
    memory = gpu_memory_gib or core.cluster.gpu_memory_gib or DEFAULT_GPU_MEMORY_GIB
    reference = needs_reference(config)
    return PlanRequest(
        ModelShape.of_model(local_model_name(config)), gpus_per_node=gpus or core.cluster.gpus_per_node,
        nodes=nodes or core.cluster.num_nodes, gpu_memory=int(memory * GIB), precision=core.policy.precision,
        seq_length=core.policy.max_seq_length, micro_batch=core.policy.train_micro_batch_size,
        generation_batch=core.algorithm.batch_size * core.algorithm.num_generations_per_prompt,
        generation_memory_fraction=float(fraction), reference=reference,
        asynchronous=async_settings(config).enabled)
