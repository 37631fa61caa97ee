"""The written algorithm protocol (:class:`corerl.algorithms.contract.RunServices`): the run's
:class:`corerl.run.context.RunContext` provides every member it lists, each as the protocol
declares it (an attribute or property for a property, a method with the same parameters for a
method); the SDK exports it beside ``RunContext``; and no algorithm module reaches the run layer
around it."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from corerl.algorithms.contract import RunServices
from corerl.run.context import RunContext
from tests.conftest import REPO


def protocol_members() -> dict[str, object]:
    return {name: value for name, value in vars(RunServices).items() if not name.startswith("_")}


def new_context(tmp_path: Path) -> RunContext:
    """A context of no run (nothing opened, no engine started): what ``__init__`` sets."""
    return RunContext(config=None, selection=None, console=None, host=None,  # type: ignore[arg-type]
                      run_dir=tmp_path, resume=None)


def test_the_protocol_lists_what_algorithms_use_of_the_run():
    assert set(protocol_members()) == {
        "config", "selection", "host", "console", "run_dir", "tokenizer", "task", "training", "generation",
        "offload", "starting_weights", "steps_done", "held_out_reward", "refit", "rollout", "training_rollout",
        "start", "start_reference", "frozen_config", "resolve_model"}
    for name, member in protocol_members().items():
        assert inspect.getdoc(member), f"RunServices.{name} has no docstring"


def test_run_context_provides_every_member_as_the_protocol_declares_it(tmp_path):
    context = new_context(tmp_path)
    for name, member in protocol_members().items():
        if isinstance(member, property):  # an attribute __init__ sets, or a property
            assert name in vars(context) or isinstance(getattr(RunContext, name, None), property), name
            continue
        theirs = getattr(RunContext, name, None)
        assert callable(theirs), f"RunContext has no method {name}"
        assert inspect.signature(theirs).parameters.keys() == inspect.signature(member).parameters.keys(), name
        for ours, its in zip(inspect.signature(member).parameters.values(),
                             inspect.signature(theirs).parameters.values(), strict=True):
            assert (ours.kind, ours.default) == (its.kind, its.default), f"{name}({ours.name})"
    assert isinstance(context, RunServices)


def test_the_sdk_exports_the_protocol_and_still_the_run_context():
    import corerl.sdk

    assert corerl.sdk.RunServices is RunServices
    assert corerl.sdk.RunContext is RunContext
    assert {"RunServices", "RunContext"} <= set(corerl.sdk.__all__)



def test_no_algorithm_module_imports_the_run_layer():
    run_layer = re.compile(r"corerl\.(run|run_\w+|runner|recovery|interrupt|evaluation|evaluation_command|checkpoints|out_of_memory)(\.|$)")
    found = []
    for path in sorted((REPO / "core" / "src" / "corerl" / "algorithms").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.name}: {name}" for name in names if run_layer.match(name)]
    assert not found, found


def test_nothing_outside_the_run_context_assigns_its_attributes():
    """RunContext sets every attribute in ``__init__`` (its services); the run loop, its steps,
    the algorithms and the conformance suite change what the services hold through their methods."""
    assignment = re.compile(r"^\s*(context|self\.context|ctx)\.\w+(\.\w+)? *=[^=]", re.MULTILINE)
    root = REPO / "core" / "src" / "corerl"
    found = [f"{path.relative_to(root)}: {match.group(0).strip()}" for path in sorted(root.rglob("*.py"))
             if path.relative_to(root).as_posix() != "run/context.py"
             for match in assignment.finditer(path.read_text(encoding="utf-8"))]
    assert not found, found
    assert {"resume_state", "model", "engines", "frozen", "rollouts"} <= set(vars(new_context(REPO)))


def test_the_methods_that_moved_to_a_service_still_answer_on_the_context_with_a_warning(monkeypatch):
    """RunContext's methods outside RunServices before contract 2.16 forward to their service for one version."""
    context = new_context(REPO)
    called = []
    monkeypatch.setattr(context.rollouts, "start_environment", lambda registration, settings: called.append(
        ("start_environment", registration, settings)) or "pool")
    monkeypatch.setattr(context.frozen, "start_reward_scorer", lambda: called.append(("start_reward_scorer",)) or "scorer")
    monkeypatch.setattr(context.engines, "start_generation", lambda registration, path: called.append(
        ("start_generation", registration, path)) or "engine")
    with pytest.warns(DeprecationWarning, match=r"RunContext.start_environment moved .* context.rollouts"):
        assert context.start_environment("reg", "settings") == "pool"
    with pytest.warns(DeprecationWarning, match=r"RunContext.start_reward_scorer moved"):
        assert context.start_reward_scorer() == "scorer"
    with pytest.warns(DeprecationWarning, match=r"RunContext.start_generation moved"):
        assert context.start_generation("gen") == "engine"
    assert called == [("start_environment", "reg", "settings"), ("start_reward_scorer",),
                      ("start_generation", "gen", context.model.path)]
