"""Fake installed distributions: a ``*.dist-info`` folder with ``entry_points.txt`` on ``sys.path``.

``importlib.metadata`` discovers them exactly as it discovers pip-installed packages, so
entry-point loading is tested for real without running pip.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path


class FakeSite:
    """A folder of fake distributions; ``activate()`` puts it first on ``sys.path``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._active = False

    def add_distribution(
        self,
        name: str,
        version: str = "0.1.0",
        *,
        entry_points: Mapping[str, Mapping[str, str]] | None = None,
        files: Mapping[str, str] | None = None,
    ) -> Path:
        """Write a distribution: its ``dist-info`` (METADATA, entry_points.txt) and source ``files``.

        ``entry_points`` maps group -> {name: "module:attr"}; ``files`` maps a path relative to
        the site folder (``"my_pkg/plugin.py"``) to its source text.
        """
        normalized = re.sub(r"[-_.]+", "_", name)
        info = self.path / f"{normalized}-{version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8")
        lines = []
        for group, entries in (entry_points or {}).items():
            lines.append(f"[{group}]")
            lines.extend(f"{ep_name} = {target}" for ep_name, target in entries.items())
            lines.append("")
        (info / "entry_points.txt").write_text("\n".join(lines), encoding="utf-8")
        for relative, source in (files or {}).items():
            target = self.path / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(source, encoding="utf-8")
        importlib.invalidate_caches()
        return info

    def activate(self) -> None:
        """Put the site first on ``sys.path`` (this process)."""
        if not self._active:
            sys.path.insert(0, str(self.path))
            importlib.invalidate_caches()
            self._active = True

    def deactivate(self) -> None:
        """Take the site off ``sys.path`` and forget every module imported from it."""
        if self._active:
            sys.path.remove(str(self.path))
            self._active = False
        root = str(self.path)
        for name, module in list(sys.modules.items()):
            if (getattr(module, "__file__", None) or "").startswith(root):
                del sys.modules[name]
        importlib.invalidate_caches()

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """An environment for a subprocess that sees this site (``PYTHONPATH`` first)."""
        env = dict(os.environ if base is None else base)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.path), env.get("PYTHONPATH", "")) if p)
        return env
