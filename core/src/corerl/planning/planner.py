"""The core's half of ``corerl plan``: every installed memory model's layouts, with the
generation engine and the frozen reference added, ranked by the installed backends' preferences
and by what fits. The core names no backend: what each backend is for, and what a generation
engine takes of a GPU, are their plugins' memory models'.

Per GPU, a run's peak is the larger of its two phases: training (parameters, gradients,
optimizer state, one micro-batch's activations, the reference's parameters) and generation
(what training leaves on the GPU, plus the engine: a colocated engine reserves its share of the
GPU for its weights and KV cache, :meth:`~corerl.planning.memory.GenerationMemory.share`; a
backend that samples with its own training weights adds its
:attr:`~corerl.planning.memory.TrainingMemory.own_generation`). Where the training state and the
engine's share do not fit together, the plan asks for ``policy.offload.policy=full`` (the
training state leaves while the engine runs). On one node, the engine may instead run dedicated
on ``g`` GPUs of its own (its tensor-parallel size), training on the others: then each side only
holds its own. A layout fits when its peak leaves :data:`RESERVED` of the GPU free (CUDA
context, allocator slack).

An asynchronous recipe (``algorithm.async.enabled``) generates while training runs, so only
dedicated layouts are candidates: on one node, ``g`` GPUs of the node; on several nodes, one
whole node for generation and training on the others.

The decision tree is the backends' own: each training backend's memory model may say which
requests it is for (``preference(request)``, a :class:`~corerl.planning.memory.Preference`: the
first-party ones follow NeMo RL's backend guide); the plan follows the strongest, and its
fitting layouts rank first, simplest first.
"""

from __future__ import annotations

from typing import Any

import attrs

from corerl.errors import ConfigError
from corerl.planning.installed import (
    default_generation,
    installed_generation_models,
    installed_models,
)
from corerl.planning.memory import (
    GIB,
    GenerationMemory,
    Layout,
    MemoryModel,
    PlanRequest,
    Preference,
    TrainingMemory,
)
from corerl.planning.request import request_of

__all__ = ["RESERVED", "Candidate", "Plan", "Rule", "assess", "assess_dedicated", "complexity", "decision_rule",
           "fit_warning", "installed_generation_models", "installed_models", "make_plan"]

RESERVED = 2 * GIB
#: the backend guide's sizes, now the first-party memory models' own (kept for importers)
SMALL, LARGE = 10e9, 70e9


@attrs.frozen
class Rule:
    """The preference a plan follows: the backend and generation it names, and why (``backend``
    None where no installed backend states one)."""

    backend: str | None
    generation: str | None
    why: str
    generation_tp: int | None = None  # the tensor-parallel size it asks of the generation engine, where it names one


NO_PREFERENCE = "no installed backend states a preference for this model"


def decision_rule(request: PlanRequest, models: dict[str, MemoryModel] | None = None,
                  engines: dict[str, GenerationMemory] | None = None) -> Rule:
    """The preference ``request`` falls under: the strongest that an installed training backend's
    memory model states (``models`` None: this process's installed ones), its generation
    resolved to an engine id (``engines`` None: this process's)."""
    if models is None:
        from corerl.config.presets import default_host

        models = installed_models(default_host())
    if engines is None:
        engines = installed_generation_models()
    best: tuple[int, str, Preference] | None = None
    for backend, model in models.items():
        prefers = getattr(model, "preference", None)  # an older contract's memory model has none
        preference = prefers(request) if prefers is not None else None
        if preference is not None and (best is None or preference.priority > best[2].priority):
            best = (preference.priority, backend, preference)
    if best is None:
        return Rule(None, None, NO_PREFERENCE)
    _, backend, preference = best
    return Rule(backend, preference.generation or default_generation(engines), preference.why,
                generation_tp=preference.generation_tp)


def engine_of(layout: Layout, engines: dict[str, GenerationMemory]) -> tuple[str | None, GenerationMemory | None]:
    """The id of the generation backend that samples beside ``layout`` and its memory model (None
    where the layout's own backend samples, or the engine registers no memory model)."""
    engine_id = layout.generation or default_generation(engines)
    if engine_id is None or engine_id == layout.backend:
        return engine_id, None
    return engine_id, engines.get(engine_id)


@attrs.frozen
class Candidate:
    """A layout with its memory per GPU and what it needs to fit."""

    layout: Layout
    training: TrainingMemory
    generation: int  # the generation engine's share of each GPU while it runs (0: the backend generates)
    generation_tp: int
    offload: str  # the offload policy the layout needs: none, or full (training state leaves during generation)
    peak: int
    fits: bool
    follows_rule: bool
    dedicated: bool = False  # the engine on ``generation_tp`` GPUs of its own, training on the rest of the node
    dedicated_nodes: int = 0  # asynchronous RL on several nodes: the engine on this many whole nodes of its own
    #: the generation engine's memory model (None: the layout's backend samples with its own weights)
    engine: GenerationMemory | None = attrs.field(default=None, eq=False, repr=False)

    def overrides(self) -> list[str]:
        """``key=value`` overrides that run this candidate."""
        extra = list(self.engine.overrides(self.generation_tp)) if self.engine is not None else []
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
        if self.engine is None:
            return self.layout.generation or self.layout.backend
        where = f" dedicated ({self.dedicated_nodes} node)" if self.dedicated_nodes else " dedicated" if self.dedicated else ""
        return f"{self.engine.label(self.generation_tp)}{where}"


def _follows(layout: Layout, engine_id: str | None, rule: Rule) -> bool:
    return rule.backend is not None and layout.backend == rule.backend and engine_id == rule.generation


def assess(request: PlanRequest, layout: Layout, training: TrainingMemory, rule: Rule,
           engines: dict[str, GenerationMemory] | None = None) -> Candidate:
    """The candidate ``layout`` makes with its training memory: generation added, offload chosen
    (``engines``: the generation engines' memory models; None, this process's)."""
    engines = installed_generation_models() if engines is None else engines
    usable = request.gpu_memory - RESERVED
    engine_id, engine = engine_of(layout, engines)
    follows = _follows(layout, engine_id, rule)
    resident = training.state + training.reference
    if engine is not None:
        share = engine.share(request)
        tp = engine.tensor_parallel(request, share)
        if follows and rule.generation_tp is not None and tp is not None:
            tp = max(tp, rule.generation_tp)
        offload = "none" if resident + share <= usable else "full"
        during_generation = (resident if offload == "none" else 0) + share
        peak = max(training.total, during_generation)
        fits = tp is not None and peak <= usable
        return Candidate(layout, training, share, tp or request.gpus_per_node, offload, peak, fits, follows,
                         engine=engine)
    peak = max(training.total, resident + training.own_generation)
    return Candidate(layout, training, 0, layout.tp, "none", peak, peak <= usable, follows)


def assess_dedicated(request: PlanRequest, model: MemoryModel, rule: Rule,
                     engines: dict[str, GenerationMemory] | None = None) -> list[Candidate]:
    """On one node: each generation engine on ``g`` GPUs of its own (``g`` its tensor-parallel
    size with a whole GPU each), each of ``model``'s layouts that engine samples beside on the
    remaining GPUs. An asynchronous recipe on several nodes: the engine on one whole node,
    training on the others."""
    engines = installed_generation_models() if engines is None else engines
    usable = request.gpu_memory - RESERVED
    out: list[Candidate] = []
    for engine_id, engine in engines.items():
        if request.nodes > 1 and request.asynchronous:
            if engine.tensor_parallel(request, usable) is None:
                continue
            out += _beside_generation(attrs.evolve(request, nodes=request.nodes - 1), model, rule, usable,
                                      request.gpus_per_node, engine_id, engines, nodes=1)
            continue
        if request.nodes != 1 or request.gpus_per_node < 2:
            continue
        g = engine.tensor_parallel(request, usable)
        if g is None or g >= request.gpus_per_node:
            continue
        if rule.generation_tp is not None:
            g = min(max(g, rule.generation_tp), request.gpus_per_node // 2)
        out += _beside_generation(attrs.evolve(request, gpus_per_node=request.gpus_per_node - g), model, rule, usable,
                                  g, engine_id, engines)
    return out


def _beside_generation(training_request: PlanRequest, model: MemoryModel, rule: Rule, usable: int, g: int,
                       engine_id: str, engines: dict[str, GenerationMemory], nodes: int = 0) -> list[Candidate]:
    """Each of ``model``'s layouts that engine ``engine_id`` samples beside, on what dedicated
    generation leaves (``training_request``)."""
    out = []
    for layout in model.layouts(training_request):
        if engine_of(layout, engines)[0] != engine_id:
            continue
        training = model.estimate(training_request, layout)
        out.append(Candidate(layout, training, usable, g, "none", training.total, training.total <= usable,
                             _follows(layout, engine_id, rule), dedicated=True, dedicated_nodes=nodes,
                             engine=engines[engine_id]))
    return out


def vllm_tensor_parallel(request: PlanRequest, reserved: int) -> int | None:
    """Deprecated (the engine's memory model says it now): the default generation engine's
    tensor-parallel size with ``reserved`` bytes of each GPU; None when none fits or no engine
    has a memory model."""
    import warnings

    warnings.warn("the planner's engine tensor-parallel helper is deprecated: ask the generation engine's "
                  "memory model (installed_generation_models()[id].tensor_parallel)", DeprecationWarning, stacklevel=2)
    engine = next(iter(installed_generation_models().values()), None)
    return engine.tensor_parallel(request, reserved) if engine is not None else None


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


def make_plan(request: PlanRequest, models: dict[str, MemoryModel],
              engines: dict[str, GenerationMemory] | None = None) -> Plan:
    """Every layout of every training memory model (by backend id), with the generation engines'
    memory models (by engine id; None: this process's installed ones), assessed and ranked:
    fitting layouts that follow the strongest preference first, simplest first; then the other
    fitting ones; then the rest by peak memory."""
    engines = installed_generation_models() if engines is None else engines
    rule = decision_rule(request, models, engines)
    candidates = [] if request.asynchronous else [  # asynchronous generation never shares the training GPUs
        assess(request, layout, model.estimate(request, layout), rule, engines)
        for model in models.values() for layout in model.layouts(request)]
    candidates += [c for model in models.values() for c in assess_dedicated(request, model, rule, engines)]
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
        if short is not None:
            said = f"{rule.why}, but its best layout needs {short.peak / GIB:.0f} GiB of {usable:.0f}"
        else:
            said = rule.why if rule.backend is None else f"{rule.why}, but it offers no layout for this request"
        why = f"{said}; {best.layout.backend} {best.layout.name} fits: {best.peak / GIB:.1f} GiB per GPU"
    return Plan(request, rule, candidates, best, why)


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
    engines = installed_generation_models(host)
    try:
        request = request_of(config, host=host)
    except ConfigError as exc:  # the model's config.json is not here (a hub name): say so, do not refuse
        return f"cluster.gpu_memory_gib is set but the fit was not checked: {exc.message}"
    layout = model.layout_of(config, request)
    rule = decision_rule(request, installed_models(host), engines)
    candidate = assess(request, layout, model.estimate(request, layout), rule, engines)
    usable = (request.gpu_memory - RESERVED) / GIB
    if candidate.fits and (candidate.offload == "none" or config.core.policy.offload.policy != "none"):
        return None
    need = f"{candidate.peak / GIB:.1f} GiB per GPU"
    if candidate.fits:  # it fits only if the training state leaves while the generation engine runs
        engine = f"{engine_of(layout, engines)[0]}'s share"
        return (f"the recipe's layout ({training_backend} {layout.name}) is predicted to need {need} only with "
                f"policy.offload.policy=full (training state and {engine} do not fit together in "
                f"{usable:.0f} GiB); set it, or see `corerl plan`")
    return (f"the recipe's layout ({training_backend} {layout.name}) is predicted to need {need}, more than the "
            f"{usable:.0f} GiB usable of cluster.gpu_memory_gib={config.core.cluster.gpu_memory_gib:g}; "
            f"`corerl plan RECIPE` ranks layouts that fit")
