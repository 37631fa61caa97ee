"""Multi-token-prediction (MTP) heads on the megatron backend (corerl_megatron.training.mtp): a tiny
MiMo-like checkpoint (a Qwen2 decoder with one MTP head under MiMo's Hugging Face names), one megatron
rank in this process (gloo, world size 1). The heads are megatron-core's MTP block with the local
layer spec; their logits equal MiMo's head computed by hand from the Hugging Face tensors; a training
step with the draft loss moves the heads and leaves the trunk's gradient what it is without them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.megatron_recipe import megatron_config
from tests.mimo_checkpoint import make_mimo

HIDDEN, HEADS, KV_HEADS, VOCAB = 64, 4, 2, 128


@pytest.fixture(scope="module")
def mimo_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny Qwen2 checkpoint made MiMo: its config names MiMoForCausalLM with one MTP head, whose
    tensors are added to the weights file."""
    from corerl.models.tiny import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("mimo"), family="qwen2", hidden_size=HIDDEN, num_layers=2,
                            num_heads=HEADS, num_kv_heads=KV_HEADS, tie_word_embeddings=False)
    make_mimo(path)
    return str(path)


# no clipping: the global norm counts the heads' gradients, and would scale the trunk's by it
_PLAIN = ["policy.megatron_cfg.optimizer.clip_grad=0", "policy.megatron_cfg.optimizer.weight_decay=0"]


@pytest.fixture(scope="module")
def workers(mimo_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Two megatron ranks on the same checkpoint in this process: with its MTP head, and without."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    from corerl.sdk import free_port
    from corerl_megatron.training.worker import MegatronWorker

    made = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MASTER_ADDR", "127.0.0.1")
        patch.setenv("MASTER_PORT", str(free_port()))
        try:
            labels = ["policy.megatron_cfg.mtp_num_layers=1", "policy.megatron_cfg.mtp_loss_scaling_factor=0.5",
                      "policy.megatron_cfg.mtp_loss_chunk_size=3", "policy.megatron_cfg.mtp_loss_target=labels"]
            for name, heads in (("mtp", ["policy.megatron_cfg.mtp_num_layers=1",
                                         "policy.megatron_cfg.mtp_loss_scaling_factor=0.5",
                                         "policy.megatron_cfg.mtp_loss_chunk_size=3"]),
                                ("plain", ["policy.megatron_cfg.mtp_num_layers=0"]),
                                # NeMo RL's MTP: the heads learn the row's tokens, the trunk too unless detached
                                ("labels", labels),
                                ("labels_detached", [*labels, "policy.megatron_cfg.mtp_detach_heads=true"]),
                                ("repeated", ["policy.megatron_cfg.mtp_num_layers=2", "policy.megatron_cfg.mtp_loss_target=labels",
                                              "policy.megatron_cfg.mtp_use_repeated_layer=true"])):
                config = megatron_config(mimo_dir, tmp_path_factory.mktemp(name), [*_PLAIN, *heads])
                made[name] = MegatronWorker(rank=0, world_size=1, config=config, threads=1,
                                            checkpoint_dir=str(tmp_path_factory.mktemp(f"conversions-{name}")))
                made[name].load_hf(mimo_dir)
            yield made
        finally:
            parallel_state.destroy_model_parallel()
            if dist.is_initialized():
                dist.destroy_process_group()


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(8))
    mask = torch.ones_like(ids)
    mask[:, :3] = 0  # a prompt of 3 tokens: no loss there
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": mask}


def _mimo_head_by_hand(model_dir: str, ids: torch.Tensor) -> torch.Tensor:
    """MiMo's MTP head from its Hugging Face tensors (as vLLM's mimo_mtp computes it): the trunk's
    final hidden state of position t and the embedding of token t + 1, each normed, concatenated
    hidden first, projected, one Qwen2 decoder layer, the head's final norm, the output head."""
    from safetensors.torch import load_file
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.models.qwen2.modeling_qwen2 import (
        Qwen2DecoderLayer,
        Qwen2RMSNorm,
        Qwen2RotaryEmbedding,
    )

    config = Qwen2Config.from_pretrained(model_dir)
    config._attn_implementation = "sdpa"  # no mask given: causal
    trunk = Qwen2ForCausalLM.from_pretrained(model_dir, config=config, dtype=torch.float32).eval()
    head = {k.removeprefix("model.mtp_layers.0."): v for k, v in load_file(f"{model_dir}/model.safetensors").items()
            if k.startswith("model.mtp_layers.0.")}

    def norm(name: str) -> Qwen2RMSNorm:
        module = Qwen2RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        module.weight.data.copy_(head[f"{name}.weight"])
        return module

    layer = Qwen2DecoderLayer(config, layer_idx=0)
    layer.load_state_dict({k: v for k, v in head.items() if k.startswith(("self_attn.", "mlp.", "input_layernorm",
                                                                          "post_attention_layernorm"))})
    with torch.no_grad():
        hidden = trunk.model(input_ids=ids).last_hidden_state[:, :-1]
        embedded = trunk.model.embed_tokens(ids[:, 1:])
        x = torch.cat([norm("hidden_layernorm")(hidden), norm("token_layernorm")(embedded)], dim=-1)
        x = x @ head["input_proj.weight"].T
        positions = torch.arange(x.shape[1]).expand(x.shape[0], -1)
        rotary = Qwen2RotaryEmbedding(config)(x, positions)
        out = layer(x, attention_mask=None, position_ids=positions, position_embeddings=rotary)
        out = out[0] if isinstance(out, tuple) else out
        return trunk.lm_head(norm("final_layernorm")(out))


def test_the_heads_are_megatron_s_mtp_block_and_compute_mimo_s_head(workers: dict[str, Any], mimo_dir: str) -> None:
    worker = workers["mtp"]
    module = worker.model.module
    names = [n for n, _ in module.named_parameters() if n.startswith("mtp.")]
    assert "mtp.layers.0.eh_proj.weight" in names and "mtp.layers.0.transformer_layer.mlp.linear_fc1.weight" in names
    assert not any(n.startswith("mtp.") for n, _ in workers["plain"].model.module.named_parameters())
    ids = _batch()["input_ids"]
    module.train()
    module(ids, torch.arange(ids.shape[1]).expand_as(ids), attention_mask=None)  # the training forward runs them
    per_depth, _ = worker.draft.pending
    worker.draft.pending = None
    with torch.no_grad():
        ours = worker.draft.logits(per_depth[0])[:, :-1]  # the last position's next-next token is past the row
    theirs = _mimo_head_by_hand(mimo_dir, ids)
    assert (ours - theirs).abs().max() < 1e-4, float((ours - theirs).abs().max())


def test_the_draft_loss_trains_the_heads_and_leaves_the_trunk_s_gradient_as_without_them(
        workers: dict[str, Any]) -> None:
    mb = _batch()

    def loss_fn(logprobs: torch.Tensor, batch: dict[str, torch.Tensor], normaliser: float) -> tuple[Any, dict]:
        return -(logprobs * batch["loss_mask"]).sum() / normaliser, {}

    found = {}
    for name in ("mtp", "plain"):
        worker = workers[name]
        module = worker.model.module
        before = {n: p.detach().clone() for n, p in module.named_parameters()}
        result = worker.train_step([mb], loss_fn, float(mb["loss_mask"].sum()))
        grads = {n: p.main_grad.detach().clone() for n, p in module.named_parameters()}
        moved = {n for n, p in module.named_parameters() if not torch.equal(before[n], p.detach())}
        found[name] = (result, grads, moved)
        with torch.no_grad():  # the module's other tests compare the heads with the checkpoint's: put it back
            for n, p in module.named_parameters():
                p.copy_(before[n])
    (with_heads, grads, moved), (plain, plain_grads, _) = found["mtp"], found["plain"]
    assert with_heads["metrics"]["mtp/draft_loss"] > 0 and "mtp/draft_loss" not in plain["metrics"]
    # the policy loss is the same; the reported loss adds w * the draft loss
    assert with_heads["loss"] == pytest.approx(plain["loss"] + 0.5 * with_heads["metrics"]["mtp/draft_loss"], rel=1e-5)
    heads = {n for n in grads if n.startswith("mtp.")}
    assert heads and all(grads[n].abs().max() > 0 for n in heads) and heads <= moved
    assert set(plain_grads) == set(grads) - heads
    for name, grad in plain_grads.items():  # the trunk, the embeddings and the output layer: untouched by the draft
        assert torch.equal(grad, grads[name]), name


def test_the_draft_loss_is_the_trunk_distilled_into_the_heads(workers: dict[str, Any]) -> None:
    """The loss by hand from the heads' logits: soft cross-entropy against the trunk's distribution one
    position on, over the completion's targets; chunked (3 positions a chunk) as whole; top-k renormalised."""
    from corerl_megatron.training.mtp import soft_cross_entropy

    worker, mb = workers["mtp"], _batch()
    module, draft = worker.model.module, worker.draft
    module.train()
    ids = mb["input_ids"]
    teacher = module(ids, torch.arange(ids.shape[1]).expand_as(ids), attention_mask=None).detach()
    per_depth, _ = draft.pending
    with torch.no_grad():
        student = draft.logits(per_depth[0])
        ce = -(teacher[:, 1:-1].softmax(-1) * student[:, :-2].log_softmax(-1)).sum(-1)
        want = (ce * mb["loss_mask"][:, 2:]).sum() / 10.0
        got = draft.loss(mb, 10.0)
    assert got == pytest.approx(float(want), rel=1e-5)
    top = soft_cross_entropy(student, teacher, topk=teacher.shape[-1])
    assert torch.allclose(top, soft_cross_entropy(student, teacher, topk=None), atol=1e-5)


def _step_gradients(worker: Any, mb: dict[str, torch.Tensor]) -> tuple[dict, dict[str, torch.Tensor]]:
    """One training step's result and gradients (the weights put back after it)."""
    def loss_fn(logprobs: torch.Tensor, batch: dict[str, torch.Tensor], normaliser: float) -> tuple[Any, dict]:
        return -(logprobs * batch["loss_mask"]).sum() / normaliser, {}

    module = worker.model.module
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    result = worker.train_step([mb], loss_fn, float(mb["loss_mask"].sum()))
    grads = {n: p.main_grad.detach().clone() for n, p in module.named_parameters()}
    with torch.no_grad():
        for n, p in module.named_parameters():
            p.copy_(before[n])
    return result, grads


def _label_loss_by_hand(worker: Any, mb: dict[str, torch.Tensor], normaliser: float) -> tuple[float, float, int]:
    """(the heads' loss on the row's own tokens computed here, the worker's, the depths): head k at t
    against token t + k + 1."""
    module, draft = worker.model.module, worker.draft
    module.train()
    ids = mb["input_ids"]
    module(ids, torch.arange(ids.shape[1]).expand_as(ids), attention_mask=None)
    per_depth, _ = draft.pending
    with torch.no_grad():
        want = 0.0
        for k, hidden in enumerate(per_depth, start=1):
            logits = draft.logits(hidden)[:, :-(k + 1)]
            ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, k + 1:], reduction="none")
            want += float((ce * mb["loss_mask"][:, k + 1:]).sum())
        got = float(draft.loss(mb, normaliser))
    return want / (normaliser * len(per_depth)), got, len(per_depth)


def test_with_labels_the_heads_learn_the_row_s_tokens_in_chunks_as_whole(workers: dict[str, Any]) -> None:
    """mtp_loss_target=labels (NeMo RL's MTP loss): cross-entropy of head 1 at t against token t + 2 over
    the completion, by hand; its chunks of 3 positions give the whole loss."""
    want, got, depths = _label_loss_by_hand(workers["labels"], _batch(), 10.0)
    assert got == pytest.approx(want, rel=1e-5) and got > 0 and depths == 1


def test_with_labels_the_loss_reaches_the_trunk_unless_the_heads_are_detached(workers: dict[str, Any]) -> None:
    mb = _batch()
    plain, plain_grads = _step_gradients(workers["plain"], mb)
    for name, reaches_trunk in (("labels", True), ("labels_detached", False)):
        result, grads = _step_gradients(workers[name], mb)
        assert result["metrics"]["mtp/draft_loss"] > 0
        assert result["loss"] == pytest.approx(plain["loss"] + 0.5 * result["metrics"]["mtp/draft_loss"], rel=1e-5)
        assert all(grads[n].abs().max() > 0 for n in grads if n.startswith("mtp."))
        changed = [n for n, g in plain_grads.items() if not torch.allclose(g, grads[n], atol=1e-7)]
        if reaches_trunk:  # the embeddings, the trunk's layers and the output layer learn from it too
            assert any("decoder.layers" in n for n in changed) and "output_layer.weight" in changed, changed
            assert "embedding.word_embeddings.weight" in changed
        else:
            assert changed == [], changed


def test_a_repeated_head_runs_at_every_depth_with_one_set_of_weights(workers: dict[str, Any]) -> None:
    """mtp_use_repeated_layer: 2 depths from the checkpoint's one head (its weights once, under head 0's
    names, which export back to the checkpoint's); the loss averages both depths."""
    worker = workers["repeated"]
    module = worker.model.module
    assert module.mtp.layers[1] is module.mtp.layers[0]
    names = [n for n, _ in module.named_parameters() if n.startswith("mtp.")]
    assert names and all(n.startswith("mtp.layers.0.") for n in names)
    want, got, depths = _label_loss_by_hand(worker, _batch(), 10.0)
    assert got == pytest.approx(want, rel=1e-5) and depths == 2


def test_hf_megatron_hf_round_trip_of_mtp_weights_is_exact(mimo_dir: str) -> None:
    from corerl_megatron.conversion.convert import hf_to_megatron, megatron_to_hf
    from corerl_megatron.conversion.store import checkpoint_tensors, load_hf_model_config

    hf, family, shape = load_hf_model_config(Path(mimo_dir))
    assert family.name == "mimo" and shape.mtp_layers == 1 and shape.qkv_bias
    state = checkpoint_tensors(Path(mimo_dir))
    megatron = hf_to_megatron(state, family, shape)
    assert {k for k in megatron if k.startswith("mtp.")} == {
        f"mtp.layers.0.{n}" for n in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "final_layernorm.weight",
                                      *(f"transformer_layer.{t}" for t in (
                                          "input_layernorm.weight", "self_attention.linear_qkv.weight",
                                          "self_attention.linear_qkv.bias", "self_attention.linear_proj.weight",
                                          "pre_mlp_layernorm.weight", "mlp.linear_fc1.weight",
                                          "mlp.linear_fc2.weight")))}
    # megatron-core's eh_proj reads [embedding; hidden], MiMo's input_proj [hidden; embedding]
    proj = state["model.mtp_layers.0.input_proj.weight"]
    assert torch.equal(megatron["mtp.layers.0.eh_proj.weight"][:, :HIDDEN], proj[:, HIDDEN:])
    back = megatron_to_hf(megatron, family, shape)
    assert sorted(back) == sorted(state)
    assert all(torch.equal(back[k], state[k]) for k in state)
    # a model built with fewer heads than the checkpoint exports the trunk (and the heads it has)
    trunk_only = megatron_to_hf({k: v for k, v in megatron.items() if not k.startswith("mtp.")}, family, shape)
    assert sorted(trunk_only) == sorted(k for k in state if ".mtp_layers." not in k)


def test_more_heads_than_the_checkpoint_has_are_refused_in_one_line() -> None:
    from corerl.errors import ConfigError, EngineNotAvailable
    from corerl_megatron.training.mtp import heads_to_build

    assert heads_to_build(None, 1, "m") == 1 and heads_to_build(0, 1, "m") == 0
    with pytest.raises(ConfigError, match="asks for 2 multi-token-prediction heads and m has 1"):
        heads_to_build(2, 1, "m")
    with pytest.raises(EngineNotAvailable, match="policy.lora"):
        heads_to_build(None, 1, "m", lora=True)
    assert heads_to_build(None, 0, "m", lora=True, stages=2) == 0  # a checkpoint without heads: nothing to refuse


def test_validation_refuses_heads_the_checkpoint_lacks_in_one_line(mimo_dir: str, tmp_path: Path) -> None:
    from corerl.errors import ConfigError, ConfigErrors

    config = megatron_config(mimo_dir, tmp_path / "ok", ["policy.megatron_cfg.mtp_num_layers=null"])
    assert config.section("policy.megatron_cfg").mtp_num_layers is None  # the checkpoint's one head
    with pytest.raises((ConfigError, ConfigErrors), match="asks for 2 multi-token-prediction heads and .* has 1"):
        megatron_config(mimo_dir, tmp_path / "two", ["policy.megatron_cfg.mtp_num_layers=2"])
    with pytest.raises((ConfigError, ConfigErrors), match="pipeline_model_parallel_size=1"):
        megatron_config(mimo_dir, tmp_path / "pp", ["policy.megatron_cfg.mtp_num_layers=1", "cluster.gpus_per_node=2",
                                            "policy.megatron_cfg.pipeline_model_parallel_size=2"])
    with pytest.raises((ConfigError, ConfigErrors), match="not trained with policy.lora"):
        megatron_config(mimo_dir, tmp_path / "lora", ["policy.megatron_cfg.mtp_num_layers=null", "policy.lora.enabled=true"])
    with pytest.raises((ConfigError, ConfigErrors), match="does not run on packed rows"):
        megatron_config(mimo_dir, tmp_path / "packed", ["policy.megatron_cfg.mtp_num_layers=null",
                                                "policy.sequence_packing.enabled=true"])


def _draft_and_head_gradients(worker: Any) -> tuple[float, dict[str, torch.Tensor]]:
    """The draft loss of the test batch and its gradient on each head parameter, whole (gathered over
    the tensor-parallel ranks), from a fresh worker's weights."""
    from corerl_megatron.training.sharding import gather

    module, mb = worker.model.module, _batch()
    module.train()
    worker.model.zero_grad_buffer()
    ids = mb["input_ids"]
    module(ids, torch.arange(ids.shape[1]).expand_as(ids), attention_mask=None)
    loss = worker.draft.loss(mb, 10.0)
    loss.backward()
    group = worker.ps.get_tensor_model_parallel_group()
    grads = {name: gather(name, param.main_grad.detach().clone(), worker.layout.partition[name], group, worker.tp)
             for name, param in module.named_parameters() if name.startswith("mtp.")}
    return float(loss.detach()), grads


def _head_answers(worker: Any) -> dict[str, Any]:
    """Through the head's chunks (:mod:`corerl_megatron.training.response_head`, 2 positions a chunk): the
    test batch's logprobs, top-3 and candidate logprobs, the draft loss distilled from the trunk's hidden
    states, and the gradients of the logprobs' and candidates' sum on the output weight (whole) and on the
    final norm (the same on every rank: the hidden states' gradient summed over the vocabulary's slices)."""
    from corerl_megatron.training.response_head import head_logprobs
    from corerl_megatron.training.sharding import gather

    module, mb = worker.model.module, _batch()
    mb["candidate_ids"] = torch.stack([mb["input_ids"].roll(k, dims=1) for k in (1, 2)], dim=-1)
    module.train()
    worker.model.zero_grad_buffer()
    ids = mb["input_ids"]
    worker.head.active = True
    try:
        hidden = module(ids, torch.arange(ids.shape[1]).expand_as(ids), attention_mask=None)
    finally:
        worker.head.active = False
    draft = float(worker.draft.loss(mb, 10.0).detach())
    weight = worker.head.weight()
    logprobs = head_logprobs(hidden, weight, mb, chunk_elements=2 * weight.shape[0], topk=3)
    (logprobs.sum() + mb["candidate_logprobs"].sum()).backward()
    grad = gather("output_layer.weight", weight.main_grad.detach(), worker.layout.partition["output_layer.weight"],
                  worker.ps.get_tensor_model_parallel_group(), worker.tp)
    return {"logprobs": logprobs.detach(), "candidates": mb["candidate_logprobs"].detach(),
            "topk": mb["topk_logprobs"], "topk_ids": mb["topk_ids"], "draft": draft, "grad": grad,
            "norm_grad": module.decoder.final_layernorm.weight.main_grad.detach().clone()}


def _tensor_parallel_rank(rank: int, model_dir: str, config: Any, port: int, out: str) -> None:
    """One of two gloo ranks (tensor parallel 2): the draft loss and the heads' gradients."""
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from corerl_megatron.training.worker import MegatronWorker

    worker = MegatronWorker(rank=rank, world_size=2, config=config, threads=1,
                            checkpoint_dir=str(Path(out).parent / "conversions-tp2"))
    worker.load_hf(model_dir)
    assert worker.tp == 2 and worker.layout.partition["mtp.layers.0.eh_proj.weight"] == 0  # the heads are split
    found = (*_draft_and_head_gradients(worker), _head_answers(worker))
    if rank == 0:
        torch.save(found, out)


def test_tensor_parallel_2_heads_give_the_same_draft_loss_and_head_gradients(
        workers: dict[str, Any], mimo_dir: str, tmp_path: Path) -> None:
    """The heads split over 2 gloo ranks (eh_proj by rows, the layer's projections as the decoder's):
    the draft loss and each head parameter's gradient, whole, as on one rank."""
    import torch.multiprocessing as mp

    from corerl.sdk import free_port
    from corerl_megatron.training.worker import MegatronWorker

    heads = ["policy.megatron_cfg.mtp_num_layers=1"]
    single = MegatronWorker(rank=0, world_size=1, config=megatron_config(mimo_dir, tmp_path / "tp1", [*_PLAIN, *heads]),
                            threads=1, checkpoint_dir=str(tmp_path / "conversions-tp1"))
    single.load_hf(mimo_dir)
    want_loss, want = _draft_and_head_gradients(single)
    want_head = _head_answers(single)
    config = megatron_config(mimo_dir, tmp_path / "tp2", [*_PLAIN, *heads, "policy.megatron_cfg.tensor_model_parallel_size=2",
                                                  "cluster.gpus_per_node=2"])
    out = tmp_path / "found.pt"
    mp.spawn(_tensor_parallel_rank, args=(mimo_dir, config, free_port(), str(out)), nprocs=2)
    loss, grads, head = torch.load(out)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    assert set(grads) == set(want)
    for name, grad in want.items():
        assert grad.abs().max() > 0 and torch.allclose(grads[name], grad, atol=1e-6, rtol=1e-4), name
    # the vocabulary split over the two ranks: the head's logprobs, top-k, candidates, the heads' teacher
    # and the output weight's gradient as on one rank
    assert head["draft"] == pytest.approx(want_head["draft"], rel=1e-5) and want_head["draft"] > 0
    assert torch.equal(head["topk_ids"], want_head["topk_ids"]) and int(want_head["topk_ids"].max()) > 0
    for key in ("logprobs", "candidates", "topk", "grad", "norm_grad"):
        assert float(want_head[key].abs().max()) > 0
        assert torch.allclose(head[key], want_head[key], atol=1e-5), key
