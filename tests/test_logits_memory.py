"""Memory that does not grow with the vocabulary times the batch: chunked logprobs, micro-batches
capped by policy.max_logits_mb, and an out-of-memory failure said in one line."""

from __future__ import annotations

import logging

import pytest
import torch

from corerl.run.out_of_memory import out_of_memory_line
from corerl.training import logprobs as logprobs_module
from corerl.training.logprobs import token_logprobs


def test_chunked_logprobs_and_their_gradient_equal_a_full_log_softmax(monkeypatch):
    monkeypatch.setattr(logprobs_module, "LOGSUMEXP_ELEMENTS", 3 * 50)  # a few positions a chunk
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 9, 50, generator=gen, requires_grad=True)
    ids = torch.randint(0, 50, (3, 9), generator=gen)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 6:] = 0
    ours = token_logprobs(logits, ids, mask)
    full = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    theirs = torch.cat([torch.zeros(3, 1), full], dim=1) * mask
    assert torch.allclose(ours, theirs, atol=1e-6)
    (grad_ours,) = torch.autograd.grad(ours.sum(), logits)
    (grad_theirs,) = torch.autograd.grad(theirs.sum(), logits)
    assert torch.allclose(grad_ours, grad_theirs, atol=1e-6)


def test_micro_batches_are_capped_by_the_logits_budget_with_a_warning(tmp_path, caplog):
    from corerl.testing import host_with, select_for, write_recipe
    from corerl.training.microbatching import MicroBatcher

    recipe = write_recipe(tmp_path / "r.yaml", {"policy": {
        "model_name": "builtin:tiny-qwen2", "max_seq_length": 64, "train_micro_batch_size": 128,
        "max_logits_mb": 1, "generation": {"backend": "hf"}}})
    config, _ = select_for(host_with(None, "installed"), recipe, [])
    with caplog.at_level(logging.WARNING, logger="corerl"):
        batcher = MicroBatcher.from_config(config)
    # 1 MiB / (2 x 4 bytes x vocabulary 128) = 1,024 tokens = 16 rows of 64
    assert batcher.train_rows == batcher.logprob_rows == 16
    assert "policy.train_micro_batch_size: 128 would hold more than policy.max_logits_mb=1 MiB" in caplog.text
    roomy = write_recipe(tmp_path / "roomy.yaml", {"policy": {
        "model_name": "builtin:tiny-qwen2", "max_seq_length": 64, "train_micro_batch_size": 128,
        "generation": {"backend": "hf"}}})
    config, _ = select_for(host_with(None, "installed"), roomy, [])
    assert MicroBatcher.from_config(config).train_rows == 128  # within the default 1,024 MiB


def train_step() -> None:  # named as the training phase's calls are
    torch.empty(1 << 50, dtype=torch.uint8)  # a real allocation failure of torch's CPU allocator


def test_an_out_of_memory_failure_is_one_line_with_the_phase_the_size_and_the_keys():
    with pytest.raises(RuntimeError) as raised:
        train_step()
    line = out_of_memory_line(raised.value)
    assert line is not None and "\n" not in line
    assert line.startswith("out of memory while training: it asked for 1048576.0 GiB more, ")
    assert "free now; lower policy.train_micro_batch_size, policy.max_logits_mb" in line
    try:
        raise RuntimeError("the engine failed") from MemoryError()
    except RuntimeError as exc:
        assert out_of_memory_line(exc).startswith("out of memory while running: ")
    assert out_of_memory_line(ValueError("not memory")) is None
