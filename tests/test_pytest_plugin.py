"""corerl's pytest plugin as a third-party package's tests meet it: the ``corerl_host`` fixture
selects a training recipe for a plugin that registers no training backend, and corerl's marks
are registered wherever corerl is installed."""

from __future__ import annotations

import pytest

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
    assert set(corerl_host.plugins) <= {"corerl", "mine", "dtensor", "megatron", "deepspeed", "vllm", "sglang",
                                        "skyrl_gym"}


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


def _dtensor_entry_point():
    from importlib.metadata import entry_points

    (dtensor,) = entry_points(group="corerl.plugins", name="dtensor")
    return dtensor


def _grpo_recipe(tmp_path):
    return write_recipe(tmp_path / "recipe.yaml", {
        "policy": {"model_name": "builtin:tiny-qwen2", "generation": {"backend": "hf"}},
        "algorithm": {"name": "grpo"}, "data": {"reward": "always_one"}})


MINE = plugin_from(rewards=[Reward(id="always_one", factory="corerl.tasks.rewards:exact_answer")])


@pytest.mark.parametrize("how", ["register", "load_plugin"])
def test_a_host_fixture_written_to_contract_2_5_still_works_with_a_deprecation(corerl_host, tmp_path, how):
    # docs/plugins.md at contract 2.5 to 2.9: corerl_host held the core's own plugin alone, so a
    # plugin that trains with dtensor registered the installed dtensor entry point on it, in one of
    # these two ways. corerl_host holds it since 2.10: the same module again is a no-op, with a
    # DeprecationWarning naming what to change (issue 73).
    dtensor = _dtensor_entry_point()
    held = corerl_host.plugins["dtensor"]
    with pytest.warns(DeprecationWarning, match=r"already holds that plugin as 'dtensor'.*remove the call.*3\.0"):
        if how == "register":
            again = corerl_host.register(dtensor.load(), name="dtensor")
        else:
            again = corerl_host.load_plugin("dtensor", dtensor.value)
    assert again is held and held.status == "loaded"
    corerl_host.register(MINE, name="mine")
    config, selection = select_for(corerl_host, _grpo_recipe(tmp_path))
    assert selection.training_backend.id == "dtensor" and selection.reward.id == "always_one"
    assert [item.plugin for item in corerl_host.training_backends if item.id == "dtensor"] == ["dtensor"]


def test_another_plugin_under_a_name_the_host_holds_is_still_refused(corerl_host):
    with pytest.raises(ValueError, match="a plugin named 'dtensor' is already registered"):
        corerl_host.register(MINE, name="dtensor")
    with pytest.raises(ValueError, match="a plugin named 'dtensor' is already registered"):
        corerl_host.load_plugin("dtensor", "corerl.testing.pytest_plugin")
    with pytest.raises(ValueError, match="a plugin named 'corerl' is already registered"):
        corerl_host.register(_dtensor_entry_point().load(), name="corerl")
    assert corerl_host.plugins["dtensor"].module == _dtensor_entry_point().value
