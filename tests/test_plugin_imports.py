"""First-party plugins are held to the plugin API, as a third party's are: they import from
corerl only ``corerl.sdk`` and ``corerl.testing``."""

from __future__ import annotations

import ast

from tests.conftest import REPO

ALLOWED = ("corerl.sdk", "corerl.testing")


def _corerl_imports(path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module] if node.module != "corerl" else [f"corerl.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        else:
            continue
        for module in modules:
            if module == "corerl" or module.startswith("corerl."):
                yield f"{path.relative_to(REPO)}:{node.lineno} {module}"


def test_first_party_plugins_and_the_template_import_only_the_sdk_and_the_testing_helpers():
    sources = [*REPO.glob("plugins/*/src/**/*.py"), *REPO.glob("templates/plugin/src/**/*.py")]
    assert len(sources) > 40
    outside = [found for path in sources for found in _corerl_imports(path)
               if not any(found.split()[-1] == allowed or found.split()[-1].startswith(allowed + ".")
                          for allowed in ALLOWED)]
    assert outside == []
