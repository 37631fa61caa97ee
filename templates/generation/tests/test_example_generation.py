"""The template generation backend's own tests, written the way a third-party author would write
them: its registration, a recipe choosing it, and corerl's generation conformance suite."""

from __future__ import annotations

import corerl_example_generation.plugin

from corerl.testing import select_for, write_recipe
from corerl.testing.generation_conformance import GenerationBackendConformance


def test_registers_the_generation_backend(corerl_host):
    corerl_host.register(corerl_example_generation.plugin, name="example_generation")
    backend = corerl_host.generation_backends.get("example_sampler")
    assert backend is not None and backend.plugin == "example_generation"
    assert (backend.lora, backend.moe) == (False, False)


def test_a_recipe_naming_it_selects_it(corerl_host, tmp_path):
    corerl_host.register(corerl_example_generation.plugin, name="example_generation")
    recipe = write_recipe(tmp_path / "recipe.yaml", {"policy": {"model_name": "builtin:tiny-qwen2"}})
    _, selection = select_for(corerl_host, recipe, ["policy.generation.backend=example_sampler"])
    assert selection.generation_backend.id == "example_sampler"
    _, selection = select_for(corerl_host, recipe)
    assert selection.generation_backend.id != "example_sampler"  # priority -10: never chosen unasked


class TestExampleSamplerConformance(GenerationBackendConformance):
    """corerl's generation conformance suite, in process on tiny models built in code."""

    backend_id = "example_sampler"
    plugin = corerl_example_generation.plugin
