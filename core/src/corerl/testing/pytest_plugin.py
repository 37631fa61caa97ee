"""pytest fixtures for corerl plugin authors (registered through the ``pytest11`` entry point)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from corerl.plugin_manager import PluginHost
from corerl.testing.fake_site import FakeSite


@pytest.fixture
def corerl_host() -> PluginHost:
    """A fresh plugin manager with only the core's own plugin; no entry points, no ``CORERL_*`` env.

    Register the plugin under test with ``corerl_host.register(module_or_object, name="mine")``.
    """
    return PluginHost(discover=False, env={})


@pytest.fixture
def fake_site(tmp_path: Path) -> Iterator[FakeSite]:
    """A folder of fake installed distributions, on ``sys.path`` for this test only."""
    site = FakeSite(tmp_path / "fake-site")
    site.activate()
    try:
        yield site
    finally:
        site.deactivate()
