"""The KV cache of a vLLM engine on CPU: sized for one step's sequences unless the recipe says."""

from __future__ import annotations

from corerl.planning.shape import ModelShape
from corerl.testing import host_with, select_for, write_recipe
from corerl_vllm.engine import cpu_kv_cache_bytes


def _config(tmp_path, **vllm_cfg):
    recipe = write_recipe(tmp_path / "r.yaml", {
        "policy": {"model_name": "builtin:tiny-qwen2", "max_seq_length": 64,
                   "generation": {"backend": "vllm", "vllm_cfg": vllm_cfg}},
        "algorithm": {"name": "grpo", "batch_size": 300, "num_generations_per_prompt": 8}})
    config, _ = select_for(host_with(None, "installed"), recipe, [])
    return config


def test_unset_the_cache_holds_every_sequence_of_a_step_with_a_fifth_spare(tmp_path):
    config = _config(tmp_path)
    shape = ModelShape.of_model("builtin:tiny-qwen2", {})
    needed = 300 * 8 * 64 * shape.kv_bytes_per_token(4)  # the recipe's default precision: float32
    assert needed > 64 * 2**20  # above the floor, so the sizing is what is measured
    assert cpu_kv_cache_bytes(config, 64) == -(-12 * needed // 10)


def test_a_small_step_gets_the_floor_and_a_set_size_wins(tmp_path):
    config = _config(tmp_path)
    assert cpu_kv_cache_bytes(config, 1) == 64 * 2**20
    assert cpu_kv_cache_bytes(_config(tmp_path, cpu_kvcache_space_gib=0.25), 64) == 2**28
