"""Hugging Face state dicts <-> Megatron GPTModel state dicts (full, unsharded tensors).

Driven by the family tables in :mod:`corerl_megatron.conversion.families`; exact in both directions
(tensors are only sliced, stacked and concatenated).
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from corerl_megatron.conversion.families import Family, Rule


@attrs.frozen
class Shape:
    """What the mapping needs to know of the model: layers, heads, tying and biases."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tied: bool
    qkv_bias: bool
    #: a critic's value model: its one-output head ``score.weight`` (never tied to the embeddings)
    #: is Megatron's ``output_layer.weight``, where a causal LM's ``lm_head.weight`` goes, and its
    #: ``score.bias`` is ``output_layer.bias``
    value_head: bool = False
    #: a mixture of experts: the routed experts of a MoE layer (0: a dense model), and which layers route
    experts: int = 0
    moe_layers: tuple[int, ...] = ()
    #: the multi-token-prediction heads the checkpoint carries (0: none, or a family without MTP rules)
    mtp_layers: int = 0

    @classmethod
    def from_hf_config(cls, hf: Any, family: Family, value_head: bool = False) -> Shape:
        """The shape of the Hugging Face config ``hf`` of a model of ``family`` (a vision-language
        model's: its text config's, tying as the model says)."""
        tied = getattr(hf, "tie_word_embeddings", None)  # a vision-language model says it at the top level
        hf = hf.get_text_config() if hasattr(hf, "get_text_config") else hf
        tied = getattr(hf, "tie_word_embeddings", False) if tied is None else tied
        heads = hf.num_attention_heads
        experts = expert_count(hf)
        return cls(
            num_layers=hf.num_hidden_layers, num_heads=heads,
            num_kv_heads=getattr(hf, "num_key_value_heads", None) or heads,
            head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // heads,
            tied=bool(tied) and not value_head,
            qkv_bias=bool(getattr(hf, "attention_bias", family.qkv_bias_default)),
            value_head=value_head, experts=experts,
            moe_layers=moe_layer_indices(hf) if experts else (),
            mtp_layers=mtp_layer_count(hf) if any(r.when == "mtp" for r in family.rules) and not value_head else 0,
        )


def mtp_layer_count(hf: Any) -> int:
    """The multi-token-prediction heads of the Hugging Face config ``hf``: MiMo's and DeepSeek's
    ``num_nextn_predict_layers``, Qwen3.5's and Qwen3-Next's ``mtp_num_hidden_layers`` (0: none)."""
    text = hf.get_text_config() if hasattr(hf, "get_text_config") else hf
    return int(getattr(text, "num_nextn_predict_layers", None) or getattr(text, "mtp_num_hidden_layers", None) or 0)


def expert_count(hf: Any) -> int:
    """The routed experts of a MoE layer of the Hugging Face config ``hf`` (0: a dense model)."""
    return int(getattr(hf, "num_experts", None) or getattr(hf, "num_local_experts", None) or 0)


def moe_layer_indices(hf: Any) -> tuple[int, ...]:
    """The decoder layers that route to experts: Qwen's ``decoder_sparse_step`` and
    ``mlp_only_layers`` and GLM-4.5's (DeepSeek's) ``first_k_dense_replace`` leave some layers
    dense; Mixtral routes in every layer."""
    step = int(getattr(hf, "decoder_sparse_step", None) or 1)
    dense = set(getattr(hf, "mlp_only_layers", None) or ()) | set(range(int(getattr(hf, "first_k_dense_replace", 0) or 0)))
    return tuple(i for i in range(hf.num_hidden_layers) if i not in dense and (i + 1) % step == 0)


def _applies(rule: Rule, shape: Shape) -> bool:
    return rule.when in ("always", "moe", "dense") or (rule.when == "untied" and not shape.tied) or \
        (rule.when == "qkv_bias" and shape.qkv_bias) or (rule.when == "mtp" and shape.mtp_layers > 0) or \
        (rule.when == "mtp_qkv_bias" and shape.mtp_layers > 0 and shape.qkv_bias)


def _layers(rule: Rule, shape: Shape) -> list[int]:
    if rule.when == "moe":
        return list(shape.moe_layers)
    if rule.when == "dense":
        return [i for i in range(shape.num_layers) if i not in shape.moe_layers]
    if rule.when in ("mtp", "mtp_qkv_bias"):
        return list(range(shape.mtp_layers))
    return list(range(shape.num_layers))


def _expand(rule: Rule, shape: Shape) -> list[tuple[str, tuple[str, ...]]]:
    if "{i}" not in rule.megatron:
        return [(rule.megatron, rule.hf)]
    return [(rule.megatron.format(i=i, e="{e}"), tuple(h.format(i=i) for h in rule.hf)) for i in _layers(rule, shape)]


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: Shape) -> torch.Tensor:
    """q ``[heads*d, ...]``, k and v ``[kv_heads*d, ...]`` -> per query group: its query heads, its k, its v."""
    groups, d = shape.num_kv_heads, shape.head_dim
    per_group = shape.num_heads // groups
    rest = q.shape[1:]
    q = q.reshape(groups, per_group * d, *rest)
    k = k.reshape(groups, d, *rest)
    v = v.reshape(groups, d, *rest)
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def split_qkv(qkv: torch.Tensor, shape: Shape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inverse of :func:`fuse_qkv`."""
    groups, d = shape.num_kv_heads, shape.head_dim
    per_group = shape.num_heads // groups
    rest = qkv.shape[1:]
    grouped = qkv.reshape(groups, (per_group + 2) * d, *rest)
    q, k, v = torch.split(grouped, [per_group * d, d, d], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def swap_halves(weight: torch.Tensor) -> torch.Tensor:
    """A ``[out, 2h]`` projection over [a; b] as the same projection over [b; a] (its own inverse)."""
    first, second = torch.chunk(weight, 2, dim=1)
    return torch.cat([second, first], dim=1)


def hf_to_megatron(hf_state: dict[str, torch.Tensor], family: Family, shape: Shape) -> dict[str, torch.Tensor]:
    """The Megatron state dict of a Hugging Face one; every Hugging Face tensor must be used."""
    out: dict[str, torch.Tensor] = {}
    if shape.value_head:  # the family tables map the output head by its causal-LM name
        hf_state = {("lm_head.weight" if k == "score.weight" else k): v for k, v in hf_state.items()}
        if "score.bias" in hf_state:
            out["output_layer.bias"] = hf_state.pop("score.bias")
    used: set[str] = set()
    for rule in family.rules:
        if not _applies(rule, shape):
            continue
        if rule.kind == "prefix":  # a whole sub-model, names and tensors unchanged past the prefix
            for name in [n for n in hf_state if n.startswith(rule.hf[0])]:
                out[rule.megatron + name[len(rule.hf[0]):]] = hf_state[name]
                used.add(name)
            continue
        for target, sources in _expand(rule, shape):
            missing = [s for s in sources if s not in hf_state]
            if missing:
                raise KeyError(f"the {family.name} checkpoint lacks {missing[0]} (needed for {target})")
            tensors = [hf_state[s] for s in sources]
            used.update(sources)
            if rule.kind == "qkv":
                out[target] = fuse_qkv(*tensors, shape)
            elif rule.kind == "gate_up":
                out[target] = torch.cat(tensors, dim=0)
            elif rule.kind == "swap_halves":
                out[target] = swap_halves(tensors[0])
            elif rule.kind == "expert":  # transformers stacks the experts: one Megatron tensor each
                for expert, part in enumerate(tensors[0].unbind(0)):
                    out[target.format(e=expert)] = part
            else:
                out[target] = tensors[0]
    left = sorted(set(hf_state) - used - ({"lm_head.weight"} if shape.tied else set()))
    if left:
        raise KeyError(f"the {family.name} table has no rule for {left[0]} ({len(left)} tensors unmapped)")
    return {k: v.contiguous() for k, v in out.items()}


def megatron_to_hf(state: dict[str, torch.Tensor], family: Family, shape: Shape) -> dict[str, torch.Tensor]:
    """The Hugging Face state dict of a Megatron one (the inverse of :func:`hf_to_megatron`)."""
    out: dict[str, torch.Tensor] = {}
    for rule in family.rules:
        if not _applies(rule, shape):
            continue
        if rule.kind == "prefix":
            for name in [n for n in state if n.startswith(rule.megatron)]:
                out[rule.hf[0] + name[len(rule.megatron):]] = state[name].contiguous()
            continue
        for source, targets in _expand(rule, shape):
            if rule.kind == "expert":
                out[targets[0]] = torch.stack([state[source.format(e=e)] for e in range(shape.experts)]).contiguous()
                continue
            if rule.when in ("mtp", "mtp_qkv_bias") and source not in state:
                continue  # a model built with fewer heads than its checkpoint (mtp_num_layers) exports those it has
            tensor = state[source]
            if rule.kind == "swap_halves":
                parts = (swap_halves(tensor),)
            elif rule.kind == "qkv":
                parts = split_qkv(tensor, shape)
            elif rule.kind == "gate_up":
                parts = tuple(torch.chunk(tensor, 2, dim=0))
            else:
                parts = (tensor,)
            for name, part in zip(targets, parts, strict=True):
                out[name] = part.contiguous()
    if shape.tied:
        embeddings = next(r for r in family.rules if r.megatron == "embedding.word_embeddings.weight").hf[0]
        out["lm_head.weight"] = out[embeddings]
    if shape.value_head:
        out["score.weight"] = out.pop("lm_head.weight")
        if "output_layer.bias" in state:
            out["score.bias"] = state["output_layer.bias"].contiguous()
    return out
