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
