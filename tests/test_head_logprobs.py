"""The LM head at the loss's positions only, in chunks (corerl.training.head_logprobs): the same
logprobs and gradients as the full logits' log-softmax, 0 elsewhere, and no call of the head
over more than one chunk of positions."""

from __future__ import annotations

import pytest
import torch

from corerl.training import head_logprobs
from corerl.training.logprobs import (
    TOPK_REQUEST,
    candidate_logprobs,
    model_logprobs,
    token_logprobs,
    topk_logprobs,
)


@pytest.fixture(scope="module")
def model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=101, tie_word_embeddings=True)
    return Qwen2ForCausalLM(config)


def _batch() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 101, (3, 12), generator=gen)
    attention = torch.ones_like(ids)
    attention[1, 9:] = 0
    loss_mask = attention.clone()
    loss_mask[:, :5] = 0
    loss_mask[2, 7] = 0  # an observation inside the response
    return {"input_ids": ids, "attention_mask": attention, "loss_mask": loss_mask}


def _grads(model, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("recompute", [False, True], ids=["kept", "recomputed"])
def test_logprobs_and_gradients_equal_the_full_logits_at_the_loss_positions_only(model, monkeypatch, recompute):
    monkeypatch.setattr(head_logprobs, "CHUNK_ELEMENTS", 4 * 101)  # 4 positions a chunk: several chunks
    if recompute:
        monkeypatch.setattr(head_logprobs, "KEEP_LOGITS_ELEMENTS", 1)
    seen: list[int] = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: seen.append(o.shape[-2] if o.dim() == 3 else o.shape[0]))
    batch = _batch()
    weights = torch.randn(batch["input_ids"].shape, generator=torch.Generator().manual_seed(2))
    try:
        ours = model_logprobs(model, dict(batch))
        ours_grads = _grads(model, (ours * weights).sum())
    finally:
        hook.remove()
    mask = batch["loss_mask"].clone()
    mask[:, 0] = 0
    full = token_logprobs(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                          batch["input_ids"], batch["attention_mask"]) * mask
    full_grads = _grads(model, (full * weights).sum())
    assert torch.allclose(ours, full, atol=1e-5)
    assert (ours[mask == 0] == 0).all() and (ours[mask == 1] != 0).all()
    assert ours_grads.keys() == full_grads.keys()
    assert all(torch.allclose(ours_grads[n], full_grads[n], atol=1e-5) for n in full_grads)
    assert max(seen) <= 4  # never the head over more than a chunk (the model's own call gets zero positions)
    assert seen.count(0) == 1 and len(seen) > 3


def test_a_batch_the_loss_masks_out_entirely_still_backpropagates(model):
    """A micro-batch without a loss position (every row dropped or filtered): zeros, and a loss
    whose backward runs (zero gradients) as the full logits' would, not an error."""
    batch = _batch()
    batch["loss_mask"] = torch.zeros_like(batch["loss_mask"])
    ours = model_logprobs(model, dict(batch))
    assert ours.shape == batch["input_ids"].shape and (ours == 0).all() and ours.requires_grad
    grads = _grads(model, ours.sum())
    assert grads and all((g == 0).all() for g in grads.values())


def test_candidates_and_top_k_equal_the_full_logits_at_the_loss_positions(model):
    batch = _batch()
    gen = torch.Generator().manual_seed(3)
    batch["candidate_ids"] = torch.randint(0, 101, (*batch["input_ids"].shape, 3), generator=gen)
    batch[TOPK_REQUEST] = torch.tensor(4)
    with torch.no_grad():
        model_logprobs(model, batch)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    keep = batch["loss_mask"].clone()
    keep[:, 0] = 0
    keep3 = keep.unsqueeze(-1)
    candidates = candidate_logprobs(logits, batch["candidate_ids"], batch["attention_mask"]) * keep3
    top, ids = topk_logprobs(logits, 4, batch["attention_mask"])
    assert torch.allclose(batch["candidate_logprobs"], candidates, atol=1e-5)
    assert torch.allclose(batch["topk_logprobs"], top * keep3, atol=1e-5)
    assert torch.equal(batch["topk_ids"], ids * keep3)


def test_a_model_that_caps_its_logits_after_the_head_is_scored_from_its_full_logits():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    capped = Gemma2ForCausalLM(Gemma2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                            num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                            vocab_size=101, final_logit_softcapping=5.0))
    assert not head_logprobs.head_hookable(capped)
    batch = _batch()
    with torch.no_grad():
        ours = model_logprobs(capped, dict(batch))
        logits = capped(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    mask = batch["loss_mask"].clone()
    mask[:, 0] = 0
    assert torch.allclose(ours, token_logprobs(logits, batch["input_ids"], batch["attention_mask"]) * mask, atol=1e-6)
