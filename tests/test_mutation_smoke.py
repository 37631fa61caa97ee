"""scripts/mutation_smoke.py stays runnable as the code moves: each mutation's text is found once in
its file and its guarding tests exist (the smoke itself runs by hand: docs/testing.md)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.conftest import REPO


def _script():
    spec = importlib.util.spec_from_file_location("mutation_smoke", REPO / "scripts" / "mutation_smoke.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses looks its module up there
    spec.loader.exec_module(module)
    return module


SMOKE = _script()


@pytest.mark.parametrize("mutation", SMOKE.MUTATIONS, ids=lambda m: m.name)
def test_each_mutation_applies_to_the_current_source_and_names_existing_tests(mutation):
    text = SMOKE.check_applicable(mutation)  # exits naming the mutation when its text moved
    assert text.replace(mutation.old, mutation.new) != text
    assert mutation.tests
    for test in mutation.tests:
        path, _, name = test.partition("::")
        assert (REPO / path).is_file(), test
        parts = name.split("::") if name else []
        classes, function = parts[:-1], parts[-1] if parts else ""
        source = (REPO / path).read_text()
        assert all(f"class {c}" in source for c in classes), test
        # a conformance check is defined in the shared suite its class inherits from
        suites = [source, *(f.read_text() for f in (REPO / "core/src/corerl/testing").rglob("*.py"))]
        assert not function or any(f"def {function.split('[')[0]}(" in s for s in suites), test
