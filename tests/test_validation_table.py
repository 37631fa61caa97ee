"""Validation as a table (issue 74): each feature's checks across the chosen components live with
the feature, the plugins state them (``corerl_checks``, the core's own in corerl.builtin_plugin),
and selection runs the table without importing a feature module."""

from __future__ import annotations

import ast
import types
from pathlib import Path

import pytest

from corerl.config.validation import Check, Chosen, as_check, run_checks
from corerl.errors import ConfigError, ConfigErrors, PluginError, SelectionError
from corerl.hookspecs import CONTRACT_VERSION
from corerl.plugin_manager import PluginHost
from corerl.testing import select_for
from tests.conftest import EXAMPLES

BASE = EXAMPLES / "base.yaml"
SELECTION = Path(__file__).resolve().parents[1] / "core" / "src" / "corerl" / "config" / "selection.py"


def _host_with_checks(*checks: object) -> PluginHost:
    plugin = types.ModuleType("checker")  # a plugin module stating its checks as it states its contract
    plugin.corerl_contract, plugin.corerl_checks = CONTRACT_VERSION, list(checks)  # type: ignore[attr-defined]
    host = PluginHost(env={})
    host.register(plugin, name="checker")
    return host


def test_the_picker_imports_no_feature_module():
    features = ("corerl.asynchronous", "corerl.evaluation", "corerl.environments", "corerl.tasks", "corerl.lora",
                "corerl.models.moe_checks", "corerl.run", "corerl.algorithms")
    imported = [node.module for node in ast.walk(ast.parse(SELECTION.read_text(encoding="utf-8")))
                if isinstance(node, ast.ImportFrom) and node.module]
    assert not [m for m in imported if m.startswith(features)]


def test_the_core_states_its_features_checks_first_each_where_its_feature_lives():
    rows = PluginHost(env={}).checks()
    core = [entry for plugin, entry in rows if plugin == "corerl"]
    assert rows[:len(core)] == [("corerl", entry) for entry in core]  # the core's own first
    paths = [as_check(entry).function for entry in core]
    assert "corerl.lora.checks:check_lora_chosen" in paths
    assert "corerl.asynchronous.settings:check_async_chosen" in paths
    for entry in core:  # each row imports, and names a function
        assert callable(as_check(entry).load())


def test_a_plugins_check_refuses_with_the_origin_of_its_key():
    def no_big_batches(config, chosen):
        assert chosen.training_backend is not None and chosen.algorithm.id == "grpo"
        if config.core.policy.train_micro_batch_size > 2:
            raise ConfigError("too big for this plugin", key="policy.train_micro_batch_size", hint="use 2")

    host = _host_with_checks(no_big_batches)
    select_for(host, BASE, ["policy.train_micro_batch_size=2"])
    with pytest.raises(ConfigErrors) as caught:
        select_for(host, BASE, ["policy.train_micro_batch_size=4"])
    [error] = caught.value.errors
    assert error.message == "too big for this plugin" and "policy.train_micro_batch_size=4" in str(error.source)


def test_a_plugins_check_that_breaks_is_named_as_the_plugins_error():
    def broken(config, chosen):
        raise ValueError("oops")

    with pytest.raises(PluginError) as caught:
        select_for(_host_with_checks(Check(broken, name="broken check")), BASE, [])
    assert "checker" in str(caught.value) and "broken check" in str(caught.value) and "oops" in str(caught.value)


def test_a_check_of_the_algorithm_is_said_with_the_selection_errors():
    def refuse(config, chosen):
        raise SelectionError("not with this algorithm", key="algorithm.name")

    host = _host_with_checks(Check(refuse, phase="algorithm"))
    with pytest.raises(ConfigErrors) as caught:
        select_for(host, BASE, ["data.task=no_such_task"])
    messages = [e.message for e in caught.value.errors]
    assert "not with this algorithm" in messages and any("no_such_task" in m for m in messages)


def test_a_phase_is_one_of_the_two():
    with pytest.raises(ValueError):
        Check("corerl.lora.checks:check_lora_chosen", phase="later")


def test_lora_hints_name_the_installed_backends_that_take_it():
    from corerl.lora.checks import check_lora_chosen

    host = PluginHost(env={})
    config = select_for(host, BASE, [])[0]
    config.core.policy.lora.enabled = True
    plain = types.SimpleNamespace(id="plain", plugin="mine", lora=False, generation=True, kind="training backend")
    chosen = Chosen(host, {"training_backend": types.SimpleNamespace(registration=plain)})
    with pytest.raises(SelectionError) as caught:
        check_lora_chosen(config, chosen)
    taking = [r.id for r in host.training_backends if r.lora]
    assert taking and f"({', '.join(taking)})" in caught.value.hint


def test_run_checks_runs_only_its_phase_in_order():
    ran: list[str] = []
    rows = [("p", Check(lambda config, chosen: ran.append("a"), phase="algorithm")),
            ("p", Check(lambda config, chosen: ran.append("c1"))), ("p", Check(lambda config, chosen: ran.append("c2")))]
    assert run_checks(None, Chosen(None), "chosen", rows) == [] and ran == ["c1", "c2"]


def test_the_defaults_are_in_the_table_of_first_party_engines():
    from corerl.config import selection
    from corerl.known_plugins import (
        DEFAULT_GENERATION_BACKEND,
        DEFAULT_TRAINING_BACKEND,
        provider_of,
    )

    assert provider_of("training backend", DEFAULT_TRAINING_BACKEND) is not None
    assert provider_of("generation backend", DEFAULT_GENERATION_BACKEND) is not None
    assert (selection.DEFAULT_TRAINING_BACKEND, selection.DEFAULT_GENERATION_BACKEND) == (
        DEFAULT_TRAINING_BACKEND, DEFAULT_GENERATION_BACKEND)


def test_the_packers_of_a_config_built_without_selection_are_the_cores_own():
    from corerl.packing.algorithms import CORE_PACKERS

    assert set(CORE_PACKERS) == set(PluginHost(discover=False, env={}).sequence_packers.ids())
