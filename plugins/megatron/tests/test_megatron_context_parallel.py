"""Context parallelism on megatron (``policy.megatron_cfg.context_parallel_size``, NeMo RL's key of that
name): each row split over the context-parallel ranks in the load-balanced layout, Transformer Engine's
attention exchanging keys and values between them, the output gathered back into whole rows.

On CPU, two gloo ranks check the data side (:class:`corerl_megatron.training.context_parallel.SequenceSplit`)
against one process: the ranks' chunks gathered are the rows as they were, and a loss every rank
computes on the gathered output gives, once the gradients are averaged over the ranks as megatron's DDP
averages them, the one-process gradient. On two GPUs with Transformer Engine, the backend's logprobs
and a training step's loss at context parallelism 2 match those at 1 (bfloat16: Transformer Engine's
context-parallel attention runs in its flash or fused kernels). Where the machine cannot run it the
refusal is one line at the key (tests/test_megatron_options.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from corerl.testing.conformance import TrainingBackendConformance


def _rank(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from corerl_megatron.training.context_parallel import SequenceSplit

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        split = SequenceSplit(None, rank, 2)
        torch.manual_seed(0)
        ids = torch.randint(0, 50, (3, 11))  # 11 tokens: padded to 12, chunks of 3
        weight = torch.randn(50, 4, requires_grad=True)
        mine = weight[split.local(ids)]  # a per-token "model": [rows, 6, 4]
        whole = split.gather(mine, 11)
        loss = (whole * torch.arange(4.0)).sum()
        loss.backward()
        grad = weight.grad.clone()
        dist.all_reduce(grad)
        torch.save({"whole": whole.detach(), "ids": ids, "grad": grad / 2, "local_width": mine.shape[1]},
                   f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_the_ranks_chunks_gathered_are_the_rows_and_the_averaged_gradient_is_one_processes(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    from corerl.sdk import free_port

    mp.start_processes(_rank, args=(free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (3, 11))
    weight = torch.randn(50, 4, requires_grad=True)
    whole = weight[ids]
    (whole * torch.arange(4.0)).sum().backward()
    for result in results:
        assert torch.equal(result["ids"], ids) and result["local_width"] == 6  # each rank: 2 chunks of 3
        assert torch.equal(result["whole"], whole.detach())  # every rank holds the rows whole, in order
        assert torch.allclose(result["grad"], weight.grad)  # cp x each rank's share, then DDP's mean


MEGATRON = ["policy.megatron_cfg.enabled=true", "cluster.gpus_per_node=2", "policy.precision=bfloat16"]


class _Layout(TrainingBackendConformance):
    backend_id = "megatron"


def _two_gpus_with_transformer_engine() -> bool:
    import importlib.util

    return torch.cuda.device_count() >= 2 and importlib.util.find_spec("transformer_engine") is not None


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not _two_gpus_with_transformer_engine(),
                    reason="context parallelism needs 2 GPUs and Transformer Engine's attention")
def test_context_parallel_2_gives_the_logprobs_and_loss_of_one_rank(tmp_path: Path) -> None:
    from corerl.models.tiny import build_tiny_model
    from corerl.testing.conformance.inputs import conformance_batch, conformance_loss
    from corerl.testing.reference import at_loss_positions, max_diff

    model_dir = str(build_tiny_model(tmp_path / "m", family="llama", hidden_size=256, num_layers=2, num_heads=4,
                                     num_kv_heads=2, vocab_size=256))
    batch = conformance_batch(rows=8, length=30, vocab=256)  # 30 tokens: padded to whole chunks
    found = {}
    for cp in (1, 2):
        # at 1, the two GPUs are two data-parallel ranks; at 2, one row's two halves
        _, engine = _Layout._build(model_dir, tmp_path / str(cp), [
            *MEGATRON, f"policy.megatron_cfg.context_parallel_size={cp}"])
        try:
            engine.load_hf(model_dir)
            logprobs = at_loss_positions(engine.logprobs(batch), batch)
            step = engine.train_step(batch, conformance_loss)
            found[cp] = (logprobs, step.loss, at_loss_positions(engine.logprobs(batch), batch))
        finally:
            engine.shutdown()
    (one, loss_one, after_one), (two, loss_two, after_two) = found[1], found[2]
    print(f"\ncontext parallel 2 vs 1 (bfloat16): logprobs max |difference| {max_diff(two, one):.3g}, "
          f"loss {loss_two:.5f} vs {loss_one:.5f}, after a step {max_diff(after_two, after_one):.3g}")
    assert max_diff(two, one) < 0.05 and loss_two == pytest.approx(loss_one, rel=0.02)
    assert max_diff(after_two, after_one) < 0.05 and max_diff(after_one, one) > 0  # the step trained both alike
