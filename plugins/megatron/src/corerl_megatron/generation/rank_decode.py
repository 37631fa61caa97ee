"""Generation on a megatron training rank: the decode loop of :mod:`corerl_megatron.generation.decode`
run over the rank's model stage, with megatron's pipeline schedule for each forward pass."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


def generate(worker: Any, part: Any, sampling: Any, stop_ids: list[int]) -> list[Any] | None:
    """Completions of the worker's data-parallel group's rows (``part``: the rows, or the rows
    and one seed each where the call has request seeds); returned by the rank that reports,
    None elsewhere."""
    from megatron.core.inference import contexts  # noqa: F401  (loaded before the redirect below)

    from corerl_megatron.generation.decode import decode_rows
    from corerl_megatron.training import cpu_redirect

    cpu_redirect.install()  # the KV cache is allocated on torch.cuda.current_device()
    worker.model.eval()
    budget = worker.config.section("policy.generation.mcore_generation_config").buffer_size_gb * 2**30
    rows, seeds = part if isinstance(part, tuple) else (part, None)
    experts = worker.ps.get_expert_model_parallel_group() if worker.ep > 1 else None
    own = slice(0, len(rows))
    if experts is not None:  # every rank of an expert group takes part in each forward: they decode their rows together
        rows, seeds, own = _group_rows(worker.ps.get_data_parallel_rank(), rows, seeds, experts)
    with torch.no_grad(), _without_sequence_parallel(worker.model.module):
        out = decode_rows(rows, sampling, stop_ids, lambda ids, positions, cache: _last_logits(worker, ids, positions, cache),
                          lambda tokens, logprobs: _share_tokens(worker.ps, tokens, logprobs, experts),
                          _kv_bytes_per_token(worker), budget, worker.device, seeds) if rows else []
    return out[own] if worker.coordinates()["reports"] else None


def _group_rows(dp_rank: int, rows: list[list[int]], seeds: list[int] | None,
                group: Any) -> tuple[list[list[int]], Any, slice]:
    """The rows (and seeds) of every data-parallel rank in the expert-parallel ``group``, in
    data-parallel order, and the slice of them that are this rank's (ranks of one data-parallel
    replica, e.g. its tensor-parallel ranks, hold the same rows: each replica's count once)."""
    import torch.distributed as dist

    parts: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, (dp_rank, rows, seeds), group=group)
    replicas = {dp: (r, s) for dp, r, s in sorted(parts, key=lambda part: part[0])}
    start = sum(len(r) for dp, (r, _) in replicas.items() if dp < dp_rank)
    every = [row for r, _ in replicas.values() for row in r]
    seeded = [seed for r, s in replicas.values() for seed in (s if s is not None else [None] * len(r))]
    return every, (seeded if seeds is not None else None), slice(start, start + len(rows))


@contextlib.contextmanager
def _without_sequence_parallel(model: Any) -> Iterator[None]:
    """A model trained with sequence parallelism decodes without it (a decode step is one token
    wide, not a sequence to split over the tensor-parallel ranks): megatron-core's own switch,
    ``set_model_to_sequence_parallel``, turns every layer's flag off for the decoding and back on
    for training, as its inference controller does."""
    if not model.config.sequence_parallel:
        yield
        return
    from megatron.core.transformer.utils import set_model_to_sequence_parallel

    set_model_to_sequence_parallel(model, False)
    try:
        yield
    finally:
        set_model_to_sequence_parallel(model, True)


def _kv_bytes_per_token(worker: Any) -> int:
    """KV-cache bytes of one cached token of one row on a rank (the same on every rank)."""
    from corerl_megatron.stages import stage_layers

    s = worker.settings
    layers = max(stage_layers(worker.shape.num_layers, s.pipeline_model_parallel_size,
                              s.num_layers_in_first_pipeline_stage, s.num_layers_in_last_pipeline_stage))
    kv_heads = max(1, worker.shape.num_kv_heads // worker.tp)
    size = torch.empty((), dtype=worker.mconfig.params_dtype).element_size()
    return 2 * layers * kv_heads * worker.shape.head_dim * size


def _last_logits(worker: Any, ids: torch.Tensor, positions: torch.Tensor, cache: Any) -> torch.Tensor | None:
    from megatron.core.pipeline_parallel import get_forward_backward_func

    def forward_step(data: Any, model: Any) -> tuple[torch.Tensor, Any]:
        next(data)
        logits = model(ids, positions, attention_mask=None, inference_context=cache, runtime_gather_output=True)
        return logits, lambda out: (out.new_zeros(()), {"logits": out[:, -1].float()})

    worker.mconfig.finalize_model_grads_func = None
    out = get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=iter([None]), model=[worker.model], num_microbatches=1,
        seq_length=int(ids.shape[1]), micro_batch_size=int(ids.shape[0]), forward_only=True,
    )
    return out[0]["logits"] if worker.ps.is_pipeline_last_stage() else None


def _share_tokens(ps: Any, tokens: torch.Tensor, logprobs: torch.Tensor | None,
                  experts: Any = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The chosen tokens every rank continues with: within an expert-parallel group (``experts``),
    which decodes the same rows on every rank, the group's first rank's tokens and their logprobs
    (each rank samples from its own generator); then the last stage's tokens, sent to every stage
    of the pipeline."""
    import torch.distributed as dist

    if experts is not None and ps.is_pipeline_last_stage():  # an expert group's ranks are of one stage
        first = dist.get_global_rank(experts, 0)
        dist.broadcast(tokens, src=first, group=experts)
        if logprobs is not None:  # the last stage's ranks hold them, all of one expert group alike
            shared = logprobs.to(tokens.device).float().contiguous()
            dist.broadcast(shared, src=first, group=experts)
            logprobs = shared.cpu()  # read a row at a time: on the host
    if ps.get_pipeline_model_parallel_world_size() > 1:
        dist.broadcast(tokens, src=ps.get_pipeline_model_parallel_last_rank(),
                       group=ps.get_pipeline_model_parallel_group())
    return tokens, logprobs
