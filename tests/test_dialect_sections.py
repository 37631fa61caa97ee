"""A dialect's engine sections come from the plugins that register the engines
(``corerl_register_dialect_sections``): the template backend takes its own section's keys from a
NeMo RL recipe, and a first-party engine's section whose plugin is not there is reported with the
line that installs (or enables) it."""

from __future__ import annotations

from importlib import metadata

import pytest

from corerl.config import validate_tree
from corerl.config.dialects import nemo_rl
from corerl.config.selection import select_training_backend
from corerl.errors import ConfigErrors, SelectionError
from corerl.plugin_manager import ENTRY_POINT_GROUP, PluginHost
from corerl.testing.pytest_plugin import first_party_host
from tests.conftest import REPO
from tests.refusals import refused_in_one_line


def _recipe(**policy):
    """A NeMo RL GRPO recipe on two GPUs with ``policy``'s sections laid over its dtensor and
    megatron sections (both off)."""
    return {"grpo": {"num_prompts_per_step": 2, "num_generations_per_prompt": 2, "max_num_steps": 3},
            "cluster": {"gpus_per_node": 2},
            "policy": {"model_name": "builtin:tiny-qwen2", "dtensor_cfg": {"enabled": False, "tensor_parallel_size": 1},
                       "megatron_cfg": {"enabled": False, "tensor_model_parallel_size": 4}, **policy}}


def _fates(translation):
    return {fate.key: (fate.fate, fate.detail) for fate in translation.fates}


@pytest.fixture
def with_template():
    import corerl_example.plugin

    host = first_party_host()
    host.register(corerl_example.plugin, name="example")
    return host


def test_the_first_party_engines_register_their_sections_of_the_nemo_rl_dialect():
    host = first_party_host()
    sections = {r.id: (r.plugin, r.backend, r.sections) for r in host.dialect_sections}
    assert sections["nemo-rl.megatron"][:2] == ("megatron", "megatron")
    assert sections["nemo-rl.dtensor"] == ("dtensor", "dtensor", ("policy.dtensor_cfg", "value.dtensor_cfg"))
    assert sections["nemo-rl.vllm"][:2] == ("vllm", "vllm")
    # the engine's rules are in force through its plugin; the core's own table holds none of them
    assert nemo_rl.rule_for("policy.megatron_cfg.freeze_moe_router", host).target == "policy.moe.freeze_router"
    assert not any(key.startswith(("policy.megatron_cfg", "policy.dtensor_cfg", "policy.generation.vllm_cfg"))
                   for key in nemo_rl.RULES)


def test_the_template_backend_takes_its_own_section_from_a_nemo_rl_recipe(with_template):
    raw = _recipe(example_cfg={"enabled": True, "num_shards": 2, "fused_kernels": True})
    translation = nemo_rl.translate(raw, {}, host=with_template)
    fates = _fates(translation)
    assert fates["policy.example_cfg.num_shards"] == ("acts", "policy.example_cfg.shards")
    assert fates["policy.example_cfg.fused_kernels"][0] == "inert"
    config = validate_tree(translation.tree, translation.origins, with_template, "recipe.yaml")
    assert config.section("policy.example_cfg").shards == 2  # the recipe's num_shards, in force
    choice, _ = select_training_backend(config, with_template)
    assert choice.id == "example"

    # the backend's own check judges the translated key
    raw = _recipe(example_cfg={"enabled": True, "num_shards": 3})
    translation = nemo_rl.translate(raw, {}, host=with_template)
    with pytest.raises(ConfigErrors) as refused:
        validate_tree(translation.tree, translation.origins, with_template, "recipe.yaml")
    assert any(e.key == "policy.example_cfg.shards" and "must divide the world size (2), got 3" in e.message
               for e in refused.value.errors)

    # switched off, the section is inert as a whole, as NeMo RL's own engine sections are
    translation = nemo_rl.translate(_recipe(example_cfg={"enabled": False, "num_shards": 3}), {}, host=with_template)
    assert _fates(translation)["policy.example_cfg.num_shards"] == ("inert", "policy.example_cfg.enabled is false")


def test_without_the_template_its_nemo_rl_spelling_is_not_translated():
    raw = _recipe(example_cfg={"enabled": True, "num_shards": 2})
    translation = nemo_rl.translate(raw, {}, host=first_party_host())
    assert "policy.example_cfg.num_shards" in translation.passthrough  # left to validation, which knows no such key


def _host_without(name: str) -> PluginHost:
    """The first-party plugins installed here but ``name``: as if it were not installed."""
    host = PluginHost(discover=False, env={})
    for entry in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        if entry.name in ("dtensor", "deepspeed", "vllm", "megatron") and entry.name != name:
            host.load_plugin(entry.name, entry.value, distribution=entry.dist.name if entry.dist else None)
    return host


def test_an_engine_section_whose_plugin_is_not_installed_names_the_line_that_installs_it():
    host = _host_without("megatron")
    raw = _recipe(megatron_cfg={"enabled": True, "tensor_model_parallel_size": 4, "moe_permute_fusion": True})
    translation = nemo_rl.translate(raw, {}, host=host)
    fates = _fates(translation)
    for key in ("policy.megatron_cfg.tensor_model_parallel_size", "policy.megatron_cfg.moe_permute_fusion"):
        fate, why = fates[key]
        assert fate == "inert" and "'megatron' (corerl-megatron) is not installed" in why
        assert "pip install ./plugins/megatron" in why
    config = validate_tree(translation.tree, translation.origins, host, "recipe.yaml")
    with pytest.raises(SelectionError) as refused:  # its enabled is judged as any backend's switch
        select_training_backend(config, host)
    assert refused.value.key == "policy.megatron_cfg.enabled"
    assert refused.value.hint == "install it with: pip install ./plugins/megatron"

    # switched off, the section is inert, as with the plugin installed
    translation = nemo_rl.translate(_recipe(), {}, host=host)
    assert _fates(translation)["policy.megatron_cfg.tensor_model_parallel_size"] == (
        "inert", "policy.megatron_cfg.enabled is false")


def test_a_nemo_rl_recipe_enabling_a_disabled_engine_is_refused_in_one_line(capsys, monkeypatch):
    from corerl import cli, plugin_manager

    host = PluginHost(env={"CORERL_DISABLE_PLUGINS": "megatron"})  # the command's host, as CORERL_* makes it
    monkeypatch.setattr(plugin_manager, "process_host", lambda: host)
    code = cli.main(["validate", str(REPO / "tests" / "data" / "nemo_rl" / "base_grpo.yaml"),
                     "policy.megatron_cfg.enabled=true", "policy.dtensor_cfg.enabled=false"])
    refused_in_one_line((code, capsys.readouterr().err), "training backend 'megatron' is not available",
                        "CORERL_DISABLE_PLUGINS", key="policy.megatron_cfg.enabled")
