"""The template's own tests, written the way a third-party author would write them."""

from __future__ import annotations

import pytest

import corerl_example.plugin
from corerl.sdk import ConfigErrors
from corerl.testing import select_for, write_recipe

RECIPE = {"cluster": {"gpus_per_node": 2}, "policy": {"model_name": "some/model"}}
SINGLE = {"cluster": {"gpus_per_node": 1}, "policy": {"model_name": "some/model"}}


def test_registers_the_example_backend(corerl_host):
    corerl_host.register(corerl_example.plugin, name="example")
    backend = corerl_host.training_backends.get("example")
    assert backend is not None
    assert (backend.priority, backend.config_section, backend.plugin) == (50, "policy.example_cfg", "example")


def test_selected_when_its_section_is_enabled(corerl_host, tmp_path):
    corerl_host.register(corerl_example.plugin, name="example")
    recipe = write_recipe(tmp_path / "recipe.yaml", RECIPE)
    config, selection = select_for(corerl_host, recipe, ["policy.example_cfg.enabled=true"])
    assert selection.training_backend.id == "example"
    assert config.section("policy.example_cfg").shards == 1


@pytest.mark.parametrize(
    ("override", "key", "words"),
    [
        ("policy.example_cfg.shards=3", "policy.example_cfg.shards", "must divide the world size (2)"),
        ("policy.example_cfg.shards=0", "policy.example_cfg.shards", "must be at least 1"),
        ("policy.example_cfg.shardz=1", "policy.example_cfg.shardz", "did you mean policy.example_cfg.shards?"),
    ],
)
def test_section_is_validated_by_its_schema(corerl_host, tmp_path, override, key, words):
    corerl_host.register(corerl_example.plugin, name="example")
    recipe = write_recipe(tmp_path / "recipe.yaml", RECIPE)
    with pytest.raises(ConfigErrors) as caught:
        select_for(corerl_host, recipe, [override])
    (error,) = caught.value.errors
    assert error.key == key
    assert words in error.one_line()


def test_factory_builds_the_backend(corerl_host, tmp_path):
    corerl_host.register(corerl_example.plugin, name="example")
    recipe = write_recipe(tmp_path / "recipe.yaml", SINGLE)
    config, selection = select_for(corerl_host, recipe, ["policy.example_cfg.enabled=true"])
    backend = selection.training_backend.registration.create(config=config)
    assert backend.settings.enabled is True
    assert type(backend).__name__ == "ExampleBackend"
