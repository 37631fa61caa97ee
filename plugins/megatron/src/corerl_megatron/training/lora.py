"""LoRA adapters on a megatron-core GPTModel's linear layers (``policy.lora``), written here.

Why our own: megatron-core has no LoRA layers (its LoRA lives in Megatron-Bridge, which this
backend does not depend on), and PEFT wraps ``torch.nn.Linear`` modules, which megatron's
``ColumnParallelLinear`` / ``RowParallelLinear`` are not (they take and return tensor-parallel
shards, and return ``(output, bias)``).

Each adapted linear layer gets a child module ``lora`` holding its adapters, as
``policy.megatron_cfg.lora_type`` says: ``canonical_lora`` (the default), one adapter per Hugging
Face projection the layer computes (:data:`corerl_megatron.lora_targets.PROJECTIONS`: ``linear_qkv``
holds q, k and v, ``linear_fc1`` gate and up), exactly PEFT's adapters on the Hugging Face model; or
``lora`` (Megatron-Bridge's LoRA, SkyRL's and NeMo RL's megatron default), one adapter over the whole
layer's rows, which as PEFT adapters is q, k and v (gate and up) sharing one A, B's rows split between
them. Each adds ``scale * B(A(dropout(x)))`` to its output rows, ``scale = alpha / r``,
A initialised as ``policy.lora.lora_A_init`` says (from a generator seeded per layer, so every
tensor-parallel layout starts from the same adapter), B zero. A forward hook adds it to the
layer's output; the layer and its parameter names are untouched (the base weights stay where the
conversion and the checkpoints expect them), and only the adapters require gradients.

Tensor parallelism, as megatron splits the base layer:

- column-parallel (``linear_qkv``, ``linear_fc1``; input whole, output rows split): A whole on
  every rank; B split like the projection's rows (each rank the rows of its query groups, or its
  slice of gate and of up; a fused B as the layer's weight is). ``A x`` goes through megatron's copy-to-tensor-parallel region
  (identity forward, all-reduce backward), so A's gradient and the input's gradient sum every
  rank's rows, as the base layer's input gradient does;
- row-parallel (``linear_proj``, ``linear_fc2``; input split): A split like the input columns,
  its partial products summed across ranks (megatron's reduce-from region, as the base layer's
  partial sums are); B whole on every rank.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import torch

from corerl_megatron.lora_targets import COLUMN, PROJECTIONS, chosen, hf_module, peft_targets

ADAPTER = "lora"  # the child module of an adapted linear layer
FUSED = "fused"  # the one adapter of a layer with lora_type "lora" (q, k, v or gate, up sharing it)
PEFT_PREFIX = "base_model.model."  # PEFT's saved names: base_model.model.<module>.lora_A.weight
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


class Adapter(torch.nn.Module):
    """One projection's adapter: ``lora_A`` ``[r, in]`` and ``lora_B`` ``[out, r]`` (this rank's shards)."""

    def __init__(self, a: torch.Tensor, out_rows: int) -> None:
        super().__init__()
        self.lora_A = torch.nn.Linear(a.shape[1], a.shape[0], bias=False, dtype=a.dtype, device=a.device)
        self.lora_B = torch.nn.Linear(a.shape[0], out_rows, bias=False, dtype=a.dtype, device=a.device)
        with torch.no_grad():
            self.lora_A.weight.copy_(a)
            self.lora_B.weight.zero_()


class LoraLayer(torch.nn.Module):
    """The adapters of one megatron linear layer and how their outputs join its output."""

    def __init__(self, linear: str, projections: tuple[str, ...], adapters: dict[str, Adapter], scale: float,
                 dropout: float, groups: int, per_group: int, head_dim: int) -> None:
        super().__init__()
        self.linear, self.projections, self.scale = linear, projections, scale
        self.column = linear in COLUMN
        self.adapters = torch.nn.ModuleDict(adapters)
        self.dropout = torch.nn.Dropout(dropout) if dropout > 0 else torch.nn.Identity()
        self.groups, self.per_group, self.head_dim = groups, per_group, head_dim  # linear_qkv's local layout
        self.enabled = True

    def forward(self, x: torch.Tensor) -> torch.Tensor | None:
        """``scale * B A x`` laid out like the base layer's (local) output; None while switched off."""
        from megatron.core.parallel_state import get_tensor_model_parallel_group
        from megatron.core.tensor_parallel.mappings import (
            copy_to_tensor_model_parallel_region,
            reduce_from_tensor_model_parallel_region,
        )

        if not self.enabled:
            return None
        outs, group = {}, get_tensor_model_parallel_group()
        for name, adapter in self.adapters.items():
            hidden = adapter.lora_A(self.dropout(x))
            if self.column:
                hidden = copy_to_tensor_model_parallel_region(hidden, group=group)
            else:
                hidden = reduce_from_tensor_model_parallel_region(hidden, group=group)
            outs[name] = adapter.lora_B(hidden) * self.scale
        return self.join(outs)

    def join(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        """The projections' outputs ``[..., rows]`` as the layer's output rows (a projection without
        an adapter contributes zeros): linear_qkv's per query group q, k, v; linear_fc1's gate then up."""
        full = PROJECTIONS[self.linear]
        if FUSED in parts:  # one adapter over the layer's rows, in its own layout
            return parts[FUSED]
        if len(full) == 1:
            return parts[full[0].rsplit(".", 1)[1]]
        some = next(iter(parts.values()))
        lead = some.shape[:-1]
        if self.linear.endswith("linear_qkv"):
            g, d = self.groups, self.head_dim
            widths = {"q_proj": self.per_group * d, "k_proj": d, "v_proj": d}
            pieces = [parts[n].reshape(*lead, g, w) if n in parts else some.new_zeros(*lead, g, w)
                      for n, w in widths.items()]
            return torch.cat(pieces, dim=-1).reshape(*lead, g * sum(widths.values()))
        rows = some.shape[-1]  # gate's and up's rows are alike
        return torch.cat([parts[n] if n in parts else some.new_zeros(*lead, rows) for n in ("gate_proj", "up_proj")],
                         dim=-1)

    def split_rows(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """The whole layer's rows (``[rows, ...]``, every rank's) by projection, in the Hugging Face
        projections' order: linear_qkv's q, k, v per query group; linear_fc1's gate then up."""
        if self.linear.endswith("linear_qkv"):
            d, rest = self.head_dim, rows.shape[1:]
            grouped = rows.reshape(-1, (self.per_group + 2) * d, *rest)
            q, k, v = torch.split(grouped, [self.per_group * d, d, d], dim=1)
            return {"q_proj": q.reshape(-1, *rest), "k_proj": k.reshape(-1, *rest), "v_proj": v.reshape(-1, *rest)}
        gate, up = rows.chunk(2, dim=0)
        return {"gate_proj": gate, "up_proj": up}

    def delta_weight(self) -> torch.Tensor:
        """``scale * B A`` of every adapter as this rank's shard of the base weight ``[rows, cols]``."""
        parts = {name: (a.lora_B.weight @ a.lora_A.weight).T * self.scale for name, a in self.adapters.items()}
        return self.join(parts).T


def _hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
    delta = getattr(module, ADAPTER)(args[0] if args else kwargs["input_"])
    if delta is None:
        return output
    out, bias = output
    return out + delta.to(out.dtype), bias


def initial_a(settings: Any, rank: int, width: int, seed: int) -> torch.Tensor:
    """A fresh ``A`` ``[rank, width]`` (float32) as ``policy.lora.lora_A_init`` says: xavier (normal),
    or uniform (PEFT's default, ``nn.Linear``'s Kaiming-uniform), from a generator seeded with ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    a = torch.empty(rank, width)
    if settings.lora_A_init == "xavier":
        torch.nn.init.xavier_normal_(a, generator=generator)
    else:
        torch.nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)
    return a


def attach(model: Any, settings: Any, numbering: dict[int, int], layers: int, *, tp_rank: int, tp: int,
           seed: int, fused: bool = False) -> list[LoraLayer]:
    """Give ``model``'s (one pipeline stage's) chosen linear layers their adapters and freeze every
    other parameter. ``numbering``: local -> global layer index; ``layers``: the model's count.
    ``fused`` (``lora_type: lora``): one adapter per layer, over all its rows (linear_qkv's q, k and
    v, linear_fc1's gate and up share A and B; selection checks that a fused layer is chosen whole)."""
    for param in model.parameters():
        param.requires_grad_(False)
    targets = chosen(settings, layers)
    config = model.config
    groups = config.num_query_groups // tp
    per_group = config.num_attention_heads // config.num_query_groups
    added = []
    for local, layer in enumerate(getattr(model.decoder, "layers", [])):
        index = numbering[local]
        for linear, projections in PROJECTIONS.items():
            picked = targets.get((index, linear))
            if not picked:
                continue
            module = layer.get_submodule(linear)
            weight = module.weight
            rows, cols = weight.shape
            adapters = {}
            for number, projection in enumerate(projections):
                if projection not in picked or (fused and number > 0):
                    continue
                full_cols = cols if linear in COLUMN else cols * tp
                a = initial_a(settings, settings.dim, full_cols,
                              seed * 1_000_003 + index * 101 + list(PROJECTIONS).index(linear) * 11 + number)
                if linear not in COLUMN:
                    a = a.chunk(tp, dim=1)[tp_rank]
                out_rows = rows if fused else _projection_rows(linear, projection, rows, groups, per_group,
                                                               config.kv_channels)
                adapter = Adapter(a.to(device=weight.device, dtype=weight.dtype).contiguous(), out_rows)
                _mark(adapter.lora_A.weight, None if linear in COLUMN else 1)
                _mark(adapter.lora_B.weight, 0 if linear in COLUMN else None)
                adapters[FUSED if fused and len(projections) > 1 else projection.rsplit(".", 1)[1]] = adapter
            lora = LoraLayer(linear, projections, adapters, settings.alpha / settings.dim, settings.dropout,
                             groups, per_group, config.kv_channels)
            module.add_module(ADAPTER, lora)
            module.register_forward_hook(_hook, with_kwargs=True)
            added.append(lora)
    return added


def _projection_rows(linear: str, projection: str, rows: int, groups: int, per_group: int, head_dim: int) -> int:
    """This rank's output rows of ``projection`` within ``linear``'s local ``rows``."""
    if linear.endswith("linear_qkv"):
        return groups * (per_group * head_dim if projection.endswith("q_proj") else head_dim)
    if linear.endswith("linear_fc1"):
        return rows // 2
    return rows


def _mark(param: torch.Tensor, dim: int | None) -> None:
    """megatron's tensor-parallel attributes (its grad norm counts a replicated tensor once)."""
    param.tensor_model_parallel = dim is not None  # type: ignore[attr-defined]
    param.partition_dim = dim if dim is not None else -1  # type: ignore[attr-defined]
    param.partition_stride = 1  # type: ignore[attr-defined]


def layers_of(model: Any) -> dict[str, LoraLayer]:
    """Local name of each adapted linear layer (``decoder.layers.0.self_attention.linear_qkv``) -> its adapters."""
    return {name[: -len(f".{ADAPTER}")]: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def set_enabled(model: Any, enabled: bool) -> None:
    """Switch every adapter on or off (off: the base model's outputs, the KL reference)."""
    for layer in layers_of(model).values():
        layer.enabled = enabled


def is_adapter(name: str) -> bool:
    return f".{ADAPTER}.adapters." in name


def merged(model: Any, name: str, local: torch.Tensor) -> torch.Tensor:
    """This rank's shard of parameter ``name`` with its layer's adapters merged in (W + scale B A)."""
    if not name.endswith(".weight"):
        return local
    layer = layers_of(model).get(name[: -len(".weight")])
    return local if layer is None else local + layer.delta_weight().to(local.dtype)


def peft_tensors(model: Any, numbering: dict[int, int], group: Any, tp: int,
                 of: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """This stage's adapters whole, under PEFT's saved names and in the Hugging Face projections'
    layout (a collective over the tensor-parallel ``group``: every rank of it calls this). ``of``:
    what of each adapter parameter (its gradient, say); the parameter itself by default."""
    from corerl_megatron.training.sharding import gather

    take = of or (lambda param: param)

    out = {}
    for local_name, layer in layers_of(model).items():
        match = _LAYER.match(local_name)
        assert match is not None
        index = numbering[int(match.group(1))]
        for short, adapter in layer.adapters.items():
            a, b = take(adapter.lora_A.weight).detach(), take(adapter.lora_B.weight).detach()
            if tp > 1:  # the split one whole again: B's rows (column-parallel) or A's columns (row-parallel)
                if layer.column:  # a fused linear_fc1's ranks hold [gate_r; up_r]: gathered as its weight is
                    b = gather(f"{layer.linear}.weight" if short == FUSED else short, b, 0, group, tp)
                else:
                    a = gather(short, a, 1, group, tp)
            parts = layer.split_rows(b) if short == FUSED else {short: b}
            for name, part in parts.items():  # a fused adapter: each projection gets its rows of B, and A
                prefix = PEFT_PREFIX + hf_module(index, next(p for p in PROJECTIONS[layer.linear]
                                                             if p.endswith(f".{name}")))
                out[f"{prefix}.lora_A.weight"] = a.to("cpu", copy=True)
                out[f"{prefix}.lora_B.weight"] = part.to("cpu", copy=True).contiguous()
    return out


def peft_config(settings: Any, layers: int, base_model_path: str | None) -> dict[str, Any]:
    """The ``adapter_config.json`` content of the adapters (PEFT's ``LoraConfig`` as a dict: what a
    generation engine rebuilds it from): rank, alpha and dropout as ``policy.lora`` says, the
    target modules by their Hugging Face names (:func:`corerl_megatron.lora_targets.peft_targets`)."""
    import json

    from peft import LoraConfig

    config = LoraConfig(r=settings.dim, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                        target_modules=peft_targets(settings, layers), task_type="CAUSAL_LM", bias="none",
                        init_lora_weights=True, base_model_name_or_path=base_model_path)
    return json.loads(json.dumps(config.to_dict(), default=list))
