"""pytest fixtures, marks and the conformance suites' deselection for corerl plugin authors
(registered through the ``pytest11`` entry point)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corerl.errors import CorerlError
from corerl.plugin_manager import PluginHost
from corerl.testing.fake_site import FakeSite

#: the test tiers corerl's own tests use (docs/testing.md), registered in every project that
#: installs corerl so that a plugin's tests may use them too (no PytestUnknownMarkWarning, and
#: no error under ``--strict-markers``)
MARKS = {
    "slow": "tests that start something expensive: a subprocess, a process pool or a Ray runtime "
            "(deselect with -m 'not slow')",
    "gpu": "tests of real CUDA paths; skip them where torch sees no GPU",
}


def pytest_configure(config: pytest.Config) -> None:
    """Register :data:`MARKS`."""
    for name, meaning in MARKS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")


#: the conformance checks deselected in this session: (node id, reason)
_DESELECTED = pytest.StashKey[list[tuple[str, str]]]()


def conformance_deselection(item: pytest.Item) -> str | None:
    """Why ``item``'s conformance class does not run it in its layout, or None: the class's
    ``conformance_deselected(test_name, parametrization)`` (:class:`corerl.testing.conformance.ConformanceLayout`);
    None for any other test.

    A layout whose own settings are wrong (a :class:`~corerl.errors.CorerlError`: its ``overrides``
    give a world size that is not a number, say) is left collected: its tests build the same recipe
    and fail on it, in one line. Anything else the class raises is a bug, in a layout's
    ``conformance_deselected`` or in corerl: it propagates, with a note naming the test."""
    ask = getattr(getattr(item, "cls", None), "conformance_deselected", None)
    if not callable(ask):
        return None
    callspec = getattr(item, "callspec", None)
    params = dict(callspec.params) if callspec is not None else {}
    try:
        reason = ask(getattr(item, "originalname", item.name), params)
    except CorerlError:  # the layout's mistake: its tests report it when they build their recipe
        return None
    except Exception as exc:
        exc.add_note(f"raised by {item.nodeid}'s conformance_deselected (corerl's pytest plugin asks it at collection)")
        raise
    return str(reason) if reason else None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the conformance checks a layout does not run (its class says so), so they are
    neither run nor reported as skipped; pytest counts them as "N deselected"."""
    kept, deselected, reasons = [], [], []
    for item in items:
        reason = conformance_deselection(item)
        if reason is None:
            kept.append(item)
        else:
            deselected.append(item)
            reasons.append((item.nodeid, reason))
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept
        config.stash.setdefault(_DESELECTED, []).extend(reasons)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """With ``-v``: each conformance check deselected by its layout, with the reason."""
    reasons = config.stash.get(_DESELECTED, [])
    if not reasons or config.getoption("verbose") < 1:
        return
    terminalreporter.section("conformance checks not run by their layout (deselected)")
    for nodeid, reason in reasons:
        terminalreporter.line(f"{nodeid}: {reason}")


def first_party_host() -> PluginHost:
    """A plugin manager with the core's own plugin and the first-party plugins installed here
    (dtensor, megatron, deepspeed, vllm, whichever are installed), and nothing else: no other
    entry point, no ``CORERL_*`` variable. A first-party plugin that fails to load is recorded as
    failed, as ``corerl plugins`` shows it."""
    from importlib import metadata

    from corerl.known_plugins import FIRST_PARTY
    from corerl.plugin_manager import ENTRY_POINT_GROUP

    host = PluginHost(discover=False, env={})
    known = {plugin.name: plugin.distribution for plugin in FIRST_PARTY}
    for entry in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        dist = getattr(entry, "dist", None)
        if dist is None or known.get(entry.name) != dist.name or entry.name in host.plugins:
            continue
        host.load_plugin(entry.name, entry.value, distribution=dist.name, version=dist.version)
    return host


@pytest.fixture
def corerl_host() -> PluginHost:
    """A fresh plugin manager per test: the core's own plugin and the installed first-party
    plugins (their training and generation backends), but no other entry point and no
    ``CORERL_*`` variable (:func:`first_party_host`).

    Register the plugin under test with ``corerl_host.register(module_or_object, name="mine")``; a
    plugin that registers no training backend (a task, a reward, an algorithm) can then select a
    recipe that trains with the first-party backends installed here.
    """
    return first_party_host()


@pytest.fixture
def fake_site(tmp_path: Path) -> Iterator[FakeSite]:
    """A folder of fake installed distributions, on ``sys.path`` for this test only."""
    site = FakeSite(tmp_path / "fake-site")
    site.activate()
    try:
        yield site
    finally:
        site.deactivate()
