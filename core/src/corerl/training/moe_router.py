"""The router of a mixture-of-experts policy while it trains, on the Hugging Face backends.

transformers' MoE blocks (Qwen3-MoE, Mixtral) call a router module ``mlp.gate`` that returns
``(router_logits, routing_weights, expert_indices)`` and hand the last two to the experts. A
:class:`RouterHooks` sits on those modules (forward hooks, so it composes with FSDP2, DeepSpeed
and an expert-parallel experts module) and, per micro-batch:

- in a training forward, keeps each layer's logits and chosen experts, from which
  :meth:`RouterHooks.step_terms` makes the load-balancing loss (Switch-style:
  ``E * sum_e f_e * P_e`` with ``f_e`` the share of the real tokens' top-k slots expert ``e``
  got and ``P_e`` its mean router probability; ``seq_aux_loss``: the same per sequence,
  averaged), the router z-loss (mean over tokens of ``logsumexp(logits)^2``) and the per-layer
  load metrics;
- with ``policy.moe.router_replay: r2``, records each sequence's chosen experts while the
  old-policy logprobs are computed, and makes the training forward of the same sequences choose
  them again (the routing weights recomputed from the current logits at the recorded experts, so
  the router keeps its gradient);
- with ``r3``, makes the old-policy logprob forward and the training forward choose the experts
  the generation engine chose (the batch's ``routed_experts``, :mod:`corerl.generation.routes`),
  weighted the same way; where the engine reported none (-1: the last sampled token), the router
  chooses.

A recording is keyed by a sequence's tokens, so it survives any re-cut of the batch (other
micro-batches, mini-batches, ranks: at world size above 1 every rank gets every rank's
recording). The algorithm sees none of this: only the step's ``moe/*`` metrics, and the loss
terms the backend adds to the loss it backpropagates.

The loss adds ``coeff x`` the terms summed over the MoE layers (megatron-core's convention, so
NeMo RL's coefficients mean the same); the metrics are per-layer means (``moe/aux_loss`` is 1.0
for a perfectly balanced router whatever ``k``), each micro-batch weighted by its share of the
step's loss tokens, so that the sums the backends take over micro-batches and ranks are means.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from corerl.errors import ConfigError
from corerl.models.facts import (
    check_router_replay as check_router_replay,  # the SDK's name (deprecated)
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    import torch

    from corerl.training.recipe_config import RecipeConfig as Config

#: routers whose weights are a softmax over all experts at the top-k, renormalised where the
#: module says ``norm_topk_prob`` (Mixtral always): those router replay can recompute
SOFTMAX_ROUTERS = ("Qwen3MoeTopKRouter", "MixtralTopKRouter", "Qwen2MoeTopKRouter")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def attach_router(model: Any, config: Config, replay: bool = True) -> RouterHooks | None:
    """Hooks on ``model``'s MoE routers (:class:`RouterHooks`), with ``policy.moe.freeze_router``
    applied (call it before the optimizer is built); None for a dense model (nothing changes).
    ``replay``: whether ``policy.moe.router_replay`` applies (a policy, not a critic)."""
    routers = [(int(found.group(1)), module) for name, module in model.named_modules()
               if type(module).__name__.endswith("TopKRouter") and (found := _LAYER.search(name))]
    if not routers:
        return None
    settings = config.core.policy.moe
    routers.sort(key=lambda pair: pair[0])
    if settings.freeze_router:
        for _, module in routers:
            module.requires_grad_(False)
    return RouterHooks(routers, settings, replay=settings.router_replay if replay else "none")


def sequence_spans(mb: dict[str, torch.Tensor]) -> list[tuple[int, int, int]]:
    """The sequences of a micro-batch as ``(row, start, length)``: each row's real tokens
    (right-padded rows), or each sequence of a packed row (``position_ids`` restart at 0)."""
    spans = []
    if "position_ids" in mb:
        positions = mb["position_ids"]
        for row in range(positions.shape[0]):
            starts = (positions[row] == 0).nonzero().flatten().tolist()
            ends = [*starts[1:], positions.shape[1]]
            spans.extend((row, start, end - start) for start, end in zip(starts, ends, strict=True))
        return spans
    lengths = mb["attention_mask"].sum(dim=1).tolist()
    return [(row, 0, int(length)) for row, length in enumerate(lengths) if length]


def replay_weights(module: Any, logits: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The routing weights ``module`` (a softmax top-k router) would give the experts ``indices``:
    the softmax over all experts at those experts, renormalised as the router does; the same
    arithmetic as the router's own, so recorded experts equal to its choice give equal weights."""
    import torch

    probs = torch.nn.functional.softmax(logits, dtype=torch.float, dim=-1)
    top = probs.gather(-1, indices)
    if getattr(module, "norm_topk_prob", True):
        top = top / top.sum(dim=-1, keepdim=True)
    return top.to(dtype)


class _MicroBatch:
    """What the hooks need during one micro-batch's forward."""

    def __init__(self, layers: int, capture: bool, replay: torch.Tensor | None) -> None:
        self.capture = capture
        self.replay = replay  # [N, layers, k] recorded experts (-1: the router's own choice), or None
        self.logits: list[Any] = [None] * layers
        self.indices: list[Any] = [None] * layers


class RouterHooks:
    """Forward hooks on a model's routers (``routers``: ``(decoder layer index, module)`` in layer
    order) that keep what the loss terms, the metrics and router replay need."""

    def __init__(self, routers: list[tuple[int, Any]], settings: Any, replay: str) -> None:
        self.layer_ids = [layer for layer, _ in routers]
        self.modules = [module for _, module in routers]
        self.experts = int(self.modules[0].num_experts)
        self.top_k = int(self.modules[0].top_k)
        self.settings = settings
        self.replay = replay == "r2"  # r2 records in the old-policy pass and replays in training
        self.replay_given = replay == "r3"  # r3 replays the engine's routes in both passes
        if replay != "none":
            unknown = sorted({type(m).__name__ for m in self.modules} - set(SOFTMAX_ROUTERS))
            if unknown:
                raise ConfigError(f"router replay cannot recompute the routing weights of {', '.join(unknown)}",
                                  key="policy.moe.router_replay", hint="set it to none for this model")
        self.recording: dict[bytes, torch.Tensor] | None = None  # sequence tokens -> [length, layers, k]
        self._current: _MicroBatch | None = None
        self.handles = [module.register_forward_hook(self._hook(position)) for position, module in enumerate(self.modules)]

    def remove(self) -> None:
        """Take the hooks off the model."""
        for handle in self.handles:
            handle.remove()

    def _hook(self, position: int) -> Any:
        def hook(module: Any, args: Any, output: Any) -> Any:
            import torch

            current = self._current
            if current is None:
                return None
            logits, weights, indices = output
            replaced = None
            if current.replay is not None:
                chosen = current.replay[:, position].to(indices.device)
                if chosen.shape != indices.shape:
                    raise RuntimeError(f"router replay: layer {self.layer_ids[position]}'s router saw "
                                       f"{indices.shape[0]} tokens, the micro-batch has {chosen.shape[0]}")
                indices = torch.where(chosen >= 0, chosen.to(indices.dtype), indices)
                replaced = (logits, replay_weights(module, logits, indices, weights.dtype), indices)
            if current.capture:
                current.logits[position], current.indices[position] = logits, indices
            return replaced

        return hook

    @contextmanager
    def micro_batch(self, mb: dict[str, torch.Tensor], training: bool) -> Iterator[_MicroBatch]:
        """Around one micro-batch's forward: captures the routers' outputs when training (for
        :meth:`step_terms`) or when r2 records, and replays a recording in training."""
        replay = self._replay_indices(mb) if training and self.replay else None
        if self.replay_given:
            replay = self._given_indices(mb)
        self._current = _MicroBatch(len(self.modules), capture=training or self.replay, replay=replay)
        try:
            yield self._current
        finally:
            self._current = None

    # -- context parallelism ------------------------------------------------------------------

    @contextmanager
    def split_rows(self, positions: torch.Tensor, padded: int, width: int, gather: Any) -> Iterator[None]:
        """Around a forward in which each row (right-padded to ``padded``) runs only at this rank's
        ``positions`` (context parallelism): a recorded routing is replayed at those positions, and
        afterwards the kept logits and experts are ``gather``-ed (``[rows, positions, ...]`` to
        ``[rows, padded, ...]`` in sequence order, on every rank, gradients back to their rank) and cut
        to the micro-batch's ``width``: the loss terms, metrics and recording then see whole rows, as
        without it (every rank computes the whole terms, as it does the whole loss)."""
        import torch

        current = self._current
        if current is None:  # a forward nothing routes for (logprobs without recording)
            yield
            return
        whole = current.replay  # [rows x width, layers, k]: for the duration, its entries at this rank's positions
        if whole is not None:
            rows = whole.shape[0] // width
            chosen = torch.nn.functional.pad(whole.reshape(rows, width, *whole.shape[1:]),
                                             (0, 0, 0, 0, 0, padded - width), value=-1)
            current.replay = chosen[:, positions.to(chosen.device)].reshape(-1, *whole.shape[1:])
        try:
            yield
        finally:
            current.replay = whole
        if not current.capture:
            return
        local = len(positions)
        for layer, (logits, indices) in enumerate(zip(current.logits, current.indices, strict=True)):
            if logits is None:
                continue
            rows = logits.shape[0] // local
            current.logits[layer] = gather(logits.reshape(rows, local, -1))[:, :width].reshape(rows * width, -1)
            current.indices[layer] = gather(indices.reshape(rows, local, -1))[:, :width].reshape(rows * width, -1)

    # -- router replay (r2) -------------------------------------------------------------------

    def start_recording(self) -> None:
        """A new old-policy pass: forget the previous recording."""
        self.recording = {}

    def record(self, mb: dict[str, torch.Tensor], current: _MicroBatch) -> None:
        """Keep each sequence's chosen experts from a forward just run under :meth:`micro_batch`."""
        import torch

        if not self.replay:
            return
        assert self.recording is not None, "start_recording() first"
        rows, width = mb["input_ids"].shape
        chosen = torch.stack(current.indices, dim=1).reshape(rows, width, len(self.modules), self.top_k)
        small = torch.uint8 if self.experts <= 256 else torch.int16
        tokens = mb["input_ids"].cpu()
        chosen = chosen.to("cpu", small)
        for row, start, length in sequence_spans(mb):
            key = _key(tokens[row, start:start + length])
            self.recording[key] = chosen[row, start:start + length].clone()

    def share_recording(self, world_size: int) -> None:
        """Every rank's recording on every rank (a sequence may train on another rank than the
        one that scored it)."""
        import torch.distributed as dist

        if not self.replay or world_size <= 1 or not dist.is_initialized():
            return
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, self.recording)
        merged: dict[bytes, Any] = {}
        for part in gathered:
            merged.update(part or {})
        self.recording = merged

    def _replay_indices(self, mb: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """``[rows x width, layers, k]`` recorded experts for a training micro-batch (-1 where the
        router chooses: padding, sequences with no loss token); None before any recording (the
        algorithm took no old-policy logprobs: its training forward is the old policy's)."""
        import torch

        if self.recording is None:
            return None
        rows, width = mb["input_ids"].shape
        out = torch.full((rows, width, len(self.modules), self.top_k), -1, dtype=torch.long)
        tokens, loss_mask = mb["input_ids"].cpu(), mb["loss_mask"].cpu()
        for row, start, length in sequence_spans(mb):
            recorded = self.recording.get(_key(tokens[row, start:start + length]))
            if recorded is None:
                if not bool(loss_mask[row, start:start + length].any()):
                    continue  # no token of it enters the loss (an empty filler micro-batch)
                raise RuntimeError(f"router replay (r2): a training sequence of {length} tokens has no recorded "
                                   "routing; the old-policy logprobs of this batch were not computed by this engine")
            out[row, start:start + length] = recorded.long()
        return out.reshape(rows * width, len(self.modules), self.top_k)

    def _given_indices(self, mb: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """r3: ``[rows x width, layers, k]`` of the batch's ``routed_experts`` at this model's MoE
        layers (-1 where the router chooses: padding, tokens the engine never ran); None for a batch
        that holds none (SFT's or DPO's rows: nothing sampled them), which routes afresh."""
        from corerl.generation.routes import FIELD

        given = mb.get(FIELD)
        if given is None:
            return None
        if given.shape[2] <= max(self.layer_ids):
            raise RuntimeError(f"router replay (r3): the generation engine reported {given.shape[2]} layers' experts, "
                               f"the model routes at layer {max(self.layer_ids)}")
        rows, width = mb["input_ids"].shape
        chosen = given[:, :, self.layer_ids].long()
        chosen = chosen.masked_fill(mb["attention_mask"].to(chosen.device)[:, :, None, None] == 0, -1)
        return chosen.reshape(rows * width, len(self.modules), -1)

    # -- the loss terms and metrics -----------------------------------------------------------

    def step_terms(self, mb: dict[str, torch.Tensor], current: _MicroBatch,
                   normaliser: float) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """The loss term to add to one training micro-batch's loss (None when no coefficient is
        set) and its ``moe/*`` metrics, both weighted by the micro-batch's share of the step's
        loss tokens (``normaliser``) so that their sums over micro-batches and ranks are means."""
        import torch

        real = mb["attention_mask"].reshape(-1).bool()
        share = mb["loss_mask"][:, 1:].sum().float() / normaliser
        sequences = _sequence_ids(mb) if self.settings.load_balancing_type == "seq_aux_loss" else None
        aux_terms, z_terms, metrics = [], [], {}
        for position, layer in enumerate(self.layer_ids):
            logits, indices = current.logits[position], current.indices[position]
            if logits is None:
                continue  # a layer this forward did not route (it cannot be: kept for safety)
            logits, indices = logits[real.to(logits.device)].float(), indices[real.to(indices.device)]
            load = expert_load(indices, self.experts)
            aux_terms.append(aux_loss(logits, indices, self.experts) if sequences is None
                             else sequence_aux_loss(logits, indices, sequences[real].to(logits.device), self.experts))
            z_terms.append(z_loss(logits))
            positive = load[load > 0]
            metrics[f"moe/layer{layer}/load_min"] = load.min().detach() * share
            metrics[f"moe/layer{layer}/load_max"] = load.max().detach() * share
            metrics[f"moe/layer{layer}/load_entropy"] = -(positive * positive.log()).sum().detach() * share
        if not aux_terms:
            return None, {}
        aux, z = torch.stack(aux_terms), torch.stack(z_terms)
        metrics["moe/aux_loss"] = aux.mean().detach() * share
        metrics["moe/z_loss"] = z.mean().detach() * share
        coefficient = self.settings.aux_loss_coeff if self.settings.load_balancing_type != "none" else 0.0
        term = None
        if coefficient:
            term = coefficient * aux.sum() * share
        if self.settings.z_loss_coeff:
            extra = self.settings.z_loss_coeff * z.sum() * share
            term = extra if term is None else term + extra
        return term, metrics


def expert_load(indices: torch.Tensor, experts: int) -> torch.Tensor:
    """Each expert's share ``[E]`` of the top-k slots of the tokens ``indices`` (``[N, k]``)."""
    import torch

    counts = torch.bincount(indices.reshape(-1).long(), minlength=experts).float()
    return counts / max(1, indices.numel())


def aux_loss(logits: torch.Tensor, indices: torch.Tensor, experts: int) -> torch.Tensor:
    """Switch-style load-balancing loss of tokens' router ``logits`` ``[N, E]`` and chosen experts
    ``indices`` ``[N, k]``: ``E * sum_e f_e * P_e`` (1.0 when balanced)."""
    if logits.shape[0] == 0:
        return logits.sum() * 0.0
    probs = logits.float().softmax(dim=-1).mean(dim=0)
    return experts * (expert_load(indices, experts).to(probs.device) * probs).sum()


def sequence_aux_loss(logits: torch.Tensor, indices: torch.Tensor, sequences: torch.Tensor,
                      experts: int) -> torch.Tensor:
    """:func:`aux_loss` within each sequence (``sequences``: each token's sequence id, ``[N]``),
    averaged over the sequences."""
    import torch

    if logits.shape[0] == 0:
        return logits.sum() * 0.0
    ids, sequences = torch.unique(sequences, return_inverse=True)
    count, top_k = len(ids), indices.shape[1]
    tokens = torch.bincount(sequences, minlength=count).float()
    probs = torch.zeros((count, experts), dtype=torch.float32, device=logits.device)
    probs = probs.index_add(0, sequences, logits.float().softmax(dim=-1)) / tokens[:, None]
    slots = torch.zeros((count, experts), dtype=torch.float32, device=logits.device)
    rows = sequences[:, None].expand_as(indices).reshape(-1)
    slots = slots.index_put((rows, indices.reshape(-1).long()), torch.ones_like(rows, dtype=torch.float32),
                            accumulate=True) / (tokens[:, None] * top_k)
    return (experts * (slots * probs).sum(dim=1)).mean()


def z_loss(logits: torch.Tensor) -> torch.Tensor:
    """Router z-loss: the mean over tokens of ``logsumexp(logits)^2``."""
    if logits.shape[0] == 0:
        return logits.sum() * 0.0
    return logits.float().logsumexp(dim=-1).square().mean()


def _sequence_ids(mb: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each token's sequence number ``[rows x width]`` (padding gets its row's id; it is masked)."""
    import torch

    rows, width = mb["input_ids"].shape
    out = torch.zeros((rows, width), dtype=torch.long)
    for number, (row, start, length) in enumerate(sequence_spans(mb)):
        out[row, start:start + length] = number
    return out.reshape(-1)


def _key(tokens: torch.Tensor) -> bytes:
    return tokens.numpy().astype("int64").tobytes()
