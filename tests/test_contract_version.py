"""The versioned plugin contract: a plugin states the contract version it was written against;
one outside what this corerl offers is refused in one line naming both versions and the plugin,
and one that states none still loads, with a notice saying what to add."""

from __future__ import annotations

import pytest

from corerl.hookspecs import CONTRACT_VERSION
from corerl.plugin_manager import PluginHost
from tests.test_plugin_loading import add_plugin, plugin_source

MAJOR, MINOR = (int(part) for part in CONTRACT_VERSION.split("."))


def _host_with(fake_site, stated: str | None) -> PluginHost:
    source = plugin_source("rocket", priority=400)
    if stated is not None:
        source += f"\ncorerl_contract = {stated!r}\n"
    add_plugin(fake_site, "rocket", source)
    return PluginHost(env={})


def test_a_plugin_of_the_offered_major_and_an_older_minor_loads(fake_site):
    host = _host_with(fake_site, f"{MAJOR}.0")
    info = host.plugins["rocket"]
    assert (info.status, info.error, info.notice, info.contract) == ("loaded", None, None, f"{MAJOR}.0")
    assert "rocket" in host.training_backends


@pytest.mark.parametrize("stated, says", [
    (f"{MAJOR - 1}.0", "an older major version"),
    (f"{MAJOR + 1}.0", "a newer major version"),
    (f"{MAJOR}.{MINOR + 1}", "upgrade corerl"),
    ("two", "expected MAJOR.MINOR"),
])
def test_a_plugin_outside_the_offered_contract_is_refused_in_one_line(fake_site, stated, says):
    host = _host_with(fake_site, stated)
    info = host.plugins["rocket"]
    assert info.status == "failed" and "\n" not in info.error and says in info.error, info.error
    assert "plugin 'rocket'" in info.error and stated in info.error
    assert "rocket" not in host.training_backends  # nothing of it is registered
    assert "dtensor" in host.training_backends  # and the others are untouched


def test_a_plugin_written_to_the_contract_before_the_loss_metric_names_is_refused_naming_the_changelog(fake_site):
    host = _host_with(fake_site, "1.0")
    assert host.plugins["rocket"].error == (
        f"plugin 'rocket' implements plugin contract 1.0, and this corerl offers {CONTRACT_VERSION} (an older major "
        "version: see the contract changelog in docs/plugins.md, then update the plugin or install a corerl that "
        "offers 1.x)")


def test_a_plugin_that_states_no_version_loads_with_a_notice(fake_site):
    host = _host_with(fake_site, None)
    info = host.plugins["rocket"]
    assert info.status == "loaded" and "rocket" in host.training_backends
    assert f'add corerl_contract = "{CONTRACT_VERSION}" to rocket_plugin' in info.notice
    (row,) = [r for r in host.describe() if r["name"] == "rocket"]
    assert row["notice"] == info.notice and row["contract"] is None


def test_every_first_party_plugin_states_the_offered_contract():
    host = PluginHost(env={})
    first_party = {"dtensor", "megatron", "deepspeed", "vllm"}
    assert {name: host.plugins[name].contract for name in first_party} == dict.fromkeys(first_party, CONTRACT_VERSION)
