"""The templates, the examples every outside author copies (a training backend, an algorithm, an
environment, a generation backend), are written against corerl.sdk alone, and their tests against
corerl.testing."""

from __future__ import annotations

import ast

import pytest

from tests.conftest import REPO

TEMPLATES = ("plugin", "algorithm", "environment", "generation")


def _corerl_imports(folder, allowed):
    outside = []
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            outside += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "corerl" and not allowed(n)]
    return outside


@pytest.mark.parametrize("template", TEMPLATES)
def test_the_template_imports_corerl_only_through_the_sdk(template):
    folder = REPO / "templates" / template
    assert (folder / "src").is_dir() and (folder / "tests").is_dir() and (folder / "pyproject.toml").is_file()
    assert not _corerl_imports(folder / "src", lambda name: name == "corerl.sdk")
    in_tests = _corerl_imports(folder / "tests", lambda name: name == "corerl.sdk" or name.startswith("corerl.testing"))
    assert not in_tests, in_tests
