"""Registers the ``example_sampler`` generation backend. Light: the sampler's module (and torch)
is imported only when a run builds the engine."""

from __future__ import annotations

from collections.abc import Callable

from corerl.sdk import GenerationBackend, hookimpl


@hookimpl
def corerl_register_generation_backends(register: Callable[[GenerationBackend], None]) -> None:
    # priority 0 or below: chosen only where a recipe names it (policy.generation.backend=example_sampler);
    # without lora=True a LoRA recipe is refused with policy.lora.enabled, and without moe=True a
    # mixture-of-experts model is refused
    register(GenerationBackend(id="example_sampler", factory="corerl_example_generation.sampler:ExampleSampler",
                               priority=-10, description="a sampling loop on its own copy of the model (template)"))


#: the plugin contract this plugin was written against (docs/plugins.md, "Contract changelog")
corerl_contract = "2.18"
