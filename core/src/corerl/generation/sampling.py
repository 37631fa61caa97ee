"""Token choice from next-token logits, for generation backends that run their own decode loop.

torch is imported by the backends that call these functions, not by this module's import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from corerl.generation.contract import FinishReason, SamplingSettings


def choose_tokens(logits: torch.Tensor, sampling: SamplingSettings, generator: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token of each row of ``logits`` ([rows, vocab]) and its logprob under the model.

    Temperature 0 is greedy. Otherwise the logits are divided by the temperature, cut to the
    ``top_k`` best and to the smallest set whose probability reaches ``top_p``, and one token is
    drawn per row from ``generator``. The logprob returned is of the untempered distribution,
    as :class:`~corerl.generation.contract.Sample` promises."""
    import torch

    logits = logits.float()
    logprobs = torch.log_softmax(logits, dim=-1)
    if sampling.temperature == 0:
        tokens = logits.argmax(dim=-1)
    else:
        scores = sampling_scores(logits, sampling)
        tokens = torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator).squeeze(-1)
    return tokens, logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def sampling_scores(logits: torch.Tensor, sampling: SamplingSettings) -> torch.Tensor:
    """``logits`` divided by the temperature, with the tokens outside ``top_k`` and ``top_p`` at -inf."""
    import torch

    scores = logits / sampling.temperature
    if sampling.top_k:
        kth = torch.topk(scores, min(sampling.top_k, scores.shape[-1]), dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        ordered, order = torch.sort(scores, dim=-1, descending=True)
        mass_before = torch.softmax(ordered, dim=-1).cumsum(dim=-1) - torch.softmax(ordered, dim=-1)
        ordered = ordered.masked_fill(mass_before >= sampling.top_p, float("-inf"))  # the best always stays
        scores = torch.full_like(scores, float("-inf")).scatter(-1, order, ordered)
    return scores


def row_seeds(sampling: SamplingSettings, n: int) -> list[int] | None:
    """The seed of each row of a call whose prompts are repeated ``n`` times each (prompt-major):
    sample ``j`` of prompt ``i`` draws from ``request_seeds[i] + j``; None without request seeds."""
    if sampling.request_seeds is None:
        return None
    return [seed + j for seed in sampling.request_seeds for j in range(n)]


def row_generators(seeds: list[int], device: Any = None) -> list[torch.Generator]:
    """One seeded generator per row, on ``device`` (the CPU unless given)."""
    import torch

    return [torch.Generator(device=device or "cpu").manual_seed(seed) for seed in seeds]


def choose_tokens_per_row(logits: torch.Tensor, sampling: SamplingSettings,
                          generators: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`choose_tokens` with one generator per row of ``logits``: each row's token depends
    on its own stream only, whichever rows share the batch. The draw is Gumbel-max (the argmax
    of the scores plus Gumbel noise, which samples the same distribution): only the noise is
    made row by row, each row's from its own generator, and the rest runs on the whole batch."""
    import torch

    logits = logits.float()
    logprobs = torch.log_softmax(logits, dim=-1)
    if sampling.temperature == 0:
        tokens = logits.argmax(dim=-1)
    else:
        uniform = torch.empty_like(logits)
        for row, generator in enumerate(generators):
            uniform[row].uniform_(generator=generator)
        gumbel = -torch.log(-torch.log(uniform.clamp_(min=torch.finfo(uniform.dtype).tiny)))
        tokens = (sampling_scores(logits, sampling) + gumbel).argmax(dim=-1)
    return tokens, logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def cut_at_stop_ids(ids: list[int], stop_ids: list[int] | tuple[int, ...]) -> tuple[list[int], FinishReason]:
    """``ids`` up to and including the first stop id ("stop"), or all of them ("length")."""
    for index, token in enumerate(ids):
        if token in stop_ids:
            return ids[: index + 1], "stop"
    return ids, "length"


def cut_at_stop_strings(ids: list[int], stops: tuple[str, ...], tokenizer: Any,
                        reason: FinishReason) -> tuple[list[int], FinishReason]:
    """``ids`` up to the first token whose decoded prefix contains one of ``stops``."""
    if not stops:
        return ids, reason
    for end in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:end], skip_special_tokens=False)
        if any(stop in text for stop in stops):
            return ids[:end], "stop"
    return ids, reason
