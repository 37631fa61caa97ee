"""Expert parallelism for Hugging Face mixture-of-experts layers (Qwen3-MoE, Mixtral).

Each MoE layer's routed experts (the fused ``mlp.experts.gate_up_proj`` [E, 2I, H] and
``mlp.experts.down_proj`` [E, H, I]) become DTensors sharded ``Shard(0)`` over the ``ep`` axis
of an expert mesh ``(edp, ep)``: a rank of the expert group holds E/ep consecutive experts.
The router (``mlp.gate``) is left as it is and still runs on every rank over its own tokens;
the experts' forward is replaced by a dispatch:

1. the (token, choice) slots are sorted by the expert they chose, and the number of slots per
   expert is exchanged (``all_to_all_single`` of the counts);
2. the slots' hidden states go to the ranks owning their experts (autograd all-to-all, uneven
   splits), each rank runs its local experts over what it received, and the reverse
   all-to-all brings the outputs back;
3. the outputs are put back in slot order, weighted by the router's scores and summed per token.

The experts are also sharded by FSDP2 over ``edp`` (the ranks that hold the same experts), so
where ``edp`` > 1 their gradients are reduced (averaged) over those ranks. A local expert's
gradient arrives summed over the ``ep`` ranks whose tokens it computed, so the backward pass
scales it by 1/ep: with FSDP's 1/edp, it is divided by the whole data-parallel size, as the
other parameters' gradients are (FSDP2's own divide factor would need PREMUL_SUM, which gloo
lacks). Full state dicts, dcp checkpoints and the weight stream see whole experts
under their in-memory transformers names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from corerl_dtensor.decoder import decoder_layers


@dataclass(frozen=True)
class DispatchPlan:
    """Where one forward's (token, choice) slots go and come back from.

    ``order``: slot indices sorted by chosen expert (stable); ``send_splits`` / ``recv_splits``:
    rows sent to / received from each rank of the expert group; ``local_order``: received rows
    sorted by the local expert they are for; ``local_counts``: rows per local expert."""

    order: torch.Tensor
    send_splits: list[int]
    recv_splits: list[int]
    local_order: torch.Tensor
    local_counts: list[int]


def slot_order(top_k_index: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(slots sorted by expert, slots per expert) for ``top_k_index`` [tokens, k]; a slot is
    ``token * k + choice``."""
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    return order, counts


def plan_from_counts(order: torch.Tensor, counts: torch.Tensor, received_counts: torch.Tensor, ep: int) -> DispatchPlan:
    """The dispatch plan from this rank's slots per expert (``counts`` [E]) and what the expert
    group sends it (``received_counts`` [ep * E/ep]: from source rank s, slots for each of this
    rank's local experts). Pure index arithmetic: no communication."""
    local = counts.numel() // ep
    sent = counts.view(ep, local)
    received = received_counts.view(ep, local)
    expert_of_row = torch.arange(local).repeat(ep).repeat_interleave(received.reshape(-1))
    return DispatchPlan(
        order=order,
        send_splits=sent.sum(1).tolist(),
        recv_splits=received.sum(1).tolist(),
        local_order=torch.argsort(expert_of_row, stable=True),
        local_counts=received.sum(0).tolist(),
    )


def inverse(permutation: torch.Tensor) -> torch.Tensor:
    """The permutation that undoes ``permutation``."""
    out = torch.empty_like(permutation)
    out[permutation] = torch.arange(permutation.numel(), device=permutation.device)
    return out


def exchange_counts(counts: torch.Tensor, group: Any) -> torch.Tensor:
    """Each rank's slots per expert, sent to the experts' owners: [ep * E/ep] counts received."""
    import torch.distributed as dist

    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts.contiguous(), group=group)
    return received


def all_to_all(rows: torch.Tensor, recv_splits: list[int], send_splits: list[int], group: Any) -> torch.Tensor:
    """Rows to the group's ranks, ``send_splits[r]`` to rank r, ``recv_splits[r]`` from it; autograd
    sends the gradients back the same way."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor

    return wait_tensor(all_to_all_single_autograd(rows.contiguous(), recv_splits, send_splits, group))


def local_weight(param: torch.Tensor) -> torch.Tensor:
    """This rank's experts of an expert weight (the local shard of an ``ep``-sharded DTensor)."""
    from torch.distributed.tensor import DTensor

    return param.to_local() if isinstance(param, DTensor) else param


class ScaleGradient(torch.autograd.Function):
    """Identity forward; the backward multiplies the gradient by ``factor``."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.factor, None


def run_local_experts(experts: nn.Module, rows: torch.Tensor, counts: list[int], ep: int) -> torch.Tensor:
    """Rows already grouped by local expert (``counts`` rows each) through their experts; the
    weights' gradients are scaled by 1/ep (see the module's docstring)."""
    gate_up, down = (ScaleGradient.apply(local_weight(p), 1.0 / ep) for p in (experts.gate_up_proj, experts.down_proj))
    outputs = []
    for index, chunk in enumerate(torch.split(rows, counts)):
        gate, up = nn.functional.linear(chunk, gate_up[index]).chunk(2, dim=-1)
        outputs.append(nn.functional.linear(experts.act_fn(gate) * up, down[index]))
    return torch.cat(outputs) if outputs else rows.new_empty((0, down.shape[1]))


def dispatch_forward(experts: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                     top_k_weights: torch.Tensor, group: Any, ep: int) -> torch.Tensor:
    """The experts' output [tokens, H] for ``hidden_states`` [tokens, H] routed to ``top_k_index``
    with ``top_k_weights`` [tokens, k], the experts sharded over ``group`` (``ep`` ranks)."""
    tokens, k = top_k_index.shape
    order, counts = slot_order(top_k_index, experts.num_experts)
    plan = plan_from_counts(order, counts, exchange_counts(counts, group), ep)
    sent = hidden_states[order // k]
    received = all_to_all(sent, plan.recv_splits, plan.send_splits, group)
    computed = run_local_experts(experts, received[plan.local_order], plan.local_counts, ep)
    returned = all_to_all(computed[inverse(plan.local_order)], plan.send_splits, plan.recv_splits, group)
    per_slot = returned[inverse(order)].view(tokens, k, -1)
    weighted = per_slot * top_k_weights.to(per_slot.dtype).unsqueeze(-1)
    return weighted.sum(1).to(hidden_states.dtype)


def moe_experts(model: nn.Module) -> list[nn.Module]:
    """The routed-experts modules of the model's decoder layers (``layer.mlp.experts`` holding
    fused ``gate_up_proj``/``down_proj``); empty for a dense model."""
    found = []
    for layer in decoder_layers(model):
        experts = getattr(getattr(layer, "mlp", None), "experts", None)
        if experts is not None and hasattr(experts, "gate_up_proj") and hasattr(experts, "down_proj"):
            found.append(experts)
    return found


def check_layout(experts: nn.Module, ep: int) -> None:
    """Refuse an experts module this dispatch does not compute like transformers does."""
    for flag, wanted in (("has_bias", False), ("is_transposed", False), ("has_gate", True), ("is_concatenated", True)):
        if getattr(experts, flag, wanted) != wanted:
            raise TypeError(f"{type(experts).__name__} has {flag}={not wanted}; expert parallelism supports fused "
                            "[gate; up] experts without bias (Qwen3-MoE, Mixtral)")
    if experts.num_experts % ep:
        raise ValueError(f"{experts.num_experts} experts cannot be split over expert_parallel_size={ep}")


def apply_expert_parallel(model: nn.Module, ep_mesh: Any) -> list[nn.Module]:
    """Shard every MoE layer's experts ``Shard(0)`` over ``ep_mesh`` and route their forward
    through :func:`dispatch_forward`; returns the experts modules."""
    import types

    from torch.distributed.tensor import Shard, distribute_tensor

    ep, group = ep_mesh.size(), ep_mesh.get_group()
    modules = moe_experts(model)
    for experts in modules:
        check_layout(experts, ep)
        for name in ("gate_up_proj", "down_proj"):
            param = getattr(experts, name)
            sharded = distribute_tensor(param.data, ep_mesh, [Shard(0)])
            setattr(experts, name, nn.Parameter(sharded, requires_grad=param.requires_grad))

        def forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
            return dispatch_forward(self, hidden_states, top_k_index, top_k_weights, group, ep)

        experts.forward = types.MethodType(forward, experts)
    return modules


def shard_experts_fsdp2(modules: list[nn.Module], edp_mesh: Any, mp_policy: Any, offload: Any) -> None:
    """``fully_shard`` each experts module over the ranks holding the same experts (``edp_mesh``),
    before its decoder layer is, so the layer's FSDP leaves them to this one."""
    from torch.distributed.fsdp import fully_shard

    for experts in modules:
        fully_shard(experts, mesh=edp_mesh, mp_policy=mp_policy, offload_policy=offload)
