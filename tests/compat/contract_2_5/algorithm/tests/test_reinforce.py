"""corerl-reinforce's tests, with the fixtures corerl installs (docs/plugins.md, "Testing a plugin")."""

from __future__ import annotations

from importlib.metadata import entry_points

import corerl_reinforce.plugin
import pytest

from corerl.sdk import ConfigError, ConfigErrors
from corerl.testing import select_for, write_recipe


@pytest.fixture
def host(corerl_host):
    # corerl_host holds only the core's own plugin: REINFORCE trains with dtensor, so register
    # the installed dtensor plugin too, then ours
    (dtensor,) = entry_points(group="corerl.plugins", name="dtensor")
    corerl_host.register(dtensor.load(), name="dtensor")
    corerl_host.register(corerl_reinforce.plugin, name="reinforce")
    return corerl_host


@pytest.fixture
def recipe(tmp_path):
    return write_recipe(tmp_path / "recipe.yaml", {
        "cluster": {"gpus_per_node": 1},
        "policy": {"model_name": "builtin:tiny-qwen2", "generation": {"backend": "hf", "max_new_tokens": 4},
                   "max_seq_length": 64},
        "algorithm": {"name": "reinforce", "batch_size": 16, "num_generations_per_prompt": 1, "max_steps": 8},
        "data": {"task": "digit_echo"},
    })


def test_registers_reinforce(host):
    algorithm = host.algorithms.get("reinforce")
    assert (algorithm.plugin, algorithm.config_section) == ("reinforce", "algorithm.reinforce")


def test_selected_by_algorithm_name_with_its_section(host, recipe):
    config, selection = select_for(host, recipe, ["algorithm.reinforce.baseline_momentum=0.5"])
    assert selection.algorithm.id == "reinforce" and selection.training_backend.id == "dtensor"
    assert selection.generation_backend.id == "hf"
    assert config.section("algorithm.reinforce").baseline_momentum == 0.5
    assert config.section("algorithm.reinforce").initial_baseline == 0.0


def test_its_section_is_validated_by_its_schema(host, recipe):
    with pytest.raises(ConfigErrors) as refused:
        select_for(host, recipe, ["algorithm.reinforce.baseline_momentum=2.0"])
    assert [error.key for error in refused.value.errors] == ["algorithm.reinforce.baseline_momentum"]


def test_its_own_check_refuses_groups(host, recipe):
    with pytest.raises(ConfigError, match="REINFORCE samples one completion per prompt"):
        select_for(host, recipe, ["algorithm.num_generations_per_prompt=2"])
