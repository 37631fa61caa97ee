"""The Tinker loss functions, position by position, and the refusal of anything else.

Tinker's definitions (its losses pages), each a sum over positions; ``logp`` is the target token's
logprob under the adapter, ``q`` the sampler's (the ``logprobs`` input), ``A`` the advantages:

* ``cross_entropy``: ``-weights * logp`` (``weights`` default to 1); linear in the weights.
* ``importance_sampling``: ``-exp(logp - q) * A``.
* ``ppo``: ``-min(r * A, clip(r, low, high) * A)`` with ``r = exp(logp - q)``; thresholds default
  to 0.8 and 1.2 (Tinker's epsilon of 0.2 on both sides).
* ``cispo``: ``-stopgrad(clip(r, low, high)) * logp * A``; thresholds default to 0.0 and 4.0 (an
  upper clip only, Tinker's default).

The clip thresholds come from ``loss_fn_config`` or from inputs of the same names (one value for
the datum, or one per position).
Validation (:func:`check_request`) needs no torch; :func:`elementwise_loss` works on whatever
tensors it is given, through their methods, so this module imports no torch either.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from corerl.run.tinker.engine import LOSS_FUNCTIONS, USER, Datum, ServiceError

CLIP_KEYS = ("clip_low_threshold", "clip_high_threshold")

#: loss -> default clip thresholds (low, high); an empty tuple: the loss takes no config
DEFAULT_CLIPS: dict[str, tuple[float, ...]] = {
    "cross_entropy": (),
    "importance_sampling": (),
    "ppo": (0.8, 1.2),
    "cispo": (0.0, 4.0),
}

#: loss -> (inputs it needs, inputs it may take)
INPUTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "cross_entropy": (("target_tokens",), ("weights",)),
    "importance_sampling": (("target_tokens", "logprobs", "advantages"), ()),
    "ppo": (("target_tokens", "logprobs", "advantages"), CLIP_KEYS),
    "cispo": (("target_tokens", "logprobs", "advantages"), CLIP_KEYS),
}


def check_loss(loss_fn: str, loss_fn_config: Mapping[str, Any] | None) -> dict[str, float]:
    """The clip thresholds ``loss_fn`` runs with (empty for the losses without any); one line for
    a loss this engine does not compute or a config key or value it does not take."""
    if loss_fn not in DEFAULT_CLIPS:
        raise ServiceError(USER, f"loss_fn {loss_fn!r} is not supported by this server; "
                                 f"use one of {', '.join(LOSS_FUNCTIONS)}")
    defaults = DEFAULT_CLIPS[loss_fn]
    config = dict(loss_fn_config or {})
    allowed = CLIP_KEYS if defaults else ()
    unknown = sorted(set(config) - set(allowed))
    if unknown:
        takes = f"it takes {', '.join(allowed)}" if allowed else "it takes no loss_fn_config"
        raise ServiceError(USER, f"loss_fn_config key {unknown[0]!r} is not a parameter of {loss_fn}; {takes}")
    clips: dict[str, float] = {}
    for key, default in zip(CLIP_KEYS[:len(defaults)], defaults, strict=True):
        value = config.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
            raise ServiceError(USER, f"loss_fn_config.{key} must be a finite number, not {value!r}")
        clips[key] = float(value)
    if clips and not 0.0 <= clips["clip_low_threshold"] <= clips["clip_high_threshold"]:
        raise ServiceError(USER, f"loss_fn_config: {loss_fn} needs 0 <= clip_low_threshold <= clip_high_threshold, "
                                 f"got {clips['clip_low_threshold']} and {clips['clip_high_threshold']}")
    return clips


def check_data(loss_fn: str, data: Sequence[Datum], vocab_size: int, max_length: int) -> None:
    """One line for the first datum ``loss_fn`` cannot take: no tokens, too many, a token or target
    outside the vocabulary, a missing or unknown input, an input of another length than the tokens,
    a value that is not a finite number."""
    needed, optional = INPUTS[loss_fn]
    for index, datum in enumerate(data):
        where = f"data[{index}]"
        length = len(datum.tokens)
        if length == 0:
            raise ServiceError(USER, f"{where}: model_input has no tokens")
        if length > max_length:
            raise ServiceError(USER, f"{where}: {length} tokens is longer than the model's context of {max_length}")
        _check_token_ids(datum.tokens, vocab_size, f"{where}.model_input")
        missing = [name for name in needed if name not in datum.inputs]
        if missing:
            raise ServiceError(USER, f"{where}.loss_fn_inputs lacks {missing[0]!r}, which {loss_fn} needs "
                                     f"({', '.join(needed)})")
        unknown = sorted(set(datum.inputs) - set(needed) - set(optional))
        if unknown:
            raise ServiceError(USER, f"{where}.loss_fn_inputs[{unknown[0]!r}] is not an input of {loss_fn}; "
                                     f"it takes {', '.join(needed + optional)}")
        for name, values in datum.inputs.items():
            if len(values) != length and not (name in CLIP_KEYS and len(values) == 1):
                raise ServiceError(USER, f"{where}.loss_fn_inputs[{name!r}] has {len(values)} values for "
                                         f"{length} tokens; every input is aligned with the tokens"
                                         + (" (a clip threshold may also be one value)" if name in CLIP_KEYS else ""))
            if name == "target_tokens":
                _check_token_ids(values, vocab_size, f"{where}.loss_fn_inputs['target_tokens']")
            elif not all(math.isfinite(float(v)) for v in values):
                raise ServiceError(USER, f"{where}.loss_fn_inputs[{name!r}] holds a value that is not a finite number")


def _check_token_ids(values: Sequence[float], vocab_size: int, where: str) -> None:
    for value in values:
        if not float(value).is_integer() or not 0 <= int(value) < vocab_size:
            shown = int(value) if float(value).is_integer() else value
            raise ServiceError(USER, f"{where}: token {shown!r} is outside the model's vocabulary of {vocab_size}")


def check_request(loss_fn: str, loss_fn_config: Mapping[str, Any] | None, data: Sequence[Datum],
                  vocab_size: int, max_length: int) -> dict[str, float]:
    """:func:`check_loss` then :func:`check_data`; returns the clip thresholds."""
    clips = check_loss(loss_fn, loss_fn_config)
    check_data(loss_fn, data, vocab_size, max_length)
    return clips


def elementwise_loss(loss_fn: str, logp: Any, inputs: Mapping[str, Any], clips: Mapping[str, float]) -> Any:
    """The loss at each position (a tensor shaped like ``logp``); its sum is the datum's loss.

    ``inputs`` are tensors shaped like ``logp`` (``target_tokens`` already used to pick ``logp``);
    a per-position ``clip_low_threshold``/``clip_high_threshold`` input wins over ``clips``.
    """
    if loss_fn == "cross_entropy":
        weights = inputs.get("weights")
        return -logp if weights is None else -(weights * logp)
    advantages = inputs["advantages"]
    ratio = (logp - inputs["logprobs"]).exp()
    if loss_fn == "importance_sampling":
        return -(ratio * advantages)
    low = inputs.get("clip_low_threshold", clips["clip_low_threshold"])
    high = inputs.get("clip_high_threshold", clips["clip_high_threshold"])
    clipped = _clamp(ratio, low, high)
    if loss_fn == "ppo":
        return -(ratio * advantages).minimum(clipped * advantages)
    if loss_fn == "cispo":
        return -(clipped.detach() * logp * advantages)
    raise ServiceError(USER, f"loss_fn {loss_fn!r} is not supported by this server")


def _clamp(values: Any, low: Any, high: Any) -> Any:
    """``values`` clamped to [low, high], each bound a number or a tensor like ``values``."""
    if isinstance(low, (int, float)) and isinstance(high, (int, float)):
        return values.clamp(low, high)
    low_t = values.new_full(values.shape, low) if isinstance(low, (int, float)) else low
    high_t = values.new_full(values.shape, high) if isinstance(high, (int, float)) else high
    return values.maximum(low_t).minimum(high_t)
