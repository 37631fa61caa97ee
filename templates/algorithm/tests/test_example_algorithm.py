"""The template algorithm's own tests, written the way a third-party author would write them: its
registration and section, its support check, and corerl's algorithm conformance suite."""

from __future__ import annotations

import corerl_example_algorithm.plugin
import pytest

from corerl.sdk import ConfigError, ConfigErrors
from corerl.testing import select_for, write_recipe
from corerl.testing.algorithm_conformance import AlgorithmConformance

RECIPE = {"cluster": {"gpus_per_node": 1}, "policy": {"model_name": "builtin:tiny-qwen2"},
          "algorithm": {"name": "example_reinforce"}}


def test_registers_the_algorithm_with_its_section(corerl_host):
    corerl_host.register(corerl_example_algorithm.plugin, name="example_algorithm")
    algorithm = corerl_host.algorithms.get("example_reinforce")
    assert algorithm is not None and algorithm.plugin == "example_algorithm"
    assert (algorithm.config_section, algorithm.environments, algorithm.generation) == (
        "algorithm.example_reinforce", True, True)


def test_its_section_is_validated_and_its_check_refuses_in_one_line(corerl_host, tmp_path):
    corerl_host.register(corerl_example_algorithm.plugin, name="example_algorithm")
    recipe = write_recipe(tmp_path / "recipe.yaml", RECIPE)
    config, selection = select_for(corerl_host, recipe, ["algorithm.example_reinforce.baseline_momentum=0.5"])
    assert selection.algorithm.id == "example_reinforce"
    assert config.section("algorithm.example_reinforce").baseline_momentum == 0.5
    with pytest.raises(ConfigErrors) as wrong:
        select_for(corerl_host, recipe, ["algorithm.example_reinforce.baseline=median"])
    assert [e.key for e in wrong.value.errors] == ["algorithm.example_reinforce.baseline"]
    with pytest.raises(ConfigError) as refused:
        select_for(corerl_host, recipe, ["algorithm.example_reinforce.baseline=group_mean",
                                         "algorithm.num_generations_per_prompt=1"])
    assert refused.value.key == "algorithm.num_generations_per_prompt"
    assert "\n" not in str(refused.value)


class TestExampleAlgorithmConformance(AlgorithmConformance):
    """corerl's algorithm conformance suite, in process on the built-in tiny model (one class per
    setting worth its few seconds: a subclass with another ``recipe``)."""

    algorithm_id = "example_reinforce"
    plugin = corerl_example_algorithm.plugin
    recipe = {"algorithm": {"example_reinforce": {"baseline": "running_mean", "baseline_momentum": 0.5}}}
