"""A mixture-of-experts model under DeepSpeed ZeRO at world size 1 (its experts ordinary
parameters): one step with the router's loss terms equals a plain PyTorch step, the frozen router
(the default) keeps its weights, and the step reports the routers' metrics. ZeRO-2 stands for
ZeRO-1 too (DeepSpeed runs both with one optimizer class); ZeRO-3 partitions the parameters.
Slow tier: each stage is a Ray actor (about 20 s to start on the 2-core machine)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from corerl.config import config_from_mapping
from corerl.plugin_manager import PluginHost
from corerl.selection import select
from corerl.testing.conformance import conformance_batch, conformance_loss
from tests.test_moe_router import reference_router_step


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from corerl.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("moe"), family="qwen3_moe", hidden_size=64, head_dim=32,
                                num_layers=2, num_experts=4, experts_per_token=2, expert_intermediate_size=32,
                                vocab_size=128))


@pytest.mark.parametrize("stage", [2, 3])
def test_a_moe_model_trains_under_zero(stage: int, moe_dir: str, tmp_path: Path) -> None:
    host = PluginHost(env={})
    recipe = {
        "cluster": {"gpus_per_node": 1},
        "policy": {"model_name": moe_dir, "precision": "float32", "train_micro_batch_size": 2, "max_grad_norm": 1.0,
                   "training_backend": "deepspeed", "generation": {"backend": "hf"},
                   "deepspeed_cfg": {"zero_stage": stage}, "optimizer": {"name": "sgd", "lr": 0.5, "momentum": 0.9},
                   "moe": {"load_balancing_type": "aux_loss", "aux_loss_coeff": 0.5, "z_loss_coeff": 0.05}},
        "algorithm": {"max_steps": 4, "seed": 1234},
    }
    config = config_from_mapping(recipe, host)
    backend = select(config, host).training_backend.registration.create(config=config)
    try:
        backend.load_hf(moe_dir)
        batch = conformance_batch(rows=4, length=16, vocab=128)
        result = backend.train_step(batch, conformance_loss)
        trained = dict(backend.weight_stream())
    finally:
        backend.shutdown()
    expected, metrics, policy_loss = reference_router_step(moe_dir, batch, 2, 0.5, 0.05, freeze_router=True)
    assert result.loss == pytest.approx(policy_loss, abs=1e-6)
    compared = [name for name in expected if name in trained]
    assert "model.layers.1.mlp.gate.weight" in compared and "model.layers.0.self_attn.q_proj.weight" in compared
    for name in compared:
        assert torch.allclose(trained[name].float(), expected[name], atol=2e-5), name
    for key, value in metrics.items():
        assert result.metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
