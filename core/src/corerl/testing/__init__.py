"""Test helpers for corerl and for third-party plugin authors.

The pytest plugin (:mod:`corerl.testing.pytest_plugin`, loaded automatically through the
``pytest11`` entry point) provides the fixtures ``corerl_host`` (a fresh plugin manager per
test, with the core's own plugin and the installed first-party plugins) and ``fake_site`` (fake
installed distributions with entry points, found by real ``importlib.metadata`` discovery), and
registers corerl's marks (``slow``, ``gpu``). This module holds the plain helpers those fixtures
and tests build on; the conformance suites live beside it (``conformance``,
``generation_conformance``, ``algorithm_conformance``, ``environment_conformance``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from corerl.testing.fake_site import FakeSite
from corerl.testing.in_memory import plugin_from

if TYPE_CHECKING:
    from corerl.config import Config
    from corerl.config.selection import Selection
    from corerl.plugin_manager import PluginHost

__all__ = ["FakeSite", "host_with", "plugin_from", "select_for", "write_recipe"]


def write_recipe(path: Path, data: Mapping[str, Any]) -> Path:
    """Write ``data`` as a YAML recipe at ``path`` and return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(data), sort_keys=False), encoding="utf-8")
    return path


def host_with(plugin: Any | None, name: str) -> PluginHost:
    """A plugin manager for a conformance run: the installed plugins when ``plugin`` is None,
    else the core's own plus ``plugin`` registered as ``name`` (no ``CORERL_*`` variables either way)."""
    from corerl.plugin_manager import PluginHost

    host = PluginHost(discover=plugin is None, env={})
    if plugin is not None:
        host.register(plugin, name=name)
    return host


def host_for_component(registry: str, component_id: str, plugin: Any | None, what: str) -> tuple[PluginHost, Any]:
    """The installed plugins (whatever ``CORERL_*`` says) and, when the component ``component_id``
    of ``registry`` (e.g. ``"algorithms"``) is not installed already, ``plugin`` registered beside
    them: the host and the component's registration. A component found nowhere fails the test in
    one line naming ``what`` it is and what is registered."""
    import pytest

    from corerl.plugin_manager import PluginHost

    host = PluginHost(env={})
    if plugin is not None and host.registry(registry).get(component_id) is None:
        host.register(plugin, name=f"{component_id}-under-test")
    registration = host.registry(registry).get(component_id)
    if registration is None:
        known = ", ".join(sorted(r.id for r in host.registry(registry)))
        pytest.fail(f"no {what} {component_id!r} is registered (registered: {known}); set plugin to the module that "
                    "registers it, or install its package", pytrace=False)
    return host, registration


def select_for(
    host: PluginHost, recipe: Path | str, overrides: Iterable[str] = ()
) -> tuple[Config, Selection]:
    """Load and validate ``recipe`` with ``host``'s plugins, then select: what ``corerl validate`` does."""
    from corerl.config import load_config
    from corerl.config.selection import select

    config = load_config(recipe, list(overrides), host)
    return config, select(config, host)
