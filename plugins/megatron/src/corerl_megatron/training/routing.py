"""What megatron-core's MoE routers did in a step: each layer's expert load and dropped tokens
(counted from the routing maps its routers return), the router losses from megatron-core's own
aux-loss tracker, and router replay through megatron-core's ``RouterReplay``: r2
(:class:`RouteReplay`) and r3 (:class:`GivenRoutes`, the generation engine's experts).

Metric names are the project's (``moe/aux_loss``, ``moe/z_loss``, ``moe/layer{i}/load_min``,
``.../load_max``, ``.../load_entropy``, ``moe/dropped_tokens``); the driver sums a metric over
the ranks that report (one per data-parallel group), so each reporting rank gives its share of
the global value (the value divided by the data-parallel size).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

#: megatron-core's tracker names -> ours (the tracker holds each loss without its coefficient)
_TRACKED = {"load_balancing_loss": "moe/aux_loss", "seq_load_balancing_loss": "moe/aux_loss", "z_loss": "moe/z_loss"}


def _routers(model: Any) -> list[Any]:
    from megatron.core.transformer.moe.router import TopKRouter

    return [module for module in model.modules() if isinstance(module, TopKRouter)]


class RoutingStats:
    """Counts, while :attr:`active`, the token-slots each expert of each MoE layer receives and
    those a capacity factor drops, from forward hooks on the model's routers."""

    def __init__(self, model: Any, mconfig: Any) -> None:
        self.layers, self.experts = mconfig.num_layers, mconfig.num_moe_experts
        self.topk, self.capacity = mconfig.moe_router_topk, mconfig.moe_expert_capacity_factor
        self.moe_layers = [i for i, on in enumerate(mconfig.moe_layer_freq) if on]
        self.active = False
        self.reset()
        for router in _routers(model):
            router.register_forward_hook(self._count)

    def reset(self) -> None:
        """Forget the counts (start of a step)."""
        self.load = torch.zeros(self.layers, self.experts, dtype=torch.float64)
        self.slots = torch.zeros(self.layers, dtype=torch.float64)

    def _count(self, router: Any, inputs: Any, output: Any) -> None:
        if not self.active:
            return
        routing_map = output[1].detach()
        layer = router.layer_number - 1
        self.load[layer] += routing_map.sum(dim=0).to("cpu", torch.float64)
        self.slots[layer] += routing_map.shape[0] * self.topk

    def metrics(self, microbatches: int, dp_group: Any, pp_group: Any, reporters: int) -> dict[str, float]:
        """The step's MoE metrics (a collective: every rank calls it); the router losses are read
        from megatron-core's tracker, which is cleared."""
        from megatron.core.transformer.moe.moe_utils import (
            clear_aux_losses_tracker,
            get_moe_layer_wise_logging_tracker,
        )

        counts = torch.cat([self.load.flatten(), self.slots])
        for group in (dp_group, pp_group):
            dist.all_reduce(counts, group=group)
        load = counts[: self.layers * self.experts].view(self.layers, self.experts)
        slots = counts[self.layers * self.experts:]
        out: dict[str, float] = {}
        for layer in self.moe_layers:
            routed = float(load[layer].sum())
            if routed == 0:
                continue
            share = load[layer] / routed
            out[f"moe/layer{layer}/load_min"] = float(share.min())
            out[f"moe/layer{layer}/load_max"] = float(share.max())
            out[f"moe/layer{layer}/load_entropy"] = -sum(p * math.log(p) for p in share.tolist() if p > 0)
        if self.capacity is not None and float(slots.sum()) > 0:
            out["moe/dropped_tokens"] = 1.0 - float(load.sum()) / float(slots.sum())
        tracker = get_moe_layer_wise_logging_tracker()
        for name, metric in _TRACKED.items():
            if name not in tracker:
                continue
            values = tracker[name]["values"].detach().clone().float()
            dist.all_reduce(values, group=pp_group)
            dist.all_reduce(values, group=dp_group)
            per_layer = values / (microbatches * dist.get_world_size(dp_group))
            out[metric] = float(per_layer[self.moe_layers].mean())
        clear_aux_losses_tracker()
        self.reset()
        return {key: value / reporters for key, value in out.items()}


class RouteReplay:
    """``policy.moe.router_replay=r2``: while the old-policy logprobs are computed, each row's
    chosen experts per MoE layer are recorded (keyed by the row's tokens); the training forward
    of the same rows routes to them (megatron-core's ``RouterReplay``: the routing weights are
    recomputed from the current router at the recorded experts, so the router still learns)."""

    def __init__(self) -> None:
        self.recorded: dict[tuple[int, ...], list[torch.Tensor]] = {}

    @staticmethod
    def _key(ids: torch.Tensor, mask: torch.Tensor) -> tuple[int, ...]:
        return tuple(ids[mask.bool()].tolist())

    def start_recording(self) -> None:
        """Record the routing of the forward passes that follow (old-policy logprobs)."""
        from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction

        self.recorded = {}
        RouterReplay.set_global_router_replay_action(RouterReplayAction.RECORD)

    def keep(self, mb: dict[str, torch.Tensor]) -> None:
        """After a recording forward of ``mb``: keep each row's experts per layer ([tokens, k])."""
        from megatron.core.transformer.moe.router_replay import RouterReplay

        ids, mask = mb["input_ids"].cpu(), mb["attention_mask"].cpu()
        rows, width = ids.shape
        per_layer = [indices.detach().cpu().view(width, rows, -1) for indices in RouterReplay.get_recorded_data()]
        for row in range(rows):
            real = mask[row].bool()
            self.recorded[self._key(ids[row], mask[row])] = [indices[:, row][real] for indices in per_layer]

    def share(self) -> None:
        """Every rank's recording on every rank (a row may train on another data-parallel rank than
        the one that scored it)."""
        import torch.distributed as dist

        if not dist.is_initialized() or dist.get_world_size() == 1:
            return
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, self.recorded)
        for part in gathered:
            self.recorded.update(part or {})

    def replay(self, mb: dict[str, torch.Tensor]) -> None:
        """Before a training forward of ``mb``: route its rows as recorded. Before any recording the
        rows route afresh (no old-policy pass was taken: the training forward is the old policy's);
        after one, a row never recorded is an error (r2 needs the old-policy logprobs of every row
        it trains on)."""
        from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction

        if not self.recorded:
            return

        ids, mask = mb["input_ids"].cpu(), mb["attention_mask"].cpu()
        rows, width = ids.shape
        layers = len(RouterReplay.global_router_replay_instances)
        indices: list[torch.Tensor | None] = [None] * layers
        for row in range(rows):
            recorded = self.recorded.get(self._key(ids[row], mask[row]))
            if recorded is None:
                raise RuntimeError("router replay (r2): a training row has no recorded routing; the old-policy "
                                   "logprobs of every trained row must be computed first in the same step")
            for layer, chosen in enumerate(recorded):
                if indices[layer] is None:  # padding positions route to experts 0..k-1 (their output is masked)
                    indices[layer] = torch.arange(chosen.shape[1]).expand(width, rows, -1).clone()
                indices[layer][:, row][mask[row].bool()] = chosen  # type: ignore[index]
        device = mb["input_ids"].device
        RouterReplay.set_replay_data([i.reshape(width * rows, -1).to(device) for i in indices if i is not None])
        RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)

    @staticmethod
    def stop() -> None:
        """Route afresh again (generation, and forwards outside replay)."""
        from megatron.core.transformer.moe.router_replay import RouterReplay

        RouterReplay.clear_global_router_replay_action()
        RouterReplay.clear_global_indices()


class GivenRoutes:
    """``policy.moe.router_replay=r3``: each forward of a policy batch that carries
    ``routed_experts`` (``[rows, width, decoder layers, k]``, the generation engine's choice:
    :mod:`corerl.generation.routes`) routes its tokens to those experts, in the old-policy logprob
    pass and the training forward alike (megatron-core's ``RouterReplay``: the weights come from the
    current router at those experts). Where the engine reported none (padding, the last sampled
    token: nothing reads their outputs) the token goes to experts ``0..k-1``. A batch without the
    field (SFT's rows, the KL reference's) routes afresh. ``split`` (context parallelism) and
    ``sequence_parallel`` cut the routes as they cut the tokens."""

    def __init__(self, model: Any, tp_rank: int, tp: int, sequence_parallel: bool) -> None:
        self.routers = _routers(model)
        self.tp_rank, self.tp, self.sequence_parallel = tp_rank, tp, sequence_parallel

    def replay(self, mb: dict[str, torch.Tensor], split: Any) -> None:
        """Before a forward of ``mb``: its tokens' experts, or free routing where it carries none."""
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        from corerl.sdk import ROUTED_EXPERTS

        given = mb.get(ROUTED_EXPERTS)
        if given is None:
            self.stop()
            return
        layers = [router.layer_number - 1 for router in self.routers]
        if layers and max(layers) >= given.shape[2]:
            raise RuntimeError(f"router replay (r3): the generation engine reported {given.shape[2]} layers' experts, "
                               f"the model routes at layer {max(layers)}")
        routes = given[:, :, layers].long() + 1  # 0: none reported (so that padding added below is none too)
        real = mb["attention_mask"].to(routes.device) != 0
        routes = routes.masked_fill(~real[:, :, None, None], 0)
        # a token the engine did not report takes experts 0..k-1 below: harmless after a row's last
        # loss token (nothing read later depends on it), wrong before one
        loss = mb["loss_mask"].to(routes.device) != 0
        later_loss = loss.flip(1).long().cumsum(1).flip(1) - loss.long() > 0
        unreported = real & (routes[..., 0, 0] == 0) & later_loss
        if bool(unreported.any()):
            row, token = (int(i) for i in unreported.nonzero()[0])
            raise RuntimeError(f"router replay (r3): row {row}'s token {token} has no reported experts and tokens after "
                               "it enter the loss; the generation engine reported routes for part of the sequence only")
        if split is not None:
            routes = split.local(routes)
        routes = routes.transpose(0, 1)  # megatron's tokens run sequence first: [s, b, layers, k]
        if self.sequence_parallel and self.tp > 1:
            routes = routes.chunk(self.tp, dim=0)[self.tp_rank]
        k = routes.shape[-1]
        filler = torch.arange(1, k + 1, device=routes.device).expand_as(routes)
        routes = torch.where(routes[..., :1] > 0, routes, filler) - 1
        for position, router in enumerate(self.routers):
            router.router_replay.clear_indices()
            router.router_replay.set_target_indices(routes[:, :, position].reshape(-1, k).contiguous())
            router.router_replay.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)

    def stop(self) -> None:
        """Route afresh (generation, forwards of batches without routes)."""
        for router in self.routers:
            router.router_replay.clear_router_replay_action()
            router.router_replay.clear_indices()
