"""The template plugin, the example every outside author copies, is written against corerl.sdk alone."""

from __future__ import annotations

import ast

from tests.conftest import REPO


def test_the_template_plugin_imports_corerl_only_through_the_sdk():
    outside = []
    for path in (REPO / "templates" / "plugin" / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            outside += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "corerl" and n != "corerl.sdk"]
    assert not outside, outside
