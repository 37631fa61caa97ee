"""Which of a GPTModel's linear layers ``policy.lora`` adapts (config logic only: no torch).

``policy.lora.target_modules`` and ``exclude_modules`` name Hugging Face modules, as PEFT matches
them (a module's full name, or a suffix of it after a dot: ``q_proj``, ``self_attn.q_proj``,
``model.layers.0.mlp.down_proj``; with a wildcard, a shell pattern of the whole name, as NeMo RL's
megatron ``peft`` section writes them: ``*out_proj*``); megatron's own layer names (``linear_qkv``, ``linear_proj``,
``linear_fc1``, ``linear_fc2``) are taken too. ``match_all_linear`` (PEFT's ``all-linear``) is every
projection of the decoder layers; the embeddings and the output head are never adapted, as with
PEFT. A megatron layer holds several Hugging Face projections (``linear_qkv`` is q, k and v;
``linear_fc1`` is gate and up): each gets an adapter of its own, so the adapters are PEFT's.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

#: megatron's linear layer (its name in a decoder layer) -> the Hugging Face projections it holds,
#: in the order of its output rows (column-parallel) or its one projection (row-parallel)
PROJECTIONS: dict[str, tuple[str, ...]] = {
    "self_attention.linear_qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "self_attention.linear_proj": ("self_attn.o_proj",),
    "mlp.linear_fc1": ("mlp.gate_proj", "mlp.up_proj"),
    "mlp.linear_fc2": ("mlp.down_proj",),
}
#: the column-parallel layers (their output split across tensor-parallel ranks); the others are row-parallel
COLUMN = ("self_attention.linear_qkv", "mlp.linear_fc1")
ALL_LINEAR = ("all-linear", "all_linear")


def hf_module(layer: int, projection: str) -> str:
    """The Hugging Face module name of ``projection`` (e.g. ``self_attn.q_proj``) in decoder layer ``layer``."""
    return f"model.layers.{layer}.{projection}"


def _matches(name: str, key: str) -> bool:
    """PEFT's match (the name, or a suffix after a dot); a key with a wildcard (Megatron-Bridge's
    ``*out_proj*``) matches the whole name as a shell pattern."""
    if any(c in key for c in "*?["):
        return fnmatch.fnmatchcase(name, key)
    return name == key or name.endswith(f".{key}")


def _named(key: str, layer: int, linear: str, projection: str) -> bool:
    """Whether ``key`` names ``projection`` of ``layer``: by its Hugging Face name, or by the megatron
    layer holding it (``linear_qkv``, ``decoder.layers.0.self_attention.linear_qkv``, ...)."""
    return _matches(hf_module(layer, projection), key) or _matches(f"decoder.layers.{layer}.{linear}", key)


def chosen(settings: object, layers: int) -> dict[tuple[int, str], tuple[str, ...]]:
    """``(layer, megatron linear) -> the Hugging Face projections adapted there`` for ``policy.lora``
    (``settings``) on a model of ``layers`` decoder layers; layers with none left out."""
    targets = [t for t in settings.target_modules if t not in ALL_LINEAR]  # type: ignore[attr-defined]
    every = settings.match_all_linear or not settings.target_modules or len(targets) < len(  # type: ignore[attr-defined]
        settings.target_modules)  # type: ignore[attr-defined]
    exclude = list(settings.exclude_modules)  # type: ignore[attr-defined]
    out: dict[tuple[int, str], tuple[str, ...]] = {}
    for layer in range(layers):
        for linear, projections in PROJECTIONS.items():
            picked = tuple(p for p in projections
                           if (every or any(_named(t, layer, linear, p) for t in targets))
                           and not any(_named(x, layer, linear, p) for x in exclude))
            if picked:
                out[(layer, linear)] = picked
    return out


def unmatched_target(settings: object, layers: int) -> str | None:
    """The first of ``policy.lora.target_modules`` that names no adaptable layer of the model (the
    embeddings, the output head, a MoE router, a module the model does not have); None if all do."""
    if settings.match_all_linear:  # type: ignore[attr-defined]
        return None  # target_modules is ignored then
    targets: Sequence[str] = settings.target_modules  # type: ignore[attr-defined]
    for key in targets:
        if key in ALL_LINEAR:
            continue
        if not any(_named(key, layer, linear, p) for layer in range(layers)
                   for linear, projections in PROJECTIONS.items() for p in projections):
            return key
    return None



def peft_targets(settings: object, layers: int) -> str | list[str]:
    """``target_modules`` as a PEFT adapter folder and a generation engine should read it: the
    adapted projections by their Hugging Face names (``q_proj``, ...), or ``all-linear`` where
    every projection of every layer has one. Megatron's layer names and wildcards, which PEFT and
    vLLM do not know, do not reach them; a projection adapted in some layers only is named (PEFT
    then gives the other layers a zero adapter, which changes nothing)."""
    picked = chosen(settings, layers)
    every = len(picked) == layers * len(PROJECTIONS) and all(
        len(projections) == len(PROJECTIONS[linear]) for (_, linear), projections in picked.items())
    return "all-linear" if every else sorted({p.rsplit(".", 1)[1] for ps in picked.values() for p in ps})


def partial_fused(settings: object, layers: int) -> tuple[str, tuple[str, ...]] | None:
    """With ``lora_type: lora`` (one adapter over a whole megatron layer): the first layer whose
    projections are chosen in part (``linear_qkv`` with q only, say), with those chosen; None if none."""
    for (_, linear), projections in chosen(settings, layers).items():
        if len(projections) < len(PROJECTIONS[linear]):
            return linear, projections
    return None
