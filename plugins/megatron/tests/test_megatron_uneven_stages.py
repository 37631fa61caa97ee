"""Uneven pipeline stages (megatron-core's ``num_layers_in_first/last_pipeline_stage``, NeMo RL's
``policy.megatron_cfg`` keys of the same names): a 3-layer model in two stages of 1 and 2 layers
computes, trains and exports what one rank does."""

from __future__ import annotations

import pytest
import torch

from corerl.testing import host_with, select_for, write_recipe
from corerl.testing.conformance import conformance_batch, conformance_loss
from corerl_megatron.stages import stage_layers

MEGATRON = ["policy.megatron_cfg.enabled=true", "policy.megatron_cfg.optimizer.optimizer=sgd",
            "policy.megatron_cfg.optimizer.lr=0.1", "policy.megatron_cfg.optimizer.weight_decay=0.0"]


def test_stage_layers_follow_megatron_cores_rule():
    assert stage_layers(8, 1) == [8] and stage_layers(8, 4) == [2, 2, 2, 2]
    assert stage_layers(10, 4, first=1, last=3) == [1, 3, 3, 3]
    assert stage_layers(3, 2, first=1) == [1, 2] and stage_layers(7, 3, last=1) == [3, 3, 1]


def test_the_stage_sizes_need_a_pipeline(tmp_path):
    recipe = write_recipe(tmp_path / "r.yaml", {"policy": {"model_name": "m", "megatron_cfg": {"enabled": True}}})
    from corerl.errors import ConfigErrors

    with pytest.raises(ConfigErrors) as refused:
        select_for(host_with(None, "installed"), recipe, ["policy.megatron_cfg.num_layers_in_first_pipeline_stage=1"])
    assert "policy.megatron_cfg.num_layers_in_first_pipeline_stage: sets a pipeline stage's layers, and " \
           "pipeline_model_parallel_size is 1" in refused.value.errors[0].one_line()


def _engine(model_dir: str, tmp_path, overrides: list[str]):
    recipe = write_recipe(tmp_path / "r.yaml", {"policy": {"model_name": model_dir, "precision": "float32",
                                                           "train_micro_batch_size": 2, "max_grad_norm": 1.0,
                                                           "generation": {"backend": "hf"}}})
    config, selection = select_for(host_with(None, "installed"), recipe, [*MEGATRON, *overrides])
    assert selection.training_backend.id == "megatron"
    return selection.training_backend.registration.create(config=config)


def test_two_uneven_stages_match_one_rank(tmp_path):
    from corerl.models.tiny import build_tiny_model

    model_dir = str(build_tiny_model(tmp_path / "model", hidden_size=64, num_layers=3))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    uneven = _engine(model_dir, tmp_path / "a", ["cluster.gpus_per_node=2",
                                                 "policy.megatron_cfg.pipeline_model_parallel_size=2",
                                                 "policy.megatron_cfg.num_layers_in_first_pipeline_stage=1"])
    single = _engine(model_dir, tmp_path / "b", ["cluster.gpus_per_node=1"])
    batch = conformance_batch()
    try:
        for engine in (uneven, single):
            engine.load_hf(model_dir)
        loaded = {name: tensor.clone() for name, tensor in single.weight_stream()}
        assert float((uneven.logprobs(batch) - single.logprobs(batch)).abs().max()) <= 1e-4
        for _ in range(2):
            ours, theirs = uneven.train_step(batch, conformance_loss), single.train_step(batch, conformance_loss)
            assert abs(ours.loss - theirs.loss) <= 1e-4 and abs(ours.grad_norm - theirs.grad_norm) <= 1e-4
        ours_w, theirs_w = dict(uneven.weight_stream()), dict(single.weight_stream())
        assert ours_w.keys() == theirs_w.keys() and any(".layers.2." in name for name in ours_w)
        assert max(float((ours_w[n] - theirs_w[n]).abs().max()) for n in ours_w) <= 1e-4
        moved = [n for n in ours_w if not torch.equal(ours_w[n], loaded[n])]
        assert len(moved) > len(ours_w) // 2, f"the two steps moved {len(moved)} of {len(ours_w)} weights"
    finally:
        uneven.shutdown()
        single.shutdown()


@pytest.mark.parametrize(("overrides", "key", "says"), [
    (["policy.megatron_cfg.pipeline_model_parallel_size=2"], "pipeline_model_parallel_size",
     "2 pipeline stages cannot hold the model's 3 layers (evenly"),
    (["policy.megatron_cfg.pipeline_model_parallel_size=2", "policy.megatron_cfg.num_layers_in_first_pipeline_stage=3"],
     "num_layers_in_first_pipeline_stage", "with 3 first and None last"),
])
def test_a_layout_the_layers_cannot_fill_is_refused_at_validation(tmp_path, overrides, key, says):
    from corerl.errors import CorerlError
    from corerl.models.tiny import build_tiny_model
    from corerl_megatron.support import check_supported

    model_dir = str(build_tiny_model(tmp_path / "model", hidden_size=64, num_layers=3))
    recipe = write_recipe(tmp_path / "r.yaml", {"cluster": {"gpus_per_node": 2},
                                                "policy": {"model_name": model_dir, "megatron_cfg": {"enabled": True}}})
    from corerl.config import load_config
    from corerl.plugin_manager import PluginHost

    config = load_config(recipe, overrides, PluginHost())
    with pytest.raises(CorerlError) as refused:
        check_supported(config)
    assert refused.value.key == f"policy.megatron_cfg.{key}" and says in str(refused.value), str(refused.value)
