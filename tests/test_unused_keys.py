"""Keys only another backend reads (its section, or keys it owns outside it, such as the hf
backend's ``policy.generation.hf_kv_cache``) are warned about in one line naming the key and the
backend that takes it; the chosen backend's own keys, a training section that says ``enabled``
and a NeMo RL recipe's keys (its dialect reports their fates) are not."""

from __future__ import annotations

import pytest

from corerl.testing import select_for
from tests.conftest import REPO

DEMO = REPO / "examples" / "configs" / "demo.yaml"


@pytest.mark.parametrize(("overrides", "warned"), [
    (["policy.generation.backend=vllm", "policy.generation.hf_kv_cache=static"],
     "policy.generation.hf_kv_cache does nothing here: only generation backend 'hf' reads it, and the generation "
     "backend is 'vllm' (override 'policy.generation.hf_kv_cache=static')"),
    (["policy.generation.backend=hf", "policy.generation.vllm_cfg.enforce_eager=true",
      "policy.generation.vllm_cfg.gpu_memory_utilization=0.5"],
     "policy.generation.vllm_cfg.enforce_eager and 1 more key(s) there do nothing here: only generation backend "
     "'vllm' reads them, and the generation backend is 'hf'"),
    (["policy.training_backend=dtensor", "policy.deepspeed_cfg.zero_stage=3"],
     "policy.deepspeed_cfg.zero_stage does nothing here: only training backend 'deepspeed' reads it, and the "
     "training backend is 'dtensor'"),
], ids=["hf's key with vllm", "vllm's section with hf", "deepspeed's section with dtensor"])
def test_another_backends_keys_are_warned_about(corerl_host, overrides, warned):
    _, selection = select_for(corerl_host, DEMO, overrides)
    assert [w for w in selection.warnings if "nothing here: only" in w] == [next(
        w for w in selection.warnings if w.startswith(warned))]


@pytest.mark.parametrize("overrides", [
    ["policy.generation.backend=hf", "policy.generation.hf_kv_cache=static"],
    ["policy.generation.backend=vllm", "policy.generation.vllm_cfg.enforce_eager=true"],
    ["policy.deepspeed_cfg.enabled=false", "policy.deepspeed_cfg.zero_stage=3"],
], ids=["hf's own key", "vllm's own section", "a section that says enabled"])
def test_keys_in_use_or_switched_off_are_not(corerl_host, overrides):
    _, selection = select_for(corerl_host, DEMO, overrides)
    assert not [w for w in selection.warnings if "nothing here: only" in w]


def test_a_nemo_rl_recipe_is_left_to_its_dialect(corerl_host):
    _, selection = select_for(corerl_host, REPO / "tests" / "data" / "nemo_rl" / "base_grpo.yaml",
                              ["policy.generation.hf_kv_cache=static"])
    assert not [w for w in selection.warnings if "nothing here: only" in w]
