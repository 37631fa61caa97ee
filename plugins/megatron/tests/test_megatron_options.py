"""What the megatron backend cannot run here is refused before any rank starts, in one line
that names the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from corerl.config import load_config
from corerl.errors import ConfigError, EngineNotAvailable
from corerl.testing import host_with, select_for, write_recipe
from corerl_megatron.support import check_supported

GPU_ONLY = ["policy.megatron_cfg.fp8_cfg.enabled=true", "policy.megatron_cfg.optimizer.use_distributed_optimizer=true",
            "policy.megatron_cfg.apply_rope_fusion=true", "policy.megatron_cfg.bias_activation_fusion=true",
            "policy.megatron_cfg.context_parallel_size=2 policy.precision=bfloat16"]
NOT_OFFERED = [
    # packing is run (test_megatron_packing.py); micro-batches of varying shapes are not
    ("policy.dynamic_batching.enabled=true", "policy.dynamic_batching.enabled", "needs one shape for every micro-batch"),
    # a vision-language model trains (test_megatron_vision.py); what it is refused with is in
    # tests/test_validate_matches_run.py
]


def _recipe(tmp_path) -> Path:
    return write_recipe(tmp_path / "r.yaml", {"cluster": {"gpus_per_node": 2},
                                              "policy": {"model_name": "m", "megatron_cfg": {"enabled": True}}})


def _config(tmp_path, override: str):
    config, _ = select_for(host_with(None, "installed"), _recipe(tmp_path), [override])
    return config


@pytest.mark.skipif(torch.cuda.is_available(), reason="these run where a GPU is present")
@pytest.mark.parametrize("override", GPU_ONLY)
def test_gpu_only_options_are_refused_on_a_machine_without_one(tmp_path, override):
    key = override.split("=")[0]  # the option; what follows a space is a setting it needs besides
    with pytest.raises(EngineNotAvailable) as raised:
        check_supported(select_for(host_with(None, "installed"), _recipe(tmp_path), override.split(" "))[0])
    assert raised.value.key == key and "needs a GPU" in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize(("override", "key", "reason"), NOT_OFFERED)
def test_what_the_backend_does_not_offer_is_refused_with_its_reason(tmp_path, override, key, reason):
    with pytest.raises(EngineNotAvailable) as raised:
        check_supported(_config(tmp_path, override))
    assert raised.value.key == key and reason in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize(("override", "key", "reason"), [
    ("policy.lora.enabled=true", "policy.lora.enabled", "policy.lora's adapters run on megatron-core's local layer spec"),
    ("policy.sequence_packing.enabled=true", "policy.sequence_packing.enabled", "packed rows run on megatron-core's "
                                                                                "local layer spec"),
    ("policy.precision=float32", "policy.precision", "flash or fused kernels, which take bfloat16 or float16 only"),
    ("policy.moe.router_replay=r2", "policy.moe.router_replay", "router replay r2 keeps each row's experts"),
])
def test_what_context_parallelism_cannot_run_with_is_refused_on_any_machine(tmp_path, override, key, reason):
    """Refused before the GPU it needs is asked for: a CPU machine does not count such a recipe as GPU-only."""
    config = load_config(_recipe(tmp_path), ["policy.megatron_cfg.context_parallel_size=2", override,
                                             *(["policy.precision=bfloat16"] if "precision" not in override else [])],
                         host_with(None, "installed"))
    with pytest.raises(EngineNotAvailable) as raised:
        check_supported(config)
    line = raised.value.one_line()
    assert raised.value.key == key and reason in line and "context_parallel_size=1" in line and "\n" not in line


def test_megatron_generation_refuses_context_parallelism(tmp_path):
    from corerl_megatron.support import check_generation_supported

    config = load_config(_recipe(tmp_path), ["policy.megatron_cfg.context_parallel_size=2"], host_with(None, "installed"))
    with pytest.raises(EngineNotAvailable) as raised:
        check_generation_supported(config)
    assert raised.value.key == "policy.megatron_cfg.context_parallel_size" and "decodes each row on one rank" in str(
        raised.value)


TAKEN = [
    # (the option, a local model that takes it, one that cannot, what the refusal says)
    ("policy.megatron_cfg.tensor_model_parallel_size=2", "builtin:tiny-qwen2", "builtin:tiny-qwen2-small",
     "cannot split the model's 2 attention heads"),
    ("policy.megatron_cfg.expert_model_parallel_size=2", "builtin:tiny-moe", "builtin:tiny-qwen2",
     "needs a mixture-of-experts model"),
]


@pytest.mark.parametrize(("override", "takes_it", "cannot", "says"), TAKEN)
def test_the_supported_options_pass_and_the_same_value_is_refused_for_a_model_that_cannot_take_it(
        tmp_path, override, takes_it, cannot, says):
    key, value = override.split("=")
    # a model that is not local is not judged here; a local one that takes the value is taken too
    for model in ("m", takes_it):
        config, selection = select_for(host_with(None, "installed"), _recipe(tmp_path), [override, f"policy.model_name={model}"])
        assert getattr(config.section("policy.megatron_cfg"), key.rsplit(".", 1)[1]) == int(value)
        assert check_supported(config) is None and selection.training_backend.id == "megatron", model
    config = load_config(_recipe(tmp_path), [override, f"policy.model_name={cannot}"], host_with(None, "installed"))
    with pytest.raises(ConfigError) as raised:
        check_supported(config)
    assert raised.value.key == key and says in str(raised.value) and "\n" not in str(raised.value)
