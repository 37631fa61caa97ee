"""Registers the ``plain`` generation backend. Keep this module light: no torch here."""

from __future__ import annotations

from corerl.sdk import GenerationBackend, hookimpl


@hookimpl
def corerl_register_generation_backends(register):
    register(GenerationBackend(id="plain", factory="corerl_plain_gen.engine:PlainEngine",
                               description="plain transformers decoding, one prompt at a time"))


#: the plugin contract this plugin was written against (docs/plugins.md, "Contract changelog")
corerl_contract = "2.5"
