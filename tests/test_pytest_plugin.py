"""corerl's pytest plugin as a third-party package's tests meet it: the ``corerl_host`` fixture
selects a training recipe for a plugin that registers no training backend, and corerl's marks
are registered wherever corerl is installed."""

from __future__ import annotations

from corerl.registry import Reward
from corerl.testing import plugin_from, select_for, write_recipe
from corerl.testing.pytest_plugin import MARKS

pytest_plugins = ("pytester",)


def test_a_plugin_without_a_training_backend_selects_a_grpo_recipe_with_the_first_party_ones(corerl_host, tmp_path):
    corerl_host.register(plugin_from(rewards=[Reward(id="always_one", factory="corerl.tasks.rewards:exact_answer")]),
                         name="mine")
    recipe = write_recipe(tmp_path / "recipe.yaml", {
        "policy": {"model_name": "builtin:tiny-qwen2", "training_backend": "dtensor",
                   "generation": {"backend": "hf"}},
        "algorithm": {"name": "grpo"}, "data": {"reward": "always_one"}})
    config, selection = select_for(corerl_host, recipe)
    assert selection.algorithm.id == "grpo" and selection.training_backend.id == "dtensor"
    assert selection.reward.id == "always_one"
    assert set(corerl_host.plugins) <= {"corerl", "mine", "dtensor", "megatron", "deepspeed", "vllm"}


def test_corerls_marks_are_registered_by_the_plugin(request):
    markers = request.config.getini("markers")
    for name, meaning in MARKS.items():
        assert f"{name}: {meaning}" in markers


def test_a_third_party_package_using_corerls_marks_gets_no_unknown_mark_warning(pytester):
    pytester.makepyfile(test_marked="""
        import pytest

        @pytest.mark.slow
        def test_slow():
            pass

        @pytest.mark.gpu
        def test_gpu():
            pass
    """)
    result = pytester.runpytest_inprocess("-W", "error::pytest.PytestUnknownMarkWarning", "--strict-markers",
                                          "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    assert "PytestUnknownMarkWarning" not in result.stdout.str()
