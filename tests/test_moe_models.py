"""Mixture-of-experts models as validation sees them: the facts read once from ``config.json``
(without torch), the tiny MoE families built in code, and the registrations' side (a backend
that does not say ``moe=True`` is refused for a MoE policy, in one line)."""

from __future__ import annotations

import pytest

from corerl import GenerationBackend, TrainingBackend, hookimpl
from corerl.config import config_from_mapping
from corerl.config.selection import select
from corerl.errors import CorerlError
from corerl.models.tiny import build_tiny_model
from corerl.planning.shape import ModelShape
from corerl.plugin_manager import PluginHost


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_the_shape_counts_a_tiny_moe_exactly_and_its_active_parameters(tmp_path, family):
    from transformers import AutoModelForCausalLM

    folder = build_tiny_model(tmp_path / family, family=family, hidden_size=64, head_dim=32, num_experts=4,
                              experts_per_token=2, expert_intermediate_size=48)
    model = AutoModelForCausalLM.from_pretrained(folder)
    shape = ModelShape.from_folder(folder)
    assert (shape.experts, shape.experts_per_token, shape.moe_layers, shape.is_moe) == (4, 2, 2, True)
    assert shape.parameters == sum(p.numel() for p in model.parameters())
    expert = 3 * 64 * 48
    assert shape.parameters - shape.active_parameters == 2 * (4 - 2) * expert  # the idle experts of 2 layers
    assert shape.mlp_split(2) == pytest.approx(shape.mlp - 4 * expert / 2)  # half of each layer's experts


def test_dense_and_sparse_layers_of_qwen_moe_are_told_apart():
    config = {"model_type": "qwen3_moe", "hidden_size": 8, "num_hidden_layers": 4, "num_attention_heads": 2,
              "intermediate_size": 16, "vocab_size": 10, "num_experts": 4, "num_experts_per_tok": 1,
              "moe_intermediate_size": 4, "decoder_sparse_step": 1, "mlp_only_layers": [0]}
    shape = ModelShape.from_hf_config(config)
    assert shape.moe_layers == 3 and shape.expert_intermediate == 4
    dense = ModelShape.from_hf_config({**config, "num_experts": 0})
    assert not dense.is_moe and dense.mlp == 3 * 8 * 16


def test_the_builtin_moe_is_described_from_its_spec_without_building_it():
    shape = ModelShape.of_model("builtin:tiny-moe")
    assert (shape.experts, shape.experts_per_token, shape.head_dim) == (8, 2, 64)
    assert "8 experts, top-2" in shape.describe()


class _DensePlugin:
    """A third-party backend pair written before contract 2.7: neither says ``moe=True``."""

    @hookimpl
    def corerl_register_training_backends(self, register):
        register(TrainingBackend(id="dense-only", factory="builtins:dict", description="dense models only"))

    @hookimpl
    def corerl_register_generation_backends(self, register):
        register(GenerationBackend(id="dense-gen", factory="builtins:dict", description="dense models only"))


@pytest.mark.parametrize("side", ["training", "generation"])
def test_a_backend_that_does_not_say_moe_is_refused_for_a_moe_policy_in_one_line(side):
    host = PluginHost()
    host.register(_DensePlugin(), name="dense-plugin")
    recipe = {"policy": {"model_name": "builtin:tiny-moe", "generation": {"backend": "hf"}},
              "algorithm": {"name": "grpo"}, "data": {"task": "digit_echo"}}
    if side == "training":
        recipe["policy"]["training_backend"] = "dense-only"
    else:
        recipe["policy"]["generation"]["backend"] = "dense-gen"
    with pytest.raises(CorerlError) as caught:
        select(config_from_mapping(recipe, host), host)
    message = str(caught.value).strip()
    assert len(message.splitlines()) == 1 and "mixture-of-experts model (8 experts)" in message
    assert ("'dense-only'" if side == "training" else "'dense-gen'") in message and "moe=True" in message
    recipe["policy"]["model_name"] = "builtin:tiny-qwen2"  # a dense policy: taken as before
    selection = select(config_from_mapping(recipe, host), host)
    assert "dense" in (selection.training_backend.id if side == "training" else selection.generation_backend.id)


def test_the_moe_demo_trains_the_tiny_moe_with_its_experts_split_over_two_ranks():
    """The recipe of examples/configs/grpo_moe_demo.yaml as validation sees it (its run, 0.0 -> 1.0
    held-out reward in 90 s on 2 CPU cores, is in docs/moe.md)."""
    from corerl.config import load_config
    from tests.conftest import EXAMPLES

    host = PluginHost(env={})
    config = load_config(EXAMPLES / "grpo_moe_demo.yaml", [], host)
    selection = select(config, host)
    assert selection.training_backend.id == "dtensor"
    assert config.section("policy.dtensor_cfg").expert_parallel_size == 2 and config.core.cluster.world_size == 2
    assert ModelShape.of_model(config.core.policy.model_name).experts == 8
    assert config.core.policy.moe.freeze_router is True
