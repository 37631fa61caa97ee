"""The DeepSpeed config corerl generates, its pass-through, and what is refused up front."""

from __future__ import annotations

import pytest
import torch

from corerl.errors import ConfigErrors, EngineNotAvailable
from corerl.testing import host_with, select_for, write_recipe
from corerl_deepspeed.ds_config import build_ds_config
from corerl_deepspeed.support import check_supported


def _config(tmp_path, *overrides: str):
    recipe = write_recipe(tmp_path / "r.yaml", {"policy": {"model_name": "m", "training_backend": "deepspeed",
                                                           "max_grad_norm": 0.5, "train_micro_batch_size": 3}})
    config, _ = select_for(host_with(None, "installed"), recipe, list(overrides))
    return config


def test_the_generated_config_follows_the_recipe_and_the_pass_through_wins(tmp_path):
    config = _config(tmp_path, "policy.deepspeed_cfg.zero_stage=3", "policy.deepspeed_cfg.offload_optimizer=cpu",
                     "policy.deepspeed_cfg.offload_param=cpu", "policy.precision=bfloat16",
                     "policy.deepspeed_cfg.config={zero_optimization: {reduce_bucket_size: 1000}, steps_per_print: 5}")
    ds = build_ds_config(config, on_gpu=False)
    assert ds["zero_optimization"] == {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": False},
                                       "offload_param": {"device": "cpu", "pin_memory": False},
                                       "reduce_bucket_size": 1000}
    assert ds["gradient_clipping"] == 0.5  # unset in the section: policy.max_grad_norm
    assert ds["bf16"] == {"enabled": True} and ds["train_micro_batch_size_per_gpu"] == 3
    assert ds["steps_per_print"] == 5 and "optimizer" not in ds
    ds = build_ds_config(_config(tmp_path, "policy.deepspeed_cfg.use_deepspeed_optimizer=true",
                                 "policy.deepspeed_cfg.gradient_clipping=2.0"), on_gpu=False)
    assert ds["optimizer"]["type"] == "AdamW" and ds["gradient_clipping"] == 2.0


def test_nvme_offload_checks_its_folder_when_the_recipe_is_validated(tmp_path):
    with pytest.raises(ConfigErrors, match="nvme_path: .*missing is not a folder"):
        _config(tmp_path, "policy.deepspeed_cfg.zero_stage=3", "policy.deepspeed_cfg.offload_param=nvme",
                f"policy.deepspeed_cfg.nvme_path={tmp_path / 'missing'}")
    with pytest.raises(ConfigErrors, match="use_deepspeed_optimizer: DeepSpeed's own optimizers are Adam and AdamW"):
        _config(tmp_path, "policy.deepspeed_cfg.use_deepspeed_optimizer=true", "policy.optimizer.name=sgd")


@pytest.mark.skipif(torch.cuda.is_available(), reason="these run where a GPU is present")
@pytest.mark.parametrize(("overrides", "key"), [
    (["policy.precision=float16"], "policy.precision"),
    (["policy.deepspeed_cfg.zero_stage=3", "policy.deepspeed_cfg.offload_param=nvme", "policy.deepspeed_cfg.nvme_path=."],
     "policy.deepspeed_cfg.offload_param"),
])
def test_what_needs_a_gpu_is_refused_in_one_line_without_one(tmp_path, overrides, key):
    with pytest.raises(EngineNotAvailable) as raised:
        check_supported(_config(tmp_path, *overrides))
    assert raised.value.key == key and "needs a GPU" in str(raised.value) and "\n" not in str(raised.value)
