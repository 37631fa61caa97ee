"""corerl's sampling calls in SGLang's terms and SGLang's answers back in corerl's, as plain data
(no SGLang import): one request per sample, so that each draws from its own seed."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from corerl.sdk import Sample, SamplingSettings


def request_seed(sampling: SamplingSettings, prompt: int, sample: int, n: int) -> int | None:
    """The seed of sample ``sample`` of prompt ``prompt``: the prompt's request seed plus the
    sample's index (contract 2.12), else the call's seed plus the request's place in the call,
    else none."""
    if sampling.request_seeds is not None:
        return sampling.request_seeds[prompt] + sample
    if sampling.seed is not None:
        return sampling.seed + prompt * n + sample
    return None


def _unseeded() -> int:
    """A fresh seed for a request that has none: SGLang's seeded sampler would give every such
    request the same one, and a prompt's samples must differ."""
    import random

    return random.SystemRandom().randrange(2**31)


def sampling_params(sampling: SamplingSettings, seed: int | None) -> dict[str, Any]:
    """One request's ``sampling_params`` (SGLang's ``SamplingParams`` keys)."""
    params: dict[str, Any] = {
        "max_new_tokens": sampling.max_new_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k if sampling.top_k else -1,  # -1: the whole vocabulary
        "ignore_eos": sampling.ignore_eos,
        "no_stop_trim": True,  # a stop string stays in the completion, as corerl's other engines keep it
    }
    if sampling.stop_token_ids and not sampling.ignore_eos:
        params["stop_token_ids"] = list(sampling.stop_token_ids)
    if sampling.stop_strings and not sampling.ignore_eos:
        params["stop"] = list(sampling.stop_strings)
    if seed is not None:
        params["sampling_seed"] = seed
    return params


def expand(prompts: list[list[int]], sampling: SamplingSettings, n: int,
           seeded: bool = True) -> tuple[list[list[int]], list[dict[str, Any]]]:
    """The call as SGLang requests: prompt ``i``'s ``n`` samples at ``i * n`` onwards, each with
    its seed where the engine reads seeds (``seeded``: SGLang's deterministic inference), a fresh
    one where the call gives none."""
    ids, params = [], []
    for i, prompt in enumerate(prompts):
        for j in range(n):
            seed = request_seed(sampling, i, j, n) if seeded else None
            ids.append(list(prompt))
            params.append(sampling_params(sampling, seed if seed is not None or not seeded else _unseeded()))
    return ids, params


def finish_reason(meta: dict[str, Any]) -> str:
    """``stop`` or ``length`` from SGLang's ``meta_info["finish_reason"]``; an aborted request
    is an error (the engine gave up on it: out of memory, a request too long for its context)."""
    reason = meta.get("finish_reason") or {}
    kind = reason.get("type") if isinstance(reason, dict) else reason
    if kind in ("stop", "length"):
        return str(kind)
    raise RuntimeError(f"SGLang aborted a request: {reason.get('message') if isinstance(reason, dict) else reason}")


def to_sample(prompt: list[int], output: dict[str, Any]) -> Sample:
    """A :class:`corerl.sdk.Sample` from one of ``Engine.generate``'s answers: ``output_ids`` and
    ``meta_info["output_token_logprobs"]`` (``(logprob, token id, text)`` per sampled token)."""
    meta = output["meta_info"]
    ids = tuple(int(token) for token in output["output_ids"])
    pairs = meta["output_token_logprobs"]
    if [int(token) for _, token, *_ in pairs] != list(ids):
        raise RuntimeError(f"SGLang's logprobs are of other tokens than its output ({len(pairs)} logprobs for "
                           f"{len(ids)} tokens)")
    return Sample(prompt_ids=tuple(prompt), completion_ids=ids, logprobs=tuple(float(lp) for lp, *_ in pairs),
                  finish_reason=finish_reason(meta))  # type: ignore[arg-type]


def group(prompts: list[list[int]], outputs: list[dict[str, Any]], n: int) -> list[list[Sample]]:
    """The answers to :func:`expand`'s requests, ``n`` per prompt, in prompt order."""
    if len(outputs) != len(prompts) * n:
        raise RuntimeError(f"SGLang answered {len(outputs)} of {len(prompts) * n} requests")
    return [[to_sample(prompt, outputs[i * n + j]) for j in range(n)] for i, prompt in enumerate(prompts)]


def buckets(weights: Iterable[tuple[str, Any]], limit_bytes: int) -> Iterator[list[tuple[str, Any]]]:
    """``weights`` in groups of about ``limit_bytes`` (a tensor bigger than that goes alone)."""
    bucket: list[tuple[str, Any]] = []
    size = 0
    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > limit_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket
