"""A vision-language policy (the tiny Qwen2.5-VL) on megatron: megatron-core's GPTModel with
multimodal rotary positions as the decoder and transformers' vision tower beside it
(corerl_megatron.training.vision). Its logprobs equal a plain transformers forward's and
generation's, one step equals a plain PyTorch SGD step (megatron's own SGD, clipping and
scheduler), and the tower moves only where trained: with two tensor-parallel ranks and the tower
trained, and with two data-parallel ranks and the tower frozen (the second rank's rows hold no
image, so its tower takes no gradient). A batch without any image reads as text."""

from __future__ import annotations

import pytest
import torch

from corerl.testing.conformance import LR, MAX_GRAD_NORM, MOMENTUM
from corerl.testing.reference import at_loss_positions, loss_positions, max_diff
from corerl.testing.vision_reference import (
    TOLERANCE,
    check_vision_step,
    generated_batch,
    plain_model,
)

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("layout", "frozen"), [
    pytest.param(["policy.megatron_cfg.tensor_model_parallel_size=2"], False, id="tp2-tower-trained"),
    pytest.param([], True, id="dp2-tower-frozen"),
])
def test_megatron_trains_a_vision_language_model_as_plain_pytorch_does(tmp_path, layout, frozen):
    from corerl.models.tiny import BUILTIN_MODELS, build_tiny_model
    from corerl.testing import host_with, select_for, write_recipe

    # two key-value heads, so that two tensor-parallel ranks can split them
    model_dir = str(build_tiny_model(tmp_path / "tiny-vl", **dict(BUILTIN_MODELS["builtin:tiny-vl"], hidden_size=128,
                                                                    num_kv_heads=2)))
    vision_batch = generated_batch(model_dir)
    megatron = {"enabled": True, "optimizer": {"optimizer": "sgd", "lr": LR, "sgd_momentum": MOMENTUM,
                                               "clip_grad": MAX_GRAD_NORM, "weight_decay": 0.0},
                "scheduler": {"lr_decay_style": "linear", "lr_warmup_iters": 2}}
    recipe = write_recipe(tmp_path / "vl.yaml", {
        "policy": {"model_name": model_dir, "precision": "float32", "train_micro_batch_size": 2,
                   "max_grad_norm": MAX_GRAD_NORM, "freeze_vision_tower": frozen, "megatron_cfg": megatron,
                   "generation": {"backend": "hf"}},
        "algorithm": {"max_steps": 8, "seed": 1234},
    })
    config, selection = select_for(host_with(None, "installed"), recipe, ["cluster.gpus_per_node=2", *layout])
    assert selection.training_backend.id == "megatron", selection.training_backend.reason
    backend = selection.training_backend.registration.create(config=config)
    try:
        check_vision_step(backend, model_dir, vision_batch, frozen=frozen)
        # a batch without any image (no image fields at all): text rotary positions, no tower
        backend.load_hf(model_dir)
        batch = {k: v[2:] for k, v in vision_batch[0].items() if k not in ("pixel_values", "image_grid_thw")}
        with torch.no_grad():
            logits = plain_model(model_dir)(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        plain = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
        ours = at_loss_positions(backend.logprobs(batch), batch)[:, 1:]
        mask = loss_positions(batch)[:, 1:].bool()
        assert max_diff(ours[mask], plain[mask]) <= TOLERANCE
    finally:
        backend.shutdown()
