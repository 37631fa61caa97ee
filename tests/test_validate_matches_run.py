"""One validation phase: every refusal a backend makes at start-up is made by `corerl validate`
too (selection calls each registration's ``check_supported``), with the same exit status and
the same line as `corerl run`."""

from __future__ import annotations

import re

import pytest

from tests.conftest import REPO, run_corerl

MEGATRON = ["policy.megatron_cfg.enabled=true"]
DEEPSPEED = ["policy.deepspeed_cfg.enabled=true"]
# plugin -> the overrides that reach each `raise` of its support.check_supported, in order
REFUSALS = {
    "dtensor": [
        ["policy.dtensor_cfg.context_parallel_size=2"],
        ["policy.dtensor_cfg.sequence_parallel=true", "policy.dtensor_cfg.custom_parallel_plan=my.plans:plan"],
        ["policy.dtensor_cfg.fsdp_version=1", "policy.dtensor_cfg.tensor_parallel_size=2", "cluster.gpus_per_node=2"],
        ["policy.precision=float16"],
    ],
    "megatron": [
        [*MEGATRON, "policy.megatron_cfg.apply_rope_fusion=true"],
        [*MEGATRON, "policy.sequence_packing.enabled=true"],
        [*MEGATRON, "algorithm.name=ppo", "policy.megatron_cfg.tensor_model_parallel_size=2",
         "policy.megatron_cfg.sequence_parallel=true", "cluster.gpus_per_node=2"],
        [*MEGATRON, "policy.megatron_cfg.context_parallel_size=2", "cluster.gpus_per_node=2"],
        [*MEGATRON, "policy.megatron_cfg.expert_model_parallel_size=2", "cluster.gpus_per_node=2"],
    ],
    "deepspeed": [
        [*DEEPSPEED, "policy.precision=float16"],
        [*DEEPSPEED, "policy.deepspeed_cfg.offload_optimizer=nvme"],
    ],
}
CASES = [(plugin, overrides) for plugin, cases in REFUSALS.items() for overrides in cases]


def test_every_refusal_of_each_backend_has_a_case():
    for plugin, cases in REFUSALS.items():
        source = (REPO / "plugins" / plugin / "src" / f"corerl_{plugin}" / "support.py").read_text()
        assert len(re.findall(r"^\s+raise ", source, flags=re.MULTILINE)) == len(cases), plugin


@pytest.mark.slow
@pytest.mark.parametrize("plugin, overrides", CASES, ids=[" ".join(o) for _, o in CASES])
def test_validate_refuses_what_run_refuses_at_start_up(tmp_path, plugin, overrides):
    validate = run_corerl("validate", "core/src/corerl/recipes/demo.yaml", *overrides, "policy.generation.backend=hf")
    run = run_corerl("run", *overrides, f"run.output_dir={tmp_path}", "policy.generation.backend=hf")
    assert validate.code in (1, 2) and validate.code == run.code, (validate, run)
    (said,) = validate.err.strip().splitlines()
    assert run.err.strip().splitlines() == [said], (validate, run)
    assert "Traceback" not in validate.err + run.err and list(tmp_path.iterdir()) == []
