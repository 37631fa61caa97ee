"""The hf backend beside dtensor at world size 1 samples with the training model itself: no
second copy of the weights, a refit that copies nothing, and logprobs equal to the trainer's."""

from __future__ import annotations

import pytest
import torch

from corerl.algorithms.batches import samples_to_batch
from corerl.generation.contract import SamplingSettings
from corerl.testing import host_with, select_for, write_recipe
from corerl.testing.conformance import conformance_loss
from corerl.training.weights import EngineWeights

PROMPTS = [[2, 5, 9, 13], [2, 7], [2, 11, 4, 6]]


def _engines(tmp_path, model_dir, *overrides):
    recipe = write_recipe(tmp_path / "r.yaml", {"policy": {
        "model_name": model_dir, "precision": "float32", "max_seq_length": 64, "training_backend": "dtensor",
        "optimizer": {"name": "sgd", "lr": 0.5}, "generation": {"backend": "hf"}}})
    config, selection = select_for(host_with(None, "installed"), recipe, list(overrides))
    training = selection.training_backend.registration.create(config=config)
    generation = selection.generation_backend.registration.create(config=config)
    return training, generation


@pytest.fixture
def model_dir(tmp_path):
    from corerl.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path / "model", hidden_size=64, num_layers=2, initializer_range=0.3))


def _trainer_logprobs(training, groups):
    batch = samples_to_batch(groups, torch.zeros(len(groups), len(groups[0])))
    mask = batch["loss_mask"].bool()
    return training.logprobs(batch)[mask], batch["gen_logprobs"][mask], batch


def test_generation_follows_every_train_step_without_a_copy(tmp_path, model_dir):
    training, generation = _engines(tmp_path, model_dir)
    try:
        training.load_hf(model_dir)  # as the runner does: the training engine first
        assert generation.use_training_engine(training)
        generation.load_hf(model_dir)
        assert generation.model is training.local_model()  # one model, no second copy
        sampling = SamplingSettings(temperature=1.0, max_new_tokens=8, seed=3)
        for round_ in range(3):
            if round_ == 2:  # the runner reloads the training engine after SFT: a new model object
                training.export_hf(str(tmp_path / "sft_model"))
                training.load_hf(str(tmp_path / "sft_model"))
                assert generation.model is training.local_model()
            groups = generation.generate(PROMPTS, sampling, n=2)
            ours, theirs, batch = _trainer_logprobs(training, groups)
            assert (ours - theirs).abs().max() <= 1e-5  # the sampler's logprobs are the trainer's
            batch["advantages"] = torch.randn(batch["input_ids"].shape[0], 1).expand_as(batch["input_ids"]).contiguous()
            training.train_step(batch, conformance_loss)
            # the refit recognises the engine's own stream and copies nothing (it is never iterated)
            generation.update_weights(EngineWeights(training, lambda: pytest.fail("the stream was copied")))
            generation.update_weights(training.weight_stream())
        with pytest.raises(ValueError, match="takes no other weights"):
            generation.update_weights([("model.embed_tokens.weight", torch.zeros(1))])
    finally:
        generation.shutdown()
        training.shutdown()


@pytest.mark.parametrize("override", ["policy.offload.policy=full", "policy.sequence_packing.enabled=true"])
def test_full_offload_and_packed_attention_keep_a_copy(tmp_path, model_dir, override):
    training, generation = _engines(tmp_path, model_dir, override)
    try:
        training.load_hf(model_dir)
        assert not generation.use_training_engine(training)
        generation.load_hf(model_dir)
        assert generation.model is not training.local_model()
    finally:
        generation.shutdown()
        training.shutdown()


def test_a_bfloat16_training_model_decodes_through_a_16_bit_copy_with_the_static_cache(tmp_path, model_dir):
    # the shared model keeps float32 weights under bf16 autocast, which a static cache (the GPU
    # default) cannot follow: generation decodes through a bf16 copy, refreshed before each call
    training, generation = _engines(tmp_path, model_dir, "policy.precision=bfloat16",
                                    "policy.generation.hf_kv_cache=static")
    try:
        training.load_hf(model_dir)
        assert generation.use_training_engine(training)
        generation.load_hf(model_dir)
        assert generation.static_cache
        calls = []
        hook = training.local_model().register_forward_hook(lambda *args: calls.append(1))
        sampling = SamplingSettings(temperature=1.0, max_new_tokens=6, seed=1)
        for _ in range(2):
            groups = generation.generate(PROMPTS, sampling, n=2)
            assert [len(g) for g in groups] == [2, 2, 2]
            ours, theirs, batch = _trainer_logprobs(training, groups)
            gap = (ours - theirs).abs()  # bf16 weights against bf16 autocast (measured: mean 0.03, max 0.19)
            assert gap.mean() <= 0.06 and gap.max() <= 0.3
            copy, source = generation.decode_copy.model, training.local_model()
            assert copy is not source and {p.dtype for p in copy.parameters()} == {torch.bfloat16}
            for mine, theirs in zip(copy.parameters(), source.parameters(), strict=True):
                assert torch.equal(mine, theirs.detach().to(torch.bfloat16))  # the weights of this step
            batch["advantages"] = torch.ones_like(batch["input_ids"], dtype=torch.float32)
            training.train_step(batch, conformance_loss)
        before = sum(1 for _ in calls)
        generation.generate(PROMPTS, sampling, n=1)
        assert len(calls) == before  # the training side's hooks stay with the training model
        hook.remove()
    finally:
        generation.shutdown()
        training.shutdown()


def test_weight_files_whose_process_is_gone_are_removed_and_the_others_kept(tmp_path):
    import os

    from corerl.generation.shared_weights import SharedWeightWriter, remove_stale_shared_memory

    gone = int(open("/proc/sys/kernel/pid_max").read()) + 1  # no process ever has this id
    names = [f"corerl-weights-{gone}-abc", f"corerl-weights-{os.getpid()}-def", "corerl-weights-old", "other-1-x"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / f"corerl-lora-{gone}-xyz" / "v1").mkdir(parents=True)  # the vLLM plugin's LoRA scratch folder
    assert sorted(remove_stale_shared_memory(str(tmp_path))) == sorted(
        [str(tmp_path / names[0]), str(tmp_path / f"corerl-lora-{gone}-xyz")])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[1:])
    writer = SharedWeightWriter()  # named after the process that writes it
    try:
        assert os.path.basename(writer.path).startswith(f"corerl-weights-{os.getpid()}-")
    finally:
        writer.close()
    # a live writer in another PID namespace (a container sharing /dev/shm): the pid in its file's
    # name means nothing here, the lock it holds does
    import fcntl

    foreign = tmp_path / f"corerl-weights-{gone}-live"
    foreign.write_bytes(b"x")
    owner = os.open(foreign, os.O_RDONLY)
    fcntl.flock(owner, fcntl.LOCK_SH)
    assert remove_stale_shared_memory(str(tmp_path)) == [] and foreign.exists()
    os.close(owner)  # the owner is gone: so is its lock
    assert remove_stale_shared_memory(str(tmp_path)) == [str(foreign)]


# -- a refit in buckets through shared memory (corerl.generation.weight_buckets) ----------------


def _layered_weights() -> list[tuple[str, torch.Tensor]]:
    """A two-block model's stream in state-dict order, the head tied to the embeddings."""
    torch.manual_seed(0)
    embed = torch.randn(32, 8)
    pairs = [("model.embed_tokens.weight", embed)]
    for i in range(2):
        pairs += [(f"model.layers.{i}.input_layernorm.weight", torch.randn(8)),
                  *[(f"model.layers.{i}.self_attn.{p}.weight", torch.randn(8, 8)) for p in "qkvo"],
                  (f"model.layers.{i}.self_attn.q_proj.bias", torch.randn(8)),
                  *[(f"model.layers.{i}.mlp.{p}_proj.weight", torch.randn(24, 8)) for p in ("gate", "up")],
                  (f"model.layers.{i}.mlp.down_proj.weight", torch.randn(8, 24))]
    return [*pairs, ("model.norm.weight", torch.randn(8)), ("lm_head.weight", embed)]


def _nbytes(bucket) -> int:
    return sum(t.numel() * t.element_size() for t in {t.data_ptr(): t for _, t in bucket}.values())


def test_buckets_hold_whole_groups_the_tied_head_once_and_a_big_group_alone():
    from corerl.generation.weight_buckets import group_of, plan_buckets

    assert group_of("model.layers.3.self_attn.qkv_proj.weight") == "model.layers.3.self_attn"
    assert group_of("model.layers.3.mlp.experts.7.up_proj.weight") == "model.layers.3.mlp"
    assert group_of("model.visual.blocks.0.attn.qkv.bias") == "model.visual.blocks.0.attn"
    assert group_of("model.embed_tokens.weight") == "model.embed_tokens" and group_of("lm_head.weight") == "lm_head"
    pairs = _layered_weights()
    attention = 4 * 8 * 8 * 4 + 8 * 4  # one block's self_attn in bytes: the largest group but the embeddings
    for size in (1, attention - 1, attention, 2 * attention + 100, 10**9):
        buckets = plan_buckets(pairs, size)
        names = [name for bucket in buckets for name, _ in bucket]
        assert sorted(names) == sorted(name for name, _ in pairs)  # every name once
        for bucket in buckets:  # no group spans two buckets; one over the size is alone
            groups = {group_of(name) for name, _ in bucket} - {"lm_head"}
            assert all(group_of(n) not in groups for other in buckets if other is not bucket for n, _ in other)
            assert _nbytes(bucket) <= size or len(groups) == 1
        first = next(b for b in buckets if any(n == "model.embed_tokens.weight" for n, _ in b))
        assert any(n == "lm_head.weight" for n, _ in first)  # the tied head rides with its storage
    assert len(plan_buckets(pairs, 1)) == 1 + 2 * 3 + 1  # embeddings(+head), per block norm/attn/mlp, final norm
    assert len(plan_buckets(pairs, 10**9)) == 1


class _Recording:
    """A shared-memory writer that records each bucket it is given (the writer is real)."""

    def __init__(self, log, index):
        from corerl.generation.shared_weights import SharedWeightWriter

        self.writer, self.log, self.index = SharedWeightWriter(), log, index

    def write(self, bucket):
        manifest = self.writer.write(bucket)
        self.log.append(("packed", self.index))
        return manifest

    def close(self):
        self.writer.close()


@pytest.mark.parametrize("bucket_bytes", [1, 300, 1500, 10**8])  # smaller than any tensor .. the whole model
def test_a_bucketed_refit_arrives_whole_through_two_reused_buffers(bucket_bytes):
    import os

    from corerl.generation.shared_weights import read_shared
    from corerl.generation.weight_buckets import plan_buckets, send_buckets

    pairs = _layered_weights()
    log: list = []
    writers = [_Recording(log, 0), _Recording(log, 1)]
    received: dict[str, torch.Tensor] = {}
    paths = set()

    def load(manifest):  # the engine's side: copies the bucket's tensors before it returns
        paths.add(manifest.path)
        offsets = [offset for _, _, _, offset in manifest.entries]
        assert len(offsets) - len(set(offsets)) == sum(n == "lm_head.weight" for n, *_ in manifest.entries)
        for name, tensor in read_shared(manifest):
            received[name] = tensor.clone()
        log.append(("loaded", len(log)))
        return len(manifest.entries)

    try:
        for _ in range(2):  # a second refit reuses the same two files
            stats = send_buckets(writers, pairs, load, bucket_bytes)
            assert stats.buckets == len(plan_buckets(pairs, bucket_bytes)) and sum(stats.loaded) == len(pairs)
            assert stats.bytes == sum(t.numel() * 4 for n, t in pairs if n != "lm_head.weight")  # tied: once
            assert 0 < stats.manifest_bytes < stats.bytes or stats.buckets == 1
            assert set(received) == {n for n, _ in pairs}
            assert all(torch.equal(received[n], t) for n, t in pairs)
            received.clear()
        assert paths <= {w.writer.path for w in writers} and len(paths) == min(2, stats.buckets)
    finally:
        for writer in writers:
            writer.close()
    assert not any(os.path.exists(w.writer.path) for w in writers)


def test_the_next_bucket_is_packed_while_the_engine_loads_and_no_buffer_is_overwritten_before_it_is_loaded():
    import threading
    import time

    from corerl.generation.weight_buckets import send_buckets

    pairs = _layered_weights()
    log: list = []
    writers = [_Recording(log, 0), _Recording(log, 1)]
    loads = []

    def load(manifest):
        k = len(loads)
        loads.append(manifest.path)
        if k + 1 < 8:  # the next bucket is packed meanwhile, into the other buffer
            deadline = time.monotonic() + 30
            while log.count(("packed", (k + 1) % 2)) < (k + 1) // 2 + 1 and time.monotonic() < deadline:
                time.sleep(0.001)
            assert log[-1] == ("packed", (k + 1) % 2)
        time.sleep(0.02)  # a slow engine: the packer must still wait for this buffer
        assert sum(1 for entry in log if entry == ("packed", k % 2)) == k // 2 + 1
        return threading.current_thread() is threading.main_thread()

    try:
        stats = send_buckets(writers, pairs, load, 1)
        assert stats.buckets == 8 and all(stats.loaded)  # every load in the calling thread
        assert loads == [writers[k % 2].writer.path for k in range(8)]
    finally:
        for writer in writers:
            writer.close()


def test_an_error_in_loading_or_packing_ends_the_refit_with_it():
    import threading

    from corerl.generation.shared_weights import SharedWeightWriter
    from corerl.generation.weight_buckets import send_buckets

    writer = SharedWeightWriter()
    try:
        before = threading.active_count()
        with pytest.raises(RuntimeError, match="engine died"):
            writer.stream(_layered_weights(), lambda manifest: (_ for _ in ()).throw(RuntimeError("engine died")), 1)
        assert threading.active_count() == before  # the packer is gone too

        class Broken:
            def write(self, bucket):
                raise OSError("no space left on /dev/shm")

        with pytest.raises(OSError, match="no space"):
            send_buckets([Broken(), Broken()], _layered_weights(), lambda manifest: 0, 1)
        with pytest.raises(ValueError, match="bucket_bytes"):
            writer.stream(_layered_weights(), lambda manifest: 0, 0)
    finally:
        writer.close()
    assert writer.partner is None
