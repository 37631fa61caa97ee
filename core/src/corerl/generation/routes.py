"""Router replay r3 (``policy.moe.router_replay: r3``): the experts a mixture of experts chose while
the generation engine sampled, replayed when the trainer computes the same tokens' logprobs.

A generation backend that can say which experts it chose sets ``reports_routed_experts = True``
(contract 2.18) and, with r3, fills each :class:`~corerl.generation.contract.Sample`'s
``routed_experts``: ``[tokens, decoder layers, experts per token]`` from the first prompt token (a
layer without a router holds no meaning: -1 from hf, 0 from vLLM; the trainers read the MoE layers
only), cut where the engine stopped running tokens (the last sampled one: nothing reads its output). The hf backend records them with forward hooks on the routers (:func:`recorded_routes`);
vLLM returns them itself. :func:`routes_field` lays a batch's samples out as the training rows'
``routed_experts`` field ``[rows, width, layers, k]``, which the training backends' router replay
reads in the old-policy logprob pass and the training forward alike (the reference model, and rows
nothing sampled, such as SFT's and DPO's, route afresh). Without such a backend the recipe is refused at validation (:func:`check_routes_reported`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from corerl.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from corerl.generation.contract import Sample

#: the batch field the training backends replay from
FIELD = "routed_experts"
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def wants_routes(config: Any) -> bool:
    """Whether a generation backend should fill ``Sample.routed_experts`` for this run (r3)."""
    return config.core.policy.moe.router_replay == "r3"


def check_routes_reported(config: Any, chosen: Any) -> None:
    """The validation table's row: r3 needs a generation backend that reports the experts it chose."""
    registration = chosen.generation_backend
    if not wants_routes(config) or registration is None:
        return
    if getattr(registration.load(), "reports_routed_experts", False):
        return
    raise ConfigError(f"router_replay=r3 replays the experts the generation engine chose, and generation backend "
                      f"{registration.id!r} (plugin {registration.plugin!r}) does not report them",
                      key="policy.moe.router_replay",
                      hint="sample with a backend that reports them (policy.generation.backend=hf does; a plugin's backend "
                           "where it sets reports_routed_experts), or use r2 (the experts chosen while computing the "
                           "old-policy logprobs)")


class _Recorder:
    """What :func:`recorded_routes` keeps: each forward's chosen experts, per decoder layer."""

    def __init__(self, layers: int) -> None:
        self.layers = layers
        self.forwards: list[dict[int, torch.Tensor]] = []

    def rows(self, rows: int) -> torch.Tensor | None:
        """``[rows, tokens run, layers, k]`` on the CPU (-1 for a layer without a router), the forwards
        in order; None where the model has no router (a dense model: nothing to replay)."""
        import torch

        if not self.forwards:
            return None
        steps = []
        for chosen in self.forwards:
            first = next(iter(chosen.values()))
            k = first.shape[-1]
            step = torch.full((rows, first.shape[0] // rows, self.layers, k), -1, dtype=torch.int16)
            for layer, indices in chosen.items():
                step[:, :, layer] = indices.reshape(rows, -1, k).cpu()
            steps.append(step)
        return torch.cat(steps, dim=1)


@contextmanager
def recorded_routes(model: Any) -> Iterator[_Recorder]:
    """Around a ``generate()`` call of a transformers mixture of experts: every forward's chosen
    experts (its ``*TopKRouter`` modules return ``(logits, weights, indices)``), one entry per
    forward (the prompt's, then one per decoding step), kept on the model's device as int16 until
    :meth:`_Recorder.rows` (no host copy per layer and step). Routers are the modules whose class name
    ends in ``TopKRouter`` (any case: Qwen3-MoE's, GLM-4.5's ``Glm4MoeTopkRouter``)."""
    import torch

    routers = [(int(found.group(1)), module) for name, module in model.named_modules()
               if type(module).__name__.lower().endswith("topkrouter") and (found := _LAYER.search(name))]
    recorder = _Recorder(int(getattr(model.config.get_text_config(), "num_hidden_layers", 0) or 0)
                         or max((layer for layer, _ in routers), default=-1) + 1)
    first_layer = min((layer for layer, _ in routers), default=0)

    def hook_for(layer: int) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            if layer == first_layer:  # the first router of a forward opens its entry
                recorder.forwards.append({})
            recorder.forwards[-1][layer] = output[2].detach().to(torch.int16)
        return hook

    handles = [module.register_forward_hook(hook_for(layer)) for layer, module in routers]
    try:
        yield recorder
    finally:
        for handle in handles:
            handle.remove()


def routes_field(samples: Sequence[Sample], width: int) -> torch.Tensor | None:
    """The rows' ``routed_experts`` ``[rows, width, layers, k]`` (int16, -1 where none was
    reported), rows in ``samples`` order; None when no sample has any."""
    import torch

    given = [s.routed_experts for s in samples if s.routed_experts is not None]
    if not given:
        return None
    if len(given) != len(samples):
        raise ValueError(f"{len(samples) - len(given)} of {len(samples)} samples have no routed_experts: router replay "
                         "r3 needs every sample's (a generation backend reports them for all or none)")
    layers, k = given[0].shape[1], given[0].shape[2]
    out = torch.full((len(samples), width, layers, k), -1, dtype=torch.int16)
    for row, sample in enumerate(samples):
        routes = sample.routed_experts
        if routes is None:
            continue
        routes = torch.as_tensor(routes)
        if tuple(routes.shape[1:]) != (layers, k):
            raise ValueError(f"sample {row}'s routed_experts have shape {tuple(routes.shape)}, the first sample's "
                             f"[tokens, {layers}, {k}]")
        tokens = min(routes.shape[0], len(sample.prompt_ids) + len(sample.completion_ids))
        out[row, :tokens] = routes[:tokens].to(torch.int16)
    return out


def without_routes(batch: dict[str, Any]) -> dict[str, Any]:
    """``batch`` without its ``routed_experts``: what the KL reference scores (its weights are the
    starting ones, so it routes afresh, as with r2 and a LoRA policy's base)."""
    return {key: value for key, value in batch.items() if key != FIELD}
