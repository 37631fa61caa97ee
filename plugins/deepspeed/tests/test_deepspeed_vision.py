"""A vision-language policy (the tiny Qwen2.5-VL) under ZeRO-3, its vision tower frozen (the
default for RL): logprobs equal generation's and a plain transformers forward's, one step equals a
plain PyTorch step, and the frozen tower's weights (partitioned by ZeRO-3 like the rest, out of
the optimizer) do not move.

At world size 2, not 1: each DeepSpeed rank is a Ray actor at any world size, so the second rank
costs little, and the batch's last two rows (the second rank's shard) hold no image, so that rank
runs the tower on a blank image in step with the first rank's ZeRO-3 gathers
(`corerl.sdk.run_vision_on_every_rank`). ZeRO-1/2, world size 1 and a trained tower were checked by hand."""

from __future__ import annotations

from corerl.testing.conformance import LR, MAX_GRAD_NORM, MOMENTUM
from corerl.testing.vision_reference import check_vision_step, generated_batch


def test_zero3_at_world_size_2_trains_a_vision_language_model_with_its_tower_frozen(tmp_path):
    from corerl.models.tiny import BUILTIN_MODELS, build_tiny_model
    from corerl.testing import host_with, select_for, write_recipe
    from corerl_deepspeed.backend import DeepSpeedBackend

    model_dir = str(build_tiny_model(tmp_path / "tiny-vl", **BUILTIN_MODELS["builtin:tiny-vl"]))
    vision_batch = generated_batch(model_dir)
    recipe = write_recipe(tmp_path / "vl.yaml", {
        "policy": {"model_name": model_dir, "precision": "float32", "train_micro_batch_size": 2,
                   "max_grad_norm": MAX_GRAD_NORM, "training_backend": "deepspeed", "freeze_vision_tower": True,
                   "optimizer": {"name": "sgd", "lr": LR, "momentum": MOMENTUM},
                   "scheduler": {"name": "linear", "warmup_steps": 2}, "generation": {"backend": "hf"}},
        "algorithm": {"max_steps": 8, "seed": 1234},
    })
    config, selection = select_for(host_with(None, "installed"), recipe,
                                   ["cluster.gpus_per_node=2", "policy.deepspeed_cfg.zero_stage=3"])
    assert selection.training_backend.id == "deepspeed", selection.training_backend.reason
    backend = DeepSpeedBackend(config)
    try:
        check_vision_step(backend, model_dir, vision_batch, frozen=True)
    finally:
        backend.shutdown()
