"""corerl-plain-gen's own tests, with the fixtures corerl installs (docs/plugins.md, "Testing a plugin")."""

from __future__ import annotations

import corerl_plain_gen.plugin

from corerl.testing import select_for, write_recipe


def test_registers_the_plain_backend(corerl_host):
    corerl_host.register(corerl_plain_gen.plugin, name="plain")
    backend = corerl_host.generation_backends.get("plain")
    assert (backend.plugin, backend.lora) == ("plain", False)


def test_a_recipe_selects_it(corerl_host, tmp_path):
    corerl_host.register(corerl_plain_gen.plugin, name="plain")
    recipe = write_recipe(tmp_path / "recipe.yaml", {"policy": {"model_name": "some/model"}})
    config, selection = select_for(corerl_host, recipe, ["policy.generation.backend=plain"])
    assert selection.generation_backend.id == "plain"
