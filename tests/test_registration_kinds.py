"""The kinds of registration come from their classes and hook specs alone; one resolver reads
every ``module:attr`` path; the two public faces export one list of registering names."""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import ClassVar

import attrs
import pytest

import corerl
import corerl.sdk
from corerl import component_kinds, hookspecs, import_paths, registry
from corerl.component_kinds import KINDS, kinds_in
from corerl.hookspecs import hookimpl, hookspec
from corerl.plugin_manager import PluginHost
from corerl.registry import Registration
from tests.conftest import REPO

CORE = REPO / "core" / "src" / "corerl"


# -- a new kind, in two edits -------------------------------------------------------------------

# edit 1, in corerl/registry.py: the registration class, carrying its kind's facts
@attrs.frozen(kw_only=True)
class Widget(Registration):
    """A widget a plugin provides (a kind that exists only in this test)."""

    kind: ClassVar[str] = "widget"
    hook: ClassVar[str] = "corerl_register_widgets"
    registry_name: ClassVar[str] = "widgets"
    label: ClassVar[str] = "widgets"
    size: int = 1


# edit 2, in corerl/hookspecs.py: its hook spec
@hookspec
def corerl_register_widgets(register: Callable[[Widget], None]) -> None:
    """Register widgets: call ``register(Widget(id=..., factory=...))`` once per widget."""


class WidgetMaker:
    """A plugin providing the new kind, written as any plugin is."""

    @hookimpl
    def corerl_register_widgets(self, register):
        register(Widget(id="spinner", factory="collections:OrderedDict", size=3, description="spins"))


def test_a_new_kind_of_registration_takes_two_edits(monkeypatch):
    """Its class in corerl.registry and its hook spec in corerl.hookspecs; the plugin host, its
    listing and its lookups find it with nothing else changed."""
    monkeypatch.setattr(registry, "Widget", Widget, raising=False)
    monkeypatch.setattr(hookspecs, "corerl_register_widgets", corerl_register_widgets, raising=False)

    host = PluginHost(discover=False, env={})
    host.register(WidgetMaker(), name="maker")

    assert host.kinds[-1] == component_kinds.ComponentKind("corerl_register_widgets", "widgets", Widget, "widgets")
    assert host.registry(Widget).ids() == ["spinner"]
    assert host.widgets.get("spinner").plugin == "maker"  # attribute access, as for the core's kinds
    assert host.widgets.get("spinner").create(a=1) == {"a": 1}
    row = next(r for r in host.describe() if r["name"] == "maker")
    assert row["widgets"] == ["spinner"] and row["status"] == "loaded"
    assert {"kind": "widgets", "id": "spinner", "priority": 0, "config_section": None} in row["components"]


def test_without_the_hook_spec_there_is_no_such_kind():
    host = PluginHost(discover=False, env={})
    with pytest.raises(LookupError, match="no kind of registration 'Widget'"):
        host.registry(Widget)
    with pytest.raises(AttributeError, match="widgets"):
        host.widgets  # noqa: B018
    assert "widgets" not in host.registries()


def test_a_host_takes_more_hook_specs_and_their_kinds():
    class WidgetSpecs:
        corerl_register_widgets = corerl_register_widgets

    host = PluginHost(discover=False, env={})
    assert [kind.registry for kind in host.add_hookspecs(WidgetSpecs)] == ["widgets"]
    host.register(WidgetMaker(), name="maker")
    assert host.registry("widgets").get("spinner").size == 3
    with pytest.raises(ValueError, match="'widgets' is already collected"):
        host.add_hookspecs(WidgetSpecs)


@attrs.frozen(kw_only=True)
class Gadget(Registration):
    """A registration class whose facts name another hook than the spec that takes it."""

    kind: ClassVar[str] = "gadget"
    hook: ClassVar[str] = "corerl_register_gizmos"
    registry_name: ClassVar[str] = "gadgets"
    label: ClassVar[str] = "gadgets"


class DisagreeingSpecs:
    """A hook spec taking Gadget, which says it is collected by another hook."""

    @hookspec
    def corerl_register_gadgets(register: Callable[[Gadget], None]) -> None:
        """Register gadgets."""


class UntypedSpecs:
    """A registration hook spec that does not say what it takes."""

    @hookspec
    def corerl_register_things(register) -> None:
        """Register things."""


def test_a_hook_spec_and_its_registration_class_must_agree():
    with pytest.raises(TypeError, match="corerl_register_gadgets registers Gadget, whose facts say "
                                        "hook='corerl_register_gizmos'"):
        kinds_in(DisagreeingSpecs)
    with pytest.raises(TypeError, match="annotate register as Callable"):
        kinds_in(UntypedSpecs)


def test_the_core_kinds_are_read_from_the_hook_specs():
    registration_hooks = [name for name in vars(hookspecs) if name.startswith("corerl_register_")]
    assert [kind.hook for kind in KINDS] == registration_hooks
    assert len({kind.registry for kind in KINDS}) == len(KINDS)
    for kind in KINDS:
        assert (kind.registration.hook, kind.registration.registry_name, kind.registration.label) == (
            kind.hook, kind.registry, kind.label)
    assert PluginHost(discover=False, env={}).kinds == KINDS
    # every kind's registry is reachable both ways, as the hand-written properties were
    host = PluginHost(discover=False, env={})
    for kind in KINDS:
        assert getattr(host, kind.registry) is host.registry(kind.registration) is host.registry(kind.registry)


def test_the_core_plugin_is_loaded_by_its_module_path():
    host = PluginHost(discover=False, env={})
    assert host.plugins["corerl"].module == "corerl.builtin_plugin"
    assert host.plugins["corerl"].status == "loaded" and "hf" in host.generation_backends
    tree = ast.parse((CORE / "plugin_manager.py").read_text(encoding="utf-8"))
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom | ast.Import)
                for alias in node.names]
    assert "builtin_plugin" not in imported and "corerl.builtin_plugin" not in imported


# -- one resolver -------------------------------------------------------------------------------

def _import_module_calls() -> list[str]:
    found = []
    for path in sorted(CORE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                for node in ast.walk(function):
                    if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module":
                        found.append(f"{path.relative_to(CORE)}:{function.name}")
    return sorted(set(found))


def test_the_three_resolvers_are_one(monkeypatch):
    from corerl.distributed import actor, worker_group
    from corerl.registry import TrainingBackend
    from corerl.tasks.rewards import import_reward

    assert actor.resolve is import_paths.resolve is corerl.sdk.resolve is worker_group.resolve
    assert _import_module_calls() == ["import_paths.py:resolve"]  # nothing else imports a path itself

    seen = []
    original = import_paths.resolve

    def spy(path, **kwargs):
        seen.append(path)
        return original(path, **kwargs)

    monkeypatch.setattr(import_paths, "resolve", spy)
    TrainingBackend(id="ok", factory="collections:OrderedDict").load()
    import_reward("corerl.tasks.rewards:exact_answer")
    assert seen == ["collections:OrderedDict", "corerl.tasks.rewards:exact_answer"]


@pytest.mark.parametrize(("call", "error", "line"), [
    (lambda: import_paths.resolve("corerl_nowhere.mod:Thing", what="rank worker"), ImportError,
     "cannot import rank worker module 'corerl_nowhere.mod': No module named 'corerl_nowhere'; install the package "
     "that provides it, or put its module on PYTHONPATH"),
    (lambda: import_paths.resolve("json:nothing_here"), AttributeError,
     "module 'json' has no 'nothing_here'; check the name after ':' in 'json:nothing_here'"),
    (lambda: import_paths.resolve("json nope"), AttributeError,
     "import path 'json nope' is not of the form package.module:name; write it as package.module:name"),
])
def test_the_resolver_fails_in_one_line_saying_what_to_fix(call, error, line):
    from corerl.errors import CorerlError

    with pytest.raises(error) as caught:  # still the builtin errors a caller of sdk.resolve may catch
        call()
    assert isinstance(caught.value, CorerlError) and str(caught.value) == line


def test_the_resolver_returns_modules_attributes_and_callables():
    import json

    assert import_paths.resolve("json") is json
    assert import_paths.resolve("json:decoder.JSONDecoder") is json.decoder.JSONDecoder
    assert import_paths.resolve(len) is len


# -- one list for both public faces -------------------------------------------------------------

def test_both_public_faces_export_the_one_list_of_registering_names():
    names = component_kinds.__all__
    assert {"hookimpl", "CONTRACT_VERSION", "ExperimentLogger", "PlotSpec"} <= set(names)
    assert {kind.registration.__name__ for kind in KINDS} <= set(registry.__all__) <= set(names)
    for face in (corerl, corerl.sdk):
        assert set(names) <= set(face.__all__), face.__name__
        assert len(face.__all__) == len(set(face.__all__)), face.__name__
        for name in names:
            assert getattr(face, name) is getattr(component_kinds, name), (face.__name__, name)


def test_known_plugins_answer_for_any_kind():
    from corerl.known_plugins import provider_of

    assert provider_of("training backend", "megatron").name == "megatron"
    assert provider_of("generation_backends", "vllm").name == "vllm"
    assert provider_of("command", "convert").name == "megatron"
    assert provider_of("task", "megatron") is None and provider_of("install", "pip") is None
