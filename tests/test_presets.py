"""Presets: recipe fragments from Python, in `defaults:`, and as `--preset` on the command line."""

from __future__ import annotations

import pytest

import corerl
from corerl.config import load_config
from corerl.config.selection import select
from corerl.errors import ConfigError
from corerl.plugin_manager import PluginHost
from tests.conftest import EXAMPLES, run_corerl


@pytest.fixture(scope="module")
def host() -> PluginHost:
    return PluginHost(env={})


EXPECTED = {"fsdp": "dtensor", "zero2": "deepspeed", "zero3": "deepspeed", "zero3_offload": "deepspeed",
            "megatron_tp": "megatron"}


def test_presets_come_from_python_as_fresh_dicts():
    assert set(corerl.config.presets.names()) == set(EXPECTED)
    zero3 = corerl.config.presets.get("zero3")
    assert zero3["policy"]["deepspeed_cfg"]["zero_stage"] == 3
    zero3["policy"]["deepspeed_cfg"]["zero_stage"] = 1
    assert corerl.config.presets.get("zero3")["policy"]["deepspeed_cfg"]["zero_stage"] == 3
    assert corerl.config.presets.get_default_fsdp_preset()["policy"]["dtensor_cfg"]["fsdp_version"] == 2
    with pytest.raises(ConfigError, match="no preset named 'zero9'; presets: fsdp"):
        corerl.config.presets.path_of("zero9")


@pytest.mark.parametrize(("name", "backend"), sorted(EXPECTED.items()))
def test_every_preset_selects_its_backend_over_a_recipe(host, name, backend):
    # the megatron recipe enables megatron (priority 300): a preset still decides the backend
    # (megatron_tp's sequence parallelism is refused on a machine without a GPU: off here)
    off = ["policy.megatron_cfg.sequence_parallel=false"] if name == "megatron_tp" else []
    config = load_config(EXAMPLES / "grpo_megatron.yaml", off, host, presets=[name])
    assert select(config, host).training_backend.id == backend


def test_a_recipe_names_a_preset_in_defaults_and_overrides_win_over_presets(tmp_path, host):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("defaults: preset:zero2\npolicy: {model_name: m}\n", encoding="utf-8")
    config = load_config(recipe, [], host)
    assert config.section("policy.deepspeed_cfg").zero_stage == 2
    config = load_config(recipe, ["policy.deepspeed_cfg.zero_stage=1"], host, presets=["zero3"])
    assert config.section("policy.deepspeed_cfg").zero_stage == 1
    recipe.write_text("defaults: preset:zero9\npolicy: {model_name: m}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="defaults: no preset named 'zero9'"):
        load_config(recipe, [], host)


def test_the_command_line_takes_presets_and_refuses_unknown_ones():
    result = run_corerl("validate", str(EXAMPLES / "demo.yaml"), "--preset", "zero3", "--json")
    assert result.code == 0, result
    assert result.json()["training_backend"]["id"] == "deepspeed"
    result = run_corerl("validate", str(EXAMPLES / "demo.yaml"), "--preset", "zero9")
    assert result.code == 2 and "--preset: no preset named 'zero9'" in result.err
