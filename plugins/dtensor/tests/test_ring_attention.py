"""Ring attention (corerl_dtensor.ring_attention) against plain causal attention over the whole
sequence: the output and the gradients of queries, keys and values at every position; and the
context-parallel token logprobs of a Hugging Face model (corerl_dtensor.context_parallel) against
model_logprobs' over the whole sequences.

The ranks here are threads of one process exchanging blocks through memory (a ring of their
own below): the algorithm under test, its block order, masking, log-sum-exp merge and the
backward pass's travelling accumulators, is the same code a process-group ring runs."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from corerl_dtensor.ring_attention import positions_of, ring_attention


class _ThreadRing:
    """Ranks as threads: each shift posts its tensors and takes the previous rank's."""

    def __init__(self, posts: list, barrier: threading.Barrier, rank: int, size: int) -> None:
        self.posts, self.barrier, self.rank, self.size = posts, barrier, rank, size

    def shift(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        self.posts[self.rank] = [t.clone() for t in tensors]
        self.barrier.wait()
        received = self.posts[(self.rank - 1) % self.size]
        self.barrier.wait()
        return received


def _as_ranks(size: int, rank_main: Callable[[_ThreadRing], None]) -> None:
    """``rank_main(ring)`` in ``size`` threads at once; the first failure is raised (its peers'
    waits broken rather than left hanging)."""
    posts: list = [None] * size
    barrier = threading.Barrier(size)
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            rank_main(_ThreadRing(posts, barrier, rank, size))
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    if errors:
        raise errors[0]


def _run_ranks(size: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad: torch.Tensor) -> list[dict]:
    results: list[dict] = [{} for _ in range(size)]

    def rank_main(ring: _ThreadRing) -> None:
        where = positions_of(q.shape[2], ring.rank, size)
        local = [t[:, :, where].detach().clone().requires_grad_() for t in (q, k, v)]
        out = ring_attention(*local, ring)
        (out * grad[:, :, where]).sum().backward()
        results[ring.rank] = {"where": where, "out": out.detach(), "grads": [t.grad for t in local]}

    _as_ranks(size, rank_main)
    return results


@pytest.mark.parametrize("size", [1, 2, 3])
def test_ring_attention_equals_causal_attention_forward_and_backward(size):
    torch.manual_seed(size)
    batch, heads, seq, dim = 2, 3, 12 * size, 8
    q, k, v = (torch.randn(batch, heads, seq, dim, dtype=torch.float64, requires_grad=True) for _ in range(3))
    grad = torch.randn(batch, heads, seq, dim, dtype=torch.float64)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    (want * grad).sum().backward()
    for rank in _run_ranks(size, q.detach(), k.detach(), v.detach(), grad):
        where = rank["where"]
        torch.testing.assert_close(rank["out"], want.detach()[:, :, where])
        for got, full in zip(rank["grads"], (q.grad, k.grad, v.grad), strict=True):
            torch.testing.assert_close(got, full[:, :, where])


def test_every_rank_holds_an_early_and_a_late_chunk():
    assert positions_of(8, 0, 2).tolist() == [0, 1, 6, 7]
    assert positions_of(8, 1, 2).tolist() == [2, 3, 4, 5]
    with pytest.raises(ValueError, match="cannot be split into 2 x 2 equal chunks"):
        positions_of(10, 0, 2)


@pytest.mark.parametrize("kind", ["qwen2", "qwen3_moe", "critic", "lora"])
def test_context_parallel_outputs_of_right_padded_rows_equal_the_whole_sequences(tmp_path, kind):
    """corerl_dtensor.context_parallel over 2 ranks, the model attending with attn_implementation
    "corerl_ring": a tiny Qwen2 (grouped-query attention, rotary positions from position_ids), the
    tiny Qwen3-MoE (experts routed per token), a critic (values, not logprobs) and the Qwen2 with
    PEFT's LoRA adapters on its attention projections (only they train) give a
    right-padded micro-batch's outputs (rows of 11 and 7 tokens: padded to 12 for the 4 chunks)
    equal to model_logprobs' / model_values' on every rank, and the ranks' gradients summed are
    twice the whole batch's (each rank's loss is the whole loss; FSDP's mean over the ranks
    divides the factor out)."""
    import copy

    from corerl.models.tiny import build_tiny_model
    from corerl.models.value_model import init_value_model, load_pretrained, model_values
    from corerl.testing.moe_reference import MOE_SHAPE
    from corerl.training.logprobs import model_logprobs
    from corerl_dtensor.context_parallel import context_parallel_logprobs, context_parallel_values
    from corerl_dtensor.ring_attention import register_with_transformers

    path = build_tiny_model(tmp_path / "tiny", seed=2, **(MOE_SHAPE if kind == "qwen3_moe" else {}))
    role, whole_of, split_of = "policy", model_logprobs, context_parallel_logprobs
    if kind == "critic":
        path, role, whole_of, split_of = init_value_model(path, tmp_path / "critic"), "critic", model_values, \
            context_parallel_values
    dtype = torch.float32 if kind == "qwen3_moe" else torch.float64  # grouped_mm takes no float64
    whole = load_pretrained(path, role, attn_implementation="sdpa").to(dtype)
    split = load_pretrained(path, role, attn_implementation=register_with_transformers()).to(dtype)
    assert whole.config.num_key_value_heads < whole.config.num_attention_heads
    if kind == "critic":  # a zero head gives zero values: make it say something
        torch.nn.init.normal_(whole.score.weight, generator=torch.Generator().manual_seed(3))
        split.score.weight.data.copy_(whole.score.weight.data)
    if kind == "lora":  # PEFT's adapters on the attention projections, initialised non-zero
        from peft import LoraConfig, get_peft_model

        adapter = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                             init_lora_weights=False)
        torch.manual_seed(4)
        whole = get_peft_model(whole, adapter)
        split = get_peft_model(split, adapter)
        split.load_state_dict(whole.state_dict())
    ids = torch.randint(1, whole.config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    ids = ids * mask
    want = whole_of(whole, {"input_ids": ids, "attention_mask": mask})
    assert want.abs().sum() > 0
    want.sum().backward()
    replicas = [copy.deepcopy(split) for _ in range(2)]
    got: list = [None, None]

    def rank_main(ring: _ThreadRing) -> None:
        out = split_of(replicas[ring.rank], {"input_ids": ids, "attention_mask": mask}, ring)
        out.sum().backward()
        got[ring.rank] = out.detach()

    _as_ranks(2, rank_main)
    for out in got:
        torch.testing.assert_close(out, want.detach())
    # float32 (the MoE): two ranks' partial sums round apart by a few 1e-5 (the suite's weight tolerance)
    close = {"atol": 1e-4, "rtol": 1e-3} if dtype == torch.float32 else {}
    for name, param in whole.named_parameters():
        if param.grad is None:  # an expert no token was routed to
            assert all(dict(replica.named_parameters())[name].grad is None for replica in replicas), name
            continue
        summed = sum(dict(replica.named_parameters())[name].grad for replica in replicas)
        torch.testing.assert_close(summed, 2 * param.grad, msg=lambda m, name=name: f"{name}: {m}", **close)


@pytest.mark.parametrize("balancing, replay", [("aux_loss", False), ("seq_aux_loss", True)])
def test_context_parallel_router_terms_of_a_mixture_of_experts_equal_the_whole_sequences(tmp_path, balancing, replay):
    """The tiny Qwen3-MoE over 2 ranks: the router hooks (corerl.training.moe_router) get their
    layers' logits and experts back in whole rows, so each rank's load-balancing and z-loss terms
    and moe/* metrics equal those of the whole sequences, and the ranks' gradients of logprobs
    plus those terms summed are twice the whole batch's (as for the logprobs alone); with router
    replay (r2) the experts recorded over whole sequences are replayed at each rank's positions
    (the routers turned round after the recording, so that their own choice would differ)."""
    import copy
    from types import SimpleNamespace

    from corerl.models.tiny import build_tiny_model
    from corerl.models.value_model import load_pretrained
    from corerl.testing.moe_reference import MOE_SHAPE, _routers
    from corerl.training.logprobs import model_logprobs
    from corerl.training.moe_router import RouterHooks
    from corerl_dtensor.context_parallel import context_parallel_logprobs
    from corerl_dtensor.ring_attention import register_with_transformers

    path = build_tiny_model(tmp_path / "tiny", seed=2, **MOE_SHAPE)
    settings = SimpleNamespace(load_balancing_type=balancing, aux_loss_coeff=0.1, z_loss_coeff=0.01)
    whole = load_pretrained(path, "policy", attn_implementation="sdpa").float()
    split = load_pretrained(path, "policy", attn_implementation=register_with_transformers()).float()
    ids = torch.randint(1, whole.config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    mb = {"input_ids": ids * mask, "attention_mask": mask, "loss_mask": mask}

    def step(model, hooks, forward):
        if replay:  # the old policy's pass records each sequence's experts (here: with the hooks' own model)
            hooks.start_recording()
            with torch.no_grad(), hooks.micro_batch(mb, training=False) as current:
                forward()
            hooks.record(mb, current)
            with torch.no_grad():  # the routers now choose otherwise: only a replay at the right positions agrees
                for _, router in _routers(model):
                    router.weight.neg_()
        with hooks.micro_batch(mb, training=True) as current:
            logprobs = forward()
        term, metrics = hooks.step_terms(mb, current, normaliser=float(mask.sum()))
        (logprobs.sum() + term).backward()
        return term.detach(), metrics

    hooks = RouterHooks(_routers(whole), settings, replay=replay)
    want_term, want_metrics = step(whole, hooks, lambda: model_logprobs(whole, mb))
    assert want_term > 0 and want_metrics
    replicas = [copy.deepcopy(split) for _ in range(2)]
    got: list = [None, None]

    def rank_main(ring: _ThreadRing) -> None:
        model = replicas[ring.rank]
        rank_hooks = RouterHooks(_routers(model), settings, replay=replay)
        got[ring.rank] = step(model, rank_hooks, lambda: context_parallel_logprobs(model, mb, ring, rank_hooks))

    _as_ranks(2, rank_main)
    close = {"atol": 1e-4, "rtol": 1e-3}  # float32: two ranks' partial sums round apart
    for term, metrics in got:
        torch.testing.assert_close(term, want_term, **close)
        assert metrics.keys() == want_metrics.keys()
        for key, value in want_metrics.items():
            torch.testing.assert_close(metrics[key], value, msg=lambda m, key=key: f"{key}: {m}", **close)
    for name, param in whole.named_parameters():
        if param.grad is None:  # an expert no token was routed to
            continue
        summed = sum(dict(replica.named_parameters())[name].grad for replica in replicas)
        torch.testing.assert_close(summed, 2 * param.grad, msg=lambda m, name=name: f"{name}: {m}", **close)
