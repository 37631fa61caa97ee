"""A conformance layout's class attributes leave checks out of the collection (corerl's pytest
plugin deselects them: pytest says "N deselected"), not in as skips: a skip is kept for what cannot
run on the machine. Run as a plugin author's project runs it (pytester, in process: no subprocess)."""

from __future__ import annotations

import pytest

# imported here, before pytester's in-process runs (which unload what they import: torch cannot load twice)
import corerl.testing.conformance  # noqa: F401

pytest_plugins = ("pytester",)

LAYOUTS = """
from corerl.testing.conformance import MoeConformance, TrainingBackendConformance


class TestOneRank(TrainingBackendConformance):
    backend_id = "dtensor"
    overrides = ["cluster.gpus_per_node=1"]
    critic_checks = False
    micro_batch_layouts = ("packed",)


class TestTwoRanks(TrainingBackendConformance):
    backend_id = "dtensor"
    overrides = ["cluster.num_nodes=2", "cluster.gpus_per_node=1"]
    algorithm_checks = lora_checks = False

    def test_matches_world_size_1(self):  # the layout's own test of that name: never deselected
        pass


class TestMegatronOneRank(TrainingBackendConformance):
    backend_id = "megatron"
    overrides = ["cluster.gpus_per_node=1", "policy.megatron_cfg.enabled=true"]
    bf16_tolerance = None
    adam_overrides = []
"""

DENSE_ONLY = """
from corerl import TrainingBackend, hookimpl
from corerl.testing.conformance import MoeConformance


class _DenseOnly:
    @hookimpl
    def corerl_register_training_backends(self, register):
        register(TrainingBackend(id="dense-only", factory="builtins:dict", lora=False))


class TestDenseOnlyMoe(MoeConformance):
    backend_id = "dense-only"
    plugin = _DenseOnly()
"""

#: what each layout above does not run, by its flags (and registration)
DESELECTED = {
    "TestOneRank": {"test_matches_world_size_1", "test_token_budget_micro_batches_match_unpadded[dynamic]",
                    "test_critic_values_match_transformers", "test_critic_step_matches_plain_pytorch",
                    "test_critic_save_load_continue_equals_uninterrupted", "test_critic_export_loads_as_a_value_model"},
    "TestTwoRanks": {"test_adam_state_survives_save_and_load", "test_bfloat16_logprobs_are_close_to_float32",
                     "test_grpo_loss_variants_match_plain_pytorch[cispo]",
                     "test_grpo_loss_variants_match_plain_pytorch[dr_grpo]",
                     "test_topk_distillation_matches_plain_pytorch", "test_lora_step_matches_plain_peft"},
    # megatron's one-rank class leaves its LoRA checks to test_megatron_lora (lora_checks False)
    "TestMegatronOneRank": {"test_matches_world_size_1", "test_adam_state_survives_save_and_load",
                            "test_bfloat16_logprobs_are_close_to_float32"},
    "TestDenseOnlyMoe": {"test_moe_logprobs_match_transformers", "test_moe_step_with_router_terms_matches_plain_pytorch",
                         "test_moe_step_reports_the_routers_metrics",
                         "test_moe_weight_stream_and_export_load_into_transformers",
                         "test_moe_save_load_continue_equals_uninterrupted"},
}


def _ids(result: pytest.RunResult) -> set[str]:
    return {line.split("::", 1)[1] for line in result.outlines if line.startswith("test_layouts.py::")}


@pytest.fixture
def layouts(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_layouts=LAYOUTS + DENSE_ONLY.replace(
        "from corerl.testing.conformance import MoeConformance\n", ""))
    return pytester


def _all_ids(pytester: pytest.Pytester) -> set[str]:
    everything = pytester.runpytest_inprocess("--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:corerl")
    return _ids(everything)


def test_the_checks_a_layout_does_not_run_are_deselected_with_their_reasons(layouts: pytest.Pytester) -> None:
    every = _all_ids(layouts)
    result = layouts.runpytest_inprocess("--collect-only", "-q", "-p", "no:cacheprovider")
    expected = {f"{cls}::{test}" for cls, tests in DESELECTED.items() for test in tests}
    assert expected <= every
    assert every - _ids(result) == expected
    assert f"({len(expected)} deselected)" in result.stdout.str()
    assert "TestTwoRanks::test_matches_world_size_1" in _ids(result)  # redefined by the layout: kept
    assert "TestMegatronOneRank::test_lora_step_matches_plain_peft" in _ids(result)  # the refusal check: kept

    verbose = layouts.runpytest_inprocess("--collect-only", "-v", "-p", "no:cacheprovider")
    lines = verbose.stdout.str()
    assert "conformance checks not run by their layout (deselected)" in lines
    assert ("test_layouts.py::TestTwoRanks::test_adam_state_survives_save_and_load: (d)'s Adam variant runs in "
            "world-size-1 layouts with adam_overrides (world size 2 here)") in lines
    assert ("test_layouts.py::TestOneRank::test_critic_step_matches_plain_pytorch: the critic is checked in this "
            "backend's other layouts (critic_checks = False)") in lines


def test_without_corerls_plugin_the_same_checks_skip_saying_why(layouts: pytest.Pytester) -> None:
    """``-p no:corerl`` (the entry point not loaded): the checks a layout leaves out skip, with the
    reason deselection gives, before any engine is built."""
    result = layouts.runpytest_inprocess("-p", "no:corerl", "-p", "no:cacheprovider", "-rs", "-k",
                                         "TestTwoRanks and (adam or bfloat16) or TestOneRank and dynamic")
    result.assert_outcomes(skipped=3)
    text = result.stdout.str()
    assert "(d)'s Adam variant runs in world-size-1 layouts with adam_overrides (world size 2 here)" in text
    assert "dtensor does not run the dynamic layout here (micro_batch_layouts)" in text
