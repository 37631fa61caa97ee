"""A vision-language policy (the tiny Qwen2.5-VL) on the dtensor backend: logprobs equal
generation's and a plain transformers forward's, and one step equals a plain PyTorch step, at world
size 1 with the vision tower frozen (its weights unchanged) and trained, and at world size 2 (FSDP2
over the vision blocks, the vision tower and the decoder layers; really 2 ranks over gloo) with it
trained.

The batch's last two rows hold no image: at world size 2 they are the second rank's whole shard,
so that rank runs the vision tower on a blank image in step with the first rank's real ones
(FSDP2's all-gathers) and reduces zero gradients for it. One world-size-2 group: the trained
tower's units run every collective a frozen tower's do and more (a frozen tower under FSDP2 was
checked by hand, with FSDP1, activation checkpointing, HSDP and Qwen3-VL)."""

from __future__ import annotations

import pytest

from corerl.testing.conformance import LR, MAX_GRAD_NORM, MOMENTUM
from corerl.testing.vision_reference import check_vision_step, generated_batch


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from corerl.models.tiny import BUILTIN_MODELS, build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-vl"), **BUILTIN_MODELS["builtin:tiny-vl"]))


@pytest.fixture(scope="module")
def vision_batch(model_dir):
    return generated_batch(model_dir)


def _backend(model_dir, tmp_path, world: int, frozen: bool):
    from corerl.testing import host_with, select_for, write_recipe
    from corerl_dtensor.backend import DTensorBackend

    recipe = write_recipe(tmp_path / f"vl-{world}-{frozen}.yaml", {
        "policy": {"model_name": model_dir, "precision": "float32", "train_micro_batch_size": 2,
                   "max_grad_norm": MAX_GRAD_NORM, "training_backend": "dtensor",
                   "freeze_vision_tower": frozen, "optimizer": {"name": "sgd", "lr": LR, "momentum": MOMENTUM},
                   "scheduler": {"name": "linear", "warmup_steps": 2}, "generation": {"backend": "hf"}},
        "algorithm": {"max_steps": 8, "seed": 1234},
    })
    config, selection = select_for(host_with(None, "installed"), recipe, [f"cluster.gpus_per_node={world}"])
    assert selection.training_backend.id == "dtensor", selection.training_backend.reason
    return DTensorBackend(config)


# world size 2: FSDP2 over 2 ranks; the second rank's rows hold no image (see the module's docstring)
@pytest.mark.parametrize(("world", "frozen"), [(1, True), (1, False), (2, False)],
                         ids=["world-1-tower-frozen", "world-1-tower-trained", "world-2-tower-trained"])
def test_vision_language_step(model_dir, vision_batch, tmp_path, world, frozen):
    backend = _backend(model_dir, tmp_path, world, frozen)
    try:
        check_vision_step(backend, model_dir, vision_batch, frozen)
    finally:
        backend.shutdown()
