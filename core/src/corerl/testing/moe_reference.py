"""The plain PyTorch step a mixture-of-experts backend is held to by the conformance suite's MoE
checks (:class:`corerl.testing.conformance.MoeConformance`): a transformers model, the whole
batch in one forward, the policy loss plus the router's loss terms of each micro-batch, SGD.

The router terms are written here from transformers' own pieces, not from the code under test:
the load-balancing loss is transformers' Switch loss (``load_balancing_loss_func``, divided by
``k`` so that a balanced router gives 1.0), the z-loss the mean over real tokens of
``logsumexp(logits)^2``. Each micro-batch's terms (summed over the MoE layers) and metrics
(averaged over them) are weighted by its share of the step's loss tokens, the convention of
:mod:`corerl.training.moe_router` (docs/moe.md).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

#: the suite's tiny Qwen3-MoE: 4 experts (so expert parallelism 2 gives each rank two), top-2,
#: weights drawn wide (0.2) so that each token's top-2 stands clear of the third expert and
#: every implementation routes it the same
MOE_SHAPE: dict[str, Any] = dict(family="qwen3_moe", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                                 head_dim=16, num_experts=4, experts_per_token=2, expert_intermediate_size=32,
                                 vocab_size=128, initializer_range=0.2)


def build_moe_conformance_model(out: str | Path) -> str:
    """Write the suite's tiny Qwen3-MoE (:data:`MOE_SHAPE`) to ``out``; its path."""
    from corerl.models.tiny import build_tiny_model

    return str(build_tiny_model(out, **MOE_SHAPE))


def _routers(model: Any) -> list[tuple[int, Any]]:
    """(decoder layer index, router module) of each MoE layer, in layer order."""
    layers = model.model.layers
    return [(i, layer.mlp.gate) for i, layer in enumerate(layers) if type(layer.mlp.gate).__name__.endswith("TopKRouter")]


def reference_router_step(
    model_dir: str, batch: dict[str, torch.Tensor], loss_fn: Any, *, micro_batch_rows: int, aux_coeff: float,
    z_coeff: float, freeze_router: bool, lr: float, momentum: float, max_grad_norm: float,
) -> tuple[float, dict[str, torch.Tensor], dict[str, float]]:
    """One SGD step of a transformers MoE model on ``batch``: ``loss_fn``'s loss plus, for each
    micro-batch of ``micro_batch_rows`` consecutive rows, its loss-token share times
    ``aux_coeff x`` the load-balancing losses and ``z_coeff x`` the z-losses summed over the MoE
    layers; gradients clipped to ``max_grad_norm``. ``freeze_router``: the routers take no
    gradient. Returns the policy loss alone, the parameters after the step by name, and the step's
    expected ``moe/*`` metrics."""
    from transformers import AutoModelForCausalLM
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    routers = _routers(model)
    experts, top_k = int(routers[0][1].num_experts), int(routers[0][1].top_k)
    for _, router in routers:
        router.requires_grad_(not freeze_router)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    out = model(input_ids=ids, attention_mask=mask, output_router_logits=True, use_cache=False)
    logp = torch.log_softmax(out.logits[:, :-1].float(), dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    logprobs = torch.cat([torch.zeros_like(logp[:, :1]), logp], dim=1) * mask
    normaliser = float(batch["loss_mask"][:, 1:].sum())
    loss, _ = loss_fn(logprobs, batch, normaliser)
    policy_loss = float(loss.detach())
    width = ids.shape[1]
    metrics: dict[str, float] = {}
    for first in range(0, ids.shape[0], micro_batch_rows):
        rows = slice(first, first + micro_batch_rows)
        share = float(batch["loss_mask"][rows, 1:].sum()) / normaliser
        real = mask[rows].reshape(-1).bool()
        aux_sum = z_sum = torch.zeros(())
        for (layer, _), layer_logits in zip(routers, out.router_logits, strict=True):
            logits = layer_logits[first * width:(first + micro_batch_rows) * width]
            aux = load_balancing_loss_func((logits,), experts, top_k, mask[rows]) / top_k
            z = logits[real].logsumexp(dim=-1).square().mean()
            aux_sum, z_sum = aux_sum + aux, z_sum + z
            counts = torch.bincount(logits[real].topk(top_k, dim=-1).indices.reshape(-1), minlength=experts).float()
            load = (counts / counts.sum()).tolist()
            entropy = -sum(v * math.log(v) for v in load if v > 0)
            for name, value in (("load_min", min(load)), ("load_max", max(load)), ("load_entropy", entropy)):
                key = f"moe/layer{layer}/{name}"
                metrics[key] = metrics.get(key, 0.0) + share * value
            metrics["moe/aux_loss"] = metrics.get("moe/aux_loss", 0.0) + share * float(aux.detach()) / len(routers)
            metrics["moe/z_loss"] = metrics.get("moe/z_loss", 0.0) + share * float(z.detach()) / len(routers)
        loss = loss + share * (aux_coeff * aux_sum + z_coeff * z_sum)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return policy_loss, {n: p.detach().clone() for n, p in model.named_parameters()}, metrics
