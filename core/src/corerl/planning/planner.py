"""The core's half of ``corerl plan``: every installed memory model's layouts, with the
generation engine and the frozen reference added, ranked by the backend decision tree and by
what fits.

Per GPU, a run's peak is the larger of its two phases: training (parameters, gradients,
optimizer state, one micro-batch's activations, the reference's parameters) and generation
(what training leaves on the GPU, plus the engine: colocated vLLM reserves
``gpu_memory_utilization`` of the GPU for its weights and KV cache; megatron generation adds its
KV buffer to the training weights it samples with). Where the training state and vLLM's share do
not fit together, the plan asks for ``policy.offload.policy=full`` (the training state leaves
while vLLM runs). On one node, vLLM may instead run dedicated on ``g`` GPUs of its own (its
tensor-parallel size), training on the others: then each side only holds its own. A layout fits when its peak leaves :data:`RESERVED` of the GPU free (CUDA
context, allocator slack).

An asynchronous recipe (``algorithm.async.enabled``) generates while training runs, so only
dedicated layouts are candidates: on one node, ``g`` GPUs of the node; on several nodes, one
whole node for generation and training on the others.

The decision tree (NeMo RL's backend guide): under 10B parameters, dtensor + vLLM; 10-70B on
one node, dtensor + vLLM with TP over the node (vLLM's tensor parallelism; the training layout is
whichever dtensor layout fits, FSDP spreading the model over the node); 10-70B on several nodes,
megatron + vLLM; over 70B, megatron + megatron generation.
"""

from __future__ import annotations

from typing import Any

import attrs

from corerl.errors import ConfigError
from corerl.models.facts import tensor_parallel_fits
from corerl.planning.memory import GIB, Layout, MemoryModel, PlanRequest, TrainingMemory
from corerl.planning.request import request_of

RESERVED = 2 * GIB
SMALL, LARGE = 10e9, 70e9


@attrs.frozen
class Rule:
    """The decision tree's branch for a request: the backend and generation it names, and why."""

    backend: str
    generation: str
    why: str
    generation_tp: int | None = None  # the tree's vLLM tensor-parallel size, where it names one


def decision_rule(request: PlanRequest) -> Rule:
    """The branch of the decision tree ``request`` falls in (see the module docstring); a
    vision-language model's is dtensor + vLLM at any size (megatron does not train one)."""
    billions = request.shape.parameters / 1e9
    if request.shape.vision:
        return Rule("dtensor", "vllm", f"a vision-language model ({billions:.1f}B in its language model): dtensor + "
                                       "vLLM (megatron does not train one)",
                    generation_tp=request.gpus_per_node if request.shape.parameters >= SMALL else None)
    if request.shape.parameters < SMALL:
        return Rule("dtensor", "vllm", f"{billions:.1f}B parameters (< 10B): dtensor + vLLM")
    if request.shape.parameters <= LARGE:
        if request.nodes == 1:
            return Rule("dtensor", "vllm", f"{billions:.1f}B parameters (10-70B) on one node: dtensor + vLLM "
                                           f"(TP={request.gpus_per_node})", generation_tp=request.gpus_per_node)
        return Rule("megatron", "vllm", f"{billions:.1f}B parameters (10-70B) on {request.nodes} nodes: megatron + vLLM")
    return Rule("megatron", "megatron", f"{billions:.1f}B parameters (> 70B): megatron + megatron generation")


@attrs.frozen
class Candidate:
    """A layout with its memory per GPU and what it needs to fit."""

    layout: Layout
    training: TrainingMemory
    generation: int  # the vLLM engine's share of each GPU while it runs (0: the backend generates)
    generation_tp: int
    offload: str  # the offload policy the layout needs: none, or full (training state leaves during generation)
    peak: int
    fits: bool
    follows_rule: bool
    dedicated: bool = False  # vLLM on ``generation_tp`` GPUs of its own, training on the rest of the node
    dedicated_nodes: int = 0  # asynchronous RL on several nodes: vLLM on this many whole nodes of its own

    def overrides(self) -> list[str]:
        """``key=value`` overrides that run this candidate."""
        extra = []
        if self.layout.generation == "vllm":
            extra += ["policy.generation.backend=vllm",
                      f"policy.generation.vllm_cfg.tensor_parallel_size={self.generation_tp}"]
        if self.dedicated:
            extra += ["policy.generation.colocated.enabled=false",
                      f"policy.generation.colocated.resources.gpus_per_node={self.generation_tp}"]
        if self.dedicated_nodes:
            extra.append(f"policy.generation.colocated.resources.num_nodes={self.dedicated_nodes}")
        if self.offload != "none":
            extra.append(f"policy.offload.policy={self.offload}")
        return [*self.layout.overrides, *[e for e in extra if e not in self.layout.overrides]]

    def as_dict(self) -> dict[str, Any]:
        t = self.training
        return {"backend": self.layout.backend, "layout": self.layout.name, "generation": self.generation_label,
                "dedicated_generation_gpus": (self.generation_tp * max(self.dedicated_nodes, 1)) if self.dedicated else 0,
                "offload": self.offload, "fits": self.fits, "follows_decision_tree": self.follows_rule,
                "bytes_per_gpu": {"parameters": t.parameters, "gradients": t.gradients, "optimizer": t.optimizer,
                                  "activations": t.activations, "reference": t.reference,
                                  "generation": self.generation or t.own_generation, "peak": self.peak},
                "overrides": self.overrides()}

    @property
    def generation_label(self) -> str:
        if self.layout.generation != "vllm":
            return "megatron"
        where = f" dedicated ({self.dedicated_nodes} node)" if self.dedicated_nodes else " dedicated" if self.dedicated else ""
        return f"vLLM TP={self.generation_tp}{where}"


def vllm_tensor_parallel(request: PlanRequest, reserved: int) -> int | None:
    """The smallest vLLM tensor-parallel size (within a node) whose weights take at most half of
    the engine's share ``reserved``, leaving the rest for the KV cache; None when none does."""
    weights = request.shape.parameters * 2  # vLLM serves 16-bit weights
    tp = 1
    while tp <= request.gpus_per_node:
        if tensor_parallel_fits(request.shape, tp) and weights / tp <= reserved / 2:
            return tp
        tp *= 2
    return None


def assess(request: PlanRequest, layout: Layout, training: TrainingMemory, rule: Rule) -> Candidate:
    """The candidate ``layout`` makes with its training memory: generation added, offload chosen."""
    usable = request.gpu_memory - RESERVED
    follows = layout.backend == rule.backend and layout.generation == rule.generation
    resident = training.state + training.reference
    if layout.generation == "vllm":
        share = int(request.generation_memory_fraction * request.gpu_memory)
        tp = vllm_tensor_parallel(request, share)
        if follows and rule.generation_tp is not None and tp is not None:
            tp = max(tp, rule.generation_tp)
        offload = "none" if resident + share <= usable else "full"
        during_generation = (resident if offload == "none" else 0) + share
        peak = max(training.total, during_generation)
        fits = tp is not None and peak <= usable
        return Candidate(layout, training, share, tp or request.gpus_per_node, offload, peak, fits, follows)
    peak = max(training.total, resident + training.own_generation)
    return Candidate(layout, training, 0, layout.tp, "none", peak, peak <= usable, follows)


def assess_dedicated(request: PlanRequest, model: MemoryModel, rule: Rule) -> list[Candidate]:
    """On one node: vLLM on ``g`` GPUs of its own (``g`` its tensor-parallel size, the weights in at
    most half of a GPU each), each of ``model``'s vLLM layouts on the remaining GPUs. An
    asynchronous recipe on several nodes: vLLM on one whole node, training on the others."""
    usable = request.gpu_memory - RESERVED
    if request.nodes > 1 and request.asynchronous:
        if vllm_tensor_parallel(request, usable) is None:
            return []
        return _beside_generation(attrs.evolve(request, nodes=request.nodes - 1), model, rule, usable,
                                  request.gpus_per_node, nodes=1)
    if request.nodes != 1 or request.gpus_per_node < 2:
        return []
    g = vllm_tensor_parallel(request, usable)
    if g is None or g >= request.gpus_per_node:
        return []
    if rule.generation_tp is not None and rule.backend == "dtensor":
        g = min(max(g, rule.generation_tp), request.gpus_per_node // 2)
    return _beside_generation(attrs.evolve(request, gpus_per_node=request.gpus_per_node - g), model, rule, usable, g)


def _beside_generation(training_request: PlanRequest, model: MemoryModel, rule: Rule, usable: int, g: int,
                       nodes: int = 0) -> list[Candidate]:
    """Each of ``model``'s vLLM layouts on what dedicated generation leaves (``training_request``)."""
    out = []
    for layout in model.layouts(training_request):
        if layout.generation != "vllm":
            continue
        training = model.estimate(training_request, layout)
        follows = layout.backend == rule.backend and layout.generation == rule.generation
        out.append(Candidate(layout, training, usable, g, "none", training.total, training.total <= usable, follows,
                             dedicated=True, dedicated_nodes=nodes))
    return out


def complexity(candidate: Candidate) -> tuple[int, ...]:
    """Simpler first: fewer model-parallel ranks (tensor, pipeline and context parallel), no
    activation checkpointing, no offload."""
    layout = candidate.layout
    offloads = sum("offload" in part and not part.endswith("=none") for part in layout.overrides)
    return (layout.tp * layout.pp * layout.cp, int(layout.activation_checkpointing), offloads, int(candidate.offload != "none"),
            int(candidate.dedicated))


@attrs.frozen
class Plan:
    """The ranked candidates, the recommendation (None when nothing fits) and why."""

    request: PlanRequest
    rule: Rule
    candidates: list[Candidate]
    recommended: Candidate | None
    why: str

    def as_dict(self) -> dict[str, Any]:
        r = self.request
        return {"model": r.shape.name, "parameters": r.shape.parameters, "gpus_per_node": r.gpus_per_node,
                "nodes": r.nodes, "gpu_memory_bytes": r.gpu_memory, "decision_rule": self.rule.why,
                "recommended": self.recommended.as_dict() if self.recommended else None, "why": self.why,
                "candidates": [c.as_dict() for c in self.candidates]}


def make_plan(request: PlanRequest, models: dict[str, MemoryModel]) -> Plan:
    """Every layout of every memory model (by backend id), assessed and ranked: fitting layouts
    that follow the decision tree first, simplest first; then the other fitting ones; then the
    rest by peak memory."""
    rule = decision_rule(request)
    candidates = [] if request.asynchronous else [  # asynchronous generation never shares the training GPUs
        assess(request, layout, model.estimate(request, layout), rule)
        for model in models.values() for layout in model.layouts(request)]
    candidates += [c for model in models.values() for c in assess_dedicated(request, model, rule)]
    if request.asynchronous and not candidates:
        return Plan(request, rule, [], None, "asynchronous RL needs GPUs of its own for generation, and one node of "
                                             f"{request.gpus_per_node} GPU(s) leaves none beside training: give the "
                                             "node 2 or more GPUs, or add a node")
    candidates.sort(key=lambda c: (not c.fits, not c.follows_rule, complexity(c) if c.fits else (), c.peak))
    usable = (request.gpu_memory - RESERVED) / GIB
    best = candidates[0] if candidates and candidates[0].fits else None
    if best is None:
        closest = min(candidates, key=lambda c: c.peak) if candidates else None
        why = (f"nothing fits in {usable:.0f} GiB per GPU; the closest, {closest.layout.backend} {closest.layout.name}, "
               f"needs {closest.peak / GIB:.0f} GiB: add GPUs or nodes" if closest else "no memory model is installed")
    elif best.follows_rule:
        why = (f"{rule.why}; {best.layout.backend} {best.layout.name} is the simplest such layout that fits: "
               f"{best.peak / GIB:.1f} of {usable:.0f} GiB per GPU")
    else:
        wanted = [c for c in candidates if c.follows_rule]
        short = min(wanted, key=lambda c: c.peak) if wanted else None
        why = (f"{rule.why}, but " + (f"its best layout needs {short.peak / GIB:.0f} GiB of {usable:.0f}"
                                      if short else f"{rule.backend} is not installed")
               + f"; {best.layout.backend} {best.layout.name} fits: {best.peak / GIB:.1f} GiB per GPU")
    return Plan(request, rule, candidates, best, why)


def installed_models(host: Any) -> dict[str, MemoryModel]:
    """The memory model of every registered one whose training backend is installed, by backend id."""
    return {registration.id: registration.create() for registration in host.memory_models
            if registration.id in host.training_backends}


def fit_warning(config: Any, training_backend: str, host: Any) -> str | None:
    """``corerl validate``'s check: a warning when the recipe's own layout is predicted to need more
    than ``cluster.gpu_memory_gib`` per GPU (None when it fits, the key is unset, or the backend
    has no memory model)."""
    if config.core.cluster.gpu_memory_gib is None:
        return None
    registration = host.memory_models.get(training_backend)
    if registration is None:
        return None
    model = registration.create()
    try:
        request = request_of(config)
    except ConfigError as exc:  # the model's config.json is not here (a hub name): say so, do not refuse
        return f"cluster.gpu_memory_gib is set but the fit was not checked: {exc.message}"
    layout = model.layout_of(config, request)
    candidate = assess(request, layout, model.estimate(request, layout), decision_rule(request))
    usable = (request.gpu_memory - RESERVED) / GIB
    if candidate.fits and (candidate.offload == "none" or config.core.policy.offload.policy != "none"):
        return None
    need = f"{candidate.peak / GIB:.1f} GiB per GPU"
    if candidate.fits:  # it fits only if the training state leaves while vLLM runs
        return (f"the recipe's layout ({training_backend} {layout.name}) is predicted to need {need} only with "
                f"policy.offload.policy=full (training state and vLLM's share do not fit together in "
                f"{usable:.0f} GiB); set it, or see `corerl plan`")
    return (f"the recipe's layout ({training_backend} {layout.name}) is predicted to need {need}, more than the "
            f"{usable:.0f} GiB usable of cluster.gpu_memory_gib={config.core.cluster.gpu_memory_gib:g}; "
            f"`corerl plan RECIPE` ranks layouts that fit")
