"""Registrations and registries: validation, duplicate ids, lazy factories."""

from __future__ import annotations

import re

import attrs
import pytest

from corerl import GenerationBackend, TrainingBackend
from corerl.errors import EngineNotAvailable, RegistrationError
from corerl.registry import Registry


@attrs.define
class _Schema:
    enabled: bool = False


def test_registry_refuses_a_second_registration_and_names_both_plugins():
    registry = Registry(TrainingBackend)
    registry.add(TrainingBackend(id="fast", factory="os:getcwd"), plugin="alpha")
    with pytest.raises(RegistrationError) as caught:
        registry.add(TrainingBackend(id="fast", factory="os:getcwd"), plugin="beta")
    assert "'alpha'" in str(caught.value) and "'beta'" in str(caught.value)
    assert registry.conflicts == {"fast": ["alpha", "beta"]}
    assert registry.get("fast").plugin == "alpha"


def test_registry_orders_by_priority_then_id():
    registry = Registry(TrainingBackend)
    for name, priority in (("b", 100), ("a", 100), ("c", 300)):
        registry.add(TrainingBackend(id=name, factory="os:getcwd", priority=priority), plugin="p")
    assert [r.id for r in registry] == ["c", "a", "b"]
    assert registry.ids() == ["a", "b", "c"]
    assert registry.by_plugin("p") == ["a", "b", "c"]


def test_registry_refuses_the_wrong_kind():
    registry = Registry(TrainingBackend)
    with pytest.raises(RegistrationError, match="register a TrainingBackend"):
        registry.add(GenerationBackend(id="x", factory="os:getcwd"), plugin="p")


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"id": "Bad Id", "factory": "os:getcwd"}, "invalid id"),
        ({"id": "", "factory": "os:getcwd"}, "invalid id"),
        ({"id": "ok", "factory": "no-colon"}, "invalid factory"),
        ({"id": "ok", "factory": 42}, "invalid factory"),
        ({"id": "ok", "factory": "os:getcwd", "priority": "high"}, "invalid priority"),
        ({"id": "ok", "factory": "os:getcwd", "config_section": "toplevel"}, "invalid config_section"),
        ({"id": "ok", "factory": "os:getcwd", "config_schema": dict}, "invalid config_schema"),
    ],
)
def test_registration_validates_its_fields(kwargs, words):
    with pytest.raises(RegistrationError, match=words):
        TrainingBackend(**kwargs)


def test_factory_import_path_is_resolved_only_on_load():
    item = TrainingBackend(id="ok", factory="collections:OrderedDict", config_schema=_Schema)
    assert item.create(a=1) == {"a": 1}


def test_factory_in_a_missing_module_is_a_clear_engine_error():
    item = TrainingBackend(id="ok", factory="corerl_no_such_module.engine:Backend", plugin="mine")
    expected = "(plugin 'mine') cannot import 'corerl_no_such_module.engine:Backend'"
    with pytest.raises(EngineNotAvailable, match=re.escape(expected)):
        item.load()


def test_factory_naming_a_missing_attribute_is_a_registration_error():
    item = TrainingBackend(id="ok", factory="os:no_such_function", plugin="mine")
    with pytest.raises(RegistrationError, match="names a missing factory"):
        item.load()
