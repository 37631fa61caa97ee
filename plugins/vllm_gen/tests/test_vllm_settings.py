"""policy.generation.vllm_cfg: what its check refuses, in one line at the key."""

from __future__ import annotations

import pytest

from corerl.errors import ConfigErrors
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
