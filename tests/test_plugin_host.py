"""One plugin host per process, passed explicitly: what a recipe means depends on the host it
is read with, never on a hidden one."""

from __future__ import annotations

import pytest

from corerl.config import config_from_mapping
from corerl.errors import ConfigErrors
from corerl.plugin_manager import PluginHost
from corerl.registry import TrainingBackend
from corerl.testing import plugin_from
from tests.conftest import EXAMPLES

QUICK = TrainingBackend(id="quick", factory="os:getcwd", config_section="policy.quick_cfg",
                        section_aliases=("policy.quick_config",))


def test_section_aliases_come_from_the_host_the_recipe_is_read_with(corerl_host):
    corerl_host.register(plugin_from(training_backends=[QUICK]), name="quick")
    recipe = {"policy": {"model_name": "m", "quick_config": {"enabled": True}}}
    config = config_from_mapping(recipe, corerl_host)
    assert config.section_enabled("policy.quick_cfg")
    with pytest.raises(ConfigErrors, match="policy.quick_config"):  # a host without it does not know the alias
        config_from_mapping(recipe, PluginHost(discover=False, env={}))


def test_a_command_builds_one_plugin_host(monkeypatch, capsys):
    from corerl import cli, plugin_manager

    built = []
    original = PluginHost.__init__

    def counting(self, *args, **kwargs):
        built.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(PluginHost, "__init__", counting)
    plugin_manager.process_host.cache_clear()
    try:
        assert cli.main(["validate", str(EXAMPLES / "demo.yaml"), "policy.dtensor_config.enabled=true"]) == 0
    finally:
        plugin_manager.process_host.cache_clear()
    assert len(built) == 1 and "valid" in capsys.readouterr().out
