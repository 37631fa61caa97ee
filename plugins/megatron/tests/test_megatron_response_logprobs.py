"""Logprobs through megatron's vocabulary-parallel head at the positions that need them only
(:mod:`corerl_megatron.training.response_head`): the same logprobs, top-k and gradients there as
GPTModel's full logits give, 0 elsewhere, and no ``[rows, tokens, vocabulary]`` tensor on the way,
at SmolLM2's vocabulary (49,152 words, tied embeddings as SmolLM2 ties them). One megatron rank in
this process; tensor parallelism over two gloo ranks: TestTensorParallel2 of
test_megatron_conformance.py (the suite's logprobs and gradients against world size 1)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from corerl.testing.conformance import conformance_batch, conformance_loss
from tests.megatron_recipe import megatron_config, megatron_rank

VOCAB = 49_152
ROWS, LENGTH = 4, 48
#: the largest tensor the model itself needs: the (tied) embedding's gradient, 32 wide
WEIGHT_BYTES = VOCAB * 32 * 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from corerl.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny"), family="llama", hidden_size=32, num_layers=2,
                                num_heads=4, num_kv_heads=2, vocab_size=VOCAB, tie_word_embeddings=True))


@contextmanager
def _rank(model_dir: str, folder: Path) -> Iterator[Any]:
    """A megatron rank in this process (world size 1) holding ``model_dir``, training with SGD."""
    config = megatron_config(model_dir, folder, ["policy.megatron_cfg.optimizer.optimizer=sgd",
                                                 "policy.megatron_cfg.optimizer.lr=0.1"])
    with megatron_rank(config, model_dir, folder / "conv") as rank:
        yield rank


class _Largest(TorchDispatchMode):
    """The largest tensor any operation allocates while active (bytes; views and in-place results are
    not allocations), backward passes included."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        returns = func._schema.returns
        for i, t in enumerate(out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and (i >= len(returns) or returns[i].alias_info is None):
                self.largest = max(self.largest, t.numel() * t.element_size())
        return out


def _both(rank: Any, run: Any) -> tuple[tuple[Any, int], tuple[Any, int]]:
    """``run(rank)`` and the largest tensor it made, through the head's chunks and through full logits."""
    out = []
    for full in (False, True):
        rank.full_logits = full
        with _Largest() as largest:
            answer = run(rank)
        out.append((answer, largest.largest))
    rank.full_logits = False
    return out[0], out[1]


def _step(rank: Any, mbs: list[dict[str, torch.Tensor]], normaliser: float) -> tuple[float, dict[str, torch.Tensor]]:
    """One training step's loss and gradients; the weights are put back after it."""
    module = rank.model.module
    weights = {n: p.detach().clone() for n, p in module.named_parameters()}
    result = rank.train_step([dict(mb) for mb in mbs], conformance_loss, normaliser)
    grads = {n: p.main_grad.detach().clone() for n, p in module.named_parameters()}
    with torch.no_grad():
        for name, param in module.named_parameters():
            param.copy_(weights[name])
    return result["loss"], grads


def test_the_head_s_chunks_give_the_full_logits_answers_where_needed_and_0_elsewhere(model_dir: str,
                                                                                    tmp_path: Path) -> None:
    from corerl.sdk import needed_positions

    batch = conformance_batch(rows=ROWS, length=LENGTH, vocab=VOCAB)
    mbs = [{k: v[i:i + 2] for k, v in batch.items()} for i in (0, 2)]
    needed = needed_positions(batch)
    assert 0 < int(needed.sum()) < int(batch["attention_mask"].sum())  # the prompt's positions are left out
    chunk = 8 * VOCAB  # 8 positions at a time: several chunks per micro-batch
    with _rank(model_dir, tmp_path) as rank:
        assert rank.model.module.share_embeddings_and_output_weights  # the head's weight is the embedding's
        rank.head_chunk_elements = chunk
        (ours, small), (full, large) = _both(rank, lambda r: torch.cat(r.logprobs([dict(mb) for mb in mbs])))
        assert large >= ROWS // 2 * LENGTH * VOCAB * 4  # the full path's logits of a micro-batch, in float32
        assert small <= 2 * chunk * 4 < large  # ours: a chunk's
        assert float(full[needed].abs().min()) > 0 and float((ours[needed] - full[needed]).abs().max()) < 1e-5
        assert torch.equal(ours != 0, needed) and torch.equal(full != 0, needed)
        # a distillation teacher's top-k: the same tokens and logprobs
        (top, _), (top_full, _) = _both(rank, lambda r: torch.cat(r.topk_logprobs([dict(mb) for mb in mbs], 4)))
        assert float((top - top_full).abs().max()) < 1e-5 and float(top[needed][:, 1:5].abs().min()) > 0
        assert float(top[~needed].abs().max()) == 0
        # training: the same loss and gradients (the tied embedding's included), a chunk at a time in
        # the backward pass too
        normaliser = float(batch["loss_mask"][:, 1:].sum())
        ((loss, grads), small), ((loss_full, grads_full), large) = _both(rank, lambda r: _step(r, mbs, normaliser))
        assert abs(loss - loss_full) < 1e-6 and abs(loss) > 1e-3
        assert max(float((grads[n] - grads_full[n]).abs().max()) for n in grads) < 1e-6
        assert all(float(g.abs().max()) > 0 for g in grads.values())
        assert small <= max(2 * chunk * 4, WEIGHT_BYTES) < large


def test_candidate_logprobs_and_their_gradients_match_the_full_logits(model_dir: str, tmp_path: Path) -> None:
    """A student's logprobs of a teacher's candidates (distillation): differentiable, from the chunks."""
    batch = conformance_batch(rows=2, length=LENGTH, vocab=VOCAB, seed=3)
    batch["candidate_ids"] = torch.randint(0, VOCAB, (2, LENGTH, 3), generator=torch.Generator().manual_seed(1))

    seen: list[torch.Tensor] = []

    def loss(logprobs: torch.Tensor, mb: dict[str, torch.Tensor], normaliser: float) -> tuple[torch.Tensor, dict]:
        seen.append(mb["candidate_logprobs"].detach().clone())
        pulled = (mb["candidate_logprobs"].exp() * mb["loss_mask"].unsqueeze(-1)).sum()  # a stand-in for a KL
        return conformance_loss(logprobs, mb, normaliser)[0] + pulled / normaliser, {}

    def step(rank: Any) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        module = rank.model.module
        weights = {n: p.detach().clone() for n, p in module.named_parameters()}
        rank.train_step([dict(batch)], loss, 10.0)
        grads = {n: p.main_grad.detach().clone() for n, p in module.named_parameters()}
        with torch.no_grad():
            for name, param in module.named_parameters():
                param.copy_(weights[name])
        return grads, seen.pop()

    needed = batch["loss_mask"].bool() & (torch.arange(LENGTH) > 0)
    with _rank(model_dir, tmp_path) as rank:
        for chunk in (5 * VOCAB, None):  # chunks recomputed in the backward pass, and one chunk kept
            rank.head_chunk_elements = chunk
            ((grads, ours), _), ((grads_full, full), _) = _both(rank, step)
            assert float(full[needed].abs().min()) > 0 and float((ours - full)[needed].abs().max()) < 1e-5
            assert float(ours[~needed].abs().max()) == 0
            assert max(float((grads[n] - grads_full[n]).abs().max()) for n in grads) < 1e-6
