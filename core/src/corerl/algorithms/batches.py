"""Rows for the training backends out of samples and pairs, and the seeds of generation steps
(:func:`step_seed`, from :mod:`corerl.generation.seeds`, which the asynchronous producer shares):
the pieces GRPO, PPO, SFT and DPO share (no algorithm imports another; each imports these).

Plugins call :func:`samples_to_batch`, :func:`minibatches` and :func:`step_seed` too (through
:mod:`corerl.sdk`), so each checks its arguments first: a plugin's wrong argument is a
:class:`~corerl.errors.PluginError` naming the plugin and the function, not corerl's bug.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import torch

from corerl.environments.rollout import StepWiseSample
from corerl.errors import argument_error
from corerl.generation.contract import Sample, images_of
from corerl.generation.routes import FIELD as ROUTES
from corerl.generation.routes import routes_field
from corerl.generation.seeds import step_seed as step_seed  # re-exported (it lives below both)
from corerl.training.batching import right_pad
from corerl.training.image_rows import image_fields

RewardFn = Callable[[Sample, Any], float]


def samples_to_batch(groups: Sequence[Sequence[Sample]], advantages: torch.Tensor) -> dict[str, torch.Tensor]:
    """Right-padded training rows (prompt + completion), a loss mask on the model's completion
    tokens (a multi-turn episode's environment tokens stay out: ``Sample.completion_mask``), each
    row's advantage on every token, and the generation backend's logprobs for comparison; the
    samples' images, where they have any (:mod:`corerl.training.image_rows`), and the experts the
    generation engine chose, where it reported them (``routed_experts``, router replay r3:
    :mod:`corerl.generation.routes`).
    ``advantages``: a tensor with one value per sample, in group order (any shape of that size)."""
    samples = _check_samples(groups)
    _check_advantages(advantages, len(samples))
    input_ids, attention = right_pad([list(s.prompt_ids) + list(s.completion_ids) for s in samples])
    rows, width = input_ids.shape
    loss_mask = torch.zeros((rows, width), dtype=torch.long)
    gen_logprobs = torch.zeros((rows, width), dtype=torch.float32)
    for row, s in enumerate(samples):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        loss_mask[row, p : p + c] = 1 if s.completion_mask is None else torch.tensor(s.completion_mask)
        gen_logprobs[row, p : p + c] = torch.tensor(s.logprobs, dtype=torch.float32)
    adv = advantages.reshape(rows, 1).to(torch.float32).expand(rows, width).contiguous()
    batch = {"input_ids": input_ids, "attention_mask": attention, "loss_mask": loss_mask,
             "advantages": adv, "gen_logprobs": gen_logprobs, **image_fields([s.images for s in samples])}
    routes = routes_field(samples, width)
    if routes is not None:
        batch[ROUTES] = routes
    return batch


def step_rows(groups: Sequence[Sequence[Sample]], advantages: torch.Tensor,
              merge: bool = False) -> tuple[list[list[Sample]], torch.Tensor, list[int]]:
    """Step-wise trajectories (``algorithm.step_wise_trajectories``): each episode (a
    :class:`~corerl.environments.rollout.StepWiseSample`) replaced by its turns' rows, every row
    taking its episode's advantage (``advantages``: one per sample, in group order); a sample
    without steps stays one row. Returns the rows (grouped as the samples were), one advantage per
    row and each sample's number of rows. An episode whose own completion mask is all zero
    (overlong filtering) leaves all its rows out of the loss. ``merge`` (``algorithm.step_wise_merge``):
    an episode's consecutive rows are merged where the later row's prompt begins with the earlier
    row's prompt and response (:func:`merged_steps`)."""
    values = advantages.reshape(-1)
    rows: list[list[Sample]] = []
    counts: list[int] = []
    expanded: list[torch.Tensor] = []
    index = 0
    for group in groups:
        out: list[Sample] = []
        for sample in group:
            stepped = isinstance(sample, StepWiseSample) and bool(sample.steps)
            steps = (merged_steps(sample.steps) if merge else list(sample.steps)) if stepped else [sample]
            if stepped and sample.completion_mask is not None and not any(sample.completion_mask):
                steps = [attrs.evolve(s, completion_mask=(0,) * len(s.completion_ids)) for s in steps]
            out.extend(steps)
            counts.append(len(steps))
            expanded.append(values[index].expand(len(steps)))
            index += 1
        rows.append(out)
    return rows, torch.cat(expanded) if expanded else values[:0], counts


def merged_steps(steps: Sequence[Sample]) -> list[Sample]:
    """An episode's step-wise rows, each merged into the row before it where its prompt begins
    with that row's prompt and response: the merged row's response runs on through the tokens
    between the two (out of the loss, logprob 0) and the later response. Where the chat template
    renders the conversation as an extension of its start, one row; else a row per break."""
    out: list[Sample] = []
    for row in steps:
        last = out[-1] if out else None
        sequence = (*last.prompt_ids, *last.completion_ids) if last is not None else ()
        if last is None or tuple(row.prompt_ids[: len(sequence)]) != sequence:
            out.append(row)
            continue
        gap = tuple(row.prompt_ids[len(sequence):])
        mask = (*_mask_of(last), *(0,) * len(gap), *_mask_of(row))
        versions = None
        if last.versions is not None or row.versions is not None:
            before = last.versions or (0,) * len(last.completion_ids)
            versions = (*before, *(before[-1:] or (0,)) * len(gap), *(row.versions or (0,) * len(row.completion_ids)))
        out[-1] = attrs.evolve(last, completion_ids=(*last.completion_ids, *gap, *row.completion_ids),
                               logprobs=(*last.logprobs, *(0.0,) * len(gap), *row.logprobs), completion_mask=mask,
                               finish_reason=row.finish_reason, versions=versions, images=row.images,
                               routed_experts=row.routed_experts)  # the later row ran the merged tokens
    return out


def _mask_of(sample: Sample) -> tuple[int, ...]:
    return sample.completion_mask if sample.completion_mask is not None else (1,) * len(sample.completion_ids)


def minibatches(batch: dict[str, torch.Tensor], rows: int | None,
                weights: Callable[[torch.Tensor], torch.Tensor | None] | None = None) -> list[dict[str, torch.Tensor]]:
    """``batch`` cut into consecutive mini-batches of ``rows`` rows (one optimizer step each);
    ``None``: the whole batch, one optimizer step. ``rows`` must divide the batch's rows. With
    ``weights`` (a loss's ``aggregation_weights``) each mini-batch gets the ``aggregation_weights``
    of its own loss mask, where that gives any."""
    total = _check_minibatches(batch, rows, weights)
    if rows is None or rows >= total:
        parts = [batch]
    else:
        parts = [{key: value[start : start + rows] for key, value in batch.items()} for start in range(0, total, rows)]
    return _weighted(parts, weights)


def step_minibatches(batch: dict[str, torch.Tensor], counts: Sequence[int], episodes: int | None,
                     weights: Callable[[torch.Tensor], torch.Tensor | None] | None = None) -> list[dict[str, torch.Tensor]]:
    """:func:`minibatches` for step-wise rows: each optimizer step takes the rows of ``episodes``
    consecutive episodes (``counts``: each episode's rows, as :func:`step_rows` gives them), so
    the number of optimizer steps does not depend on how many turns the episodes played; ``None``:
    the whole batch. ``episodes`` must divide the episodes."""
    total = _check_minibatches(batch, None, weights)
    if sum(counts) != total:
        raise argument_error("step_minibatches", f"counts add up to {sum(counts)} rows, and the batch has {total}",
                             internal=ValueError, hint="pass the counts step_rows returned with the rows")
    if episodes is None or episodes >= len(counts):
        return _weighted([batch], weights)
    if len(counts) % episodes:
        raise argument_error("step_minibatches", f"{episodes} episodes per optimizer step do not divide the step's "
                                                 f"{len(counts)} episodes", internal=ValueError,
                             hint="make the optimizer batch a divisor of the step's episodes")
    bounds = [0]
    for start in range(0, len(counts), episodes):
        bounds.append(bounds[-1] + sum(counts[start : start + episodes]))
    parts = [{key: value[a:b] for key, value in batch.items()} for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return _weighted(parts, weights)


def _weighted(parts: list[dict[str, torch.Tensor]],
              weights: Callable[[torch.Tensor], torch.Tensor | None] | None) -> list[dict[str, torch.Tensor]]:
    """Each part with the ``aggregation_weights`` of its own loss mask, where ``weights`` gives any."""
    if weights is None:
        return parts
    weighted = [(part, weights(part["loss_mask"])) for part in parts]
    return [part if w is None else {**part, "aggregation_weights": w} for part, w in weighted]


def pairs_to_batch(pairs: Sequence[Sequence[Sequence[int]]]) -> dict[str, torch.Tensor]:
    """Right-padded rows prompt + response, the loss mask on the response only (and, where a
    demonstration has a third element, a 0/1 mask over its response, only where that is 1: a
    multi-turn demonstration's environment tokens are not the model's to learn). A prompt that
    carries images (an :class:`~corerl.generation.contract.ImagePrompt`) brings them along."""
    input_ids, attention = right_pad([list(pair[0]) + list(pair[1]) for pair in pairs])
    loss_mask = torch.zeros_like(input_ids)
    for row, (prompt, response, *mask) in enumerate(pairs):
        loss_mask[row, len(prompt) : len(prompt) + len(response)] = torch.tensor(mask[0]) if mask else 1
    return {"input_ids": input_ids, "attention_mask": attention, "loss_mask": loss_mask,
            **image_fields([images_of(pair[0]) for pair in pairs])}


def _check_samples(groups: Any) -> list[Sample]:
    """The samples of ``groups`` (a sequence of groups of :class:`Sample`), each one's logprobs
    (and mask) as long as its completion; anything else refused by :func:`argument_error`."""
    if isinstance(groups, (str, bytes, Mapping)) or not isinstance(groups, Sequence):
        raise argument_error("samples_to_batch", f"groups must be a list of groups (lists) of Sample, got "
                                                 f"{type(groups).__name__}", hint="pass what generate() returned")
    samples: list[Sample] = []
    for index, group in enumerate(groups):
        if isinstance(group, Sample) or not isinstance(group, Sequence):
            raise argument_error("samples_to_batch", f"groups[{index}] must be a list of Sample, got "
                                                     f"{type(group).__name__}",
                                 hint="wrap single samples in a group: [[sample, ...], ...]")
        samples.extend(group)
    if not samples:
        raise argument_error("samples_to_batch", "groups holds no samples", internal=ValueError,
                             hint="skip the training step when nothing was sampled")
    for index, sample in enumerate(samples):
        if not isinstance(sample, Sample):
            raise argument_error("samples_to_batch", f"sample {index} (in group order) is a {type(sample).__name__}, "
                                                     "not a corerl Sample", hint="pass what generate() returned")
        length = len(sample.completion_ids)
        mask = sample.completion_mask
        if len(sample.logprobs) != length or (mask is not None and len(mask) != length):
            what = "logprobs" if len(sample.logprobs) != length else "completion_mask"
            given = len(sample.logprobs) if what == "logprobs" else len(mask or ())
            raise argument_error("samples_to_batch", f"sample {index} (in group order) has {given} {what} for "
                                                     f"{length} completion tokens", internal=ValueError,
                                 hint=f"give one {what} value per completion token")
    return samples


def _check_advantages(advantages: Any, count: int) -> None:
    """``advantages`` is a real tensor with one value per sample (``count``)."""
    hint = "build it with torch.tensor(values, dtype=torch.float32), one value per sample in group order"
    if not isinstance(advantages, torch.Tensor):
        raise argument_error("samples_to_batch", f"advantages must be a torch.Tensor with one value per sample "
                                                 f"({count}), got {type(advantages).__name__}", hint=hint)
    if advantages.is_complex() or advantages.dtype == torch.bool:
        raise argument_error("samples_to_batch", f"advantages must hold real numbers, got dtype {advantages.dtype}",
                             hint=hint)
    if advantages.numel() != count:
        raise argument_error("samples_to_batch", f"advantages holds {advantages.numel()} values (shape "
                                                 f"{tuple(advantages.shape)}) for {count} samples",
                             internal=ValueError, hint=hint)


def _check_minibatches(batch: Any, rows: Any, weights: Any) -> int:
    """The number of rows of ``batch`` (a dict of tensors with ``input_ids``), once ``rows`` (None
    or a positive integer dividing them) and ``weights`` (None or a callable) are checked."""
    if not isinstance(batch, Mapping) or not isinstance(batch.get("input_ids"), torch.Tensor):
        raise argument_error("minibatches", f"batch must be a dict of tensors with 'input_ids', got "
                                            f"{type(batch).__name__}", hint="pass what samples_to_batch returned")
    total = int(batch["input_ids"].shape[0])
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, numbers.Integral) or rows < 1):
        raise argument_error("minibatches", f"rows must be None or a positive integer, got {rows!r}",
                             hint="None trains the whole batch in one optimizer step")
    if rows is not None and rows < total and total % rows:
        raise argument_error("minibatches", f"{rows} rows per optimizer step do not divide the step's {total} rows",
                             internal=ValueError, hint="make the optimizer batch a divisor of the step's rows")
    if weights is not None and not callable(weights):
        raise argument_error("minibatches", f"weights must be None or a callable (a loss's aggregation_weights), "
                                            f"got {type(weights).__name__}")
    return total
