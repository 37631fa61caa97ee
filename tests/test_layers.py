"""The layers of shared/design.md, enforced (issue 74): the ast check of tests/layer_check.py over
core/src/corerl and plugins/*/src (every import: module level, inside functions, under
TYPE_CHECKING), and import-linter's contracts in .importlinter, generated from the same data.

A circle, an upward import or a broken rule that the allowance does not list fails; so does an
allowance entry that no longer matches the code (the allowance only shrinks)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests import layer_check as lc


@pytest.fixture(scope="module")
def checked() -> tuple[lc.Findings, dict[str, dict[str, int]]]:
    return lc.check()


def test_the_code_keeps_its_layers(checked: tuple[lc.Findings, dict[str, dict[str, int]]]) -> None:
    found, graph = checked
    left = lc.problems(found)
    lines = [f"{p}" + _where(p, graph) for p in left]
    assert not left, ("the imports break shared/design.md's layers (tests/layer_check.py; "
                      "`python -m tests.layer_check` lists every finding):\n" + "\n".join(lines))


def _where(problem: str, graph: dict[str, dict[str, int]]) -> str:
    """' (line N)' for a problem naming one import."""
    if " -> " not in problem:
        return ""
    importer, _, rest = problem.split(": ", 1)[1].partition(" -> ")
    imported = rest.split(" ", 1)[0]
    line = graph.get(importer, {}).get(imported)
    return f" [line {line}]" if line else ""


def test_every_allowance_entry_gives_its_reason() -> None:
    for edge, why in lc.ALLOWED_IMPORTS.items():
        importer, sep, imported = edge.partition(" -> ")
        assert sep and importer and imported, edge
        assert len(why) > 20, f"{edge}: say why it is still allowed"
    for group, why in lc.ALLOWED_CIRCLES.items():
        assert len(group) > 1 and "issue 74" in why, f"{group}: a circle left is a TODO of issue 74"


def test_the_architecture_page_shows_the_layers_and_the_allowance_size() -> None:
    """docs/architecture.md's "Layers": the table and rules of LAYERS/NEVER, and the allowance's
    size (it only goes down: lower it there with each entry removed)."""
    page = (lc.REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert lc.picture() in page, "docs/architecture.md: paste `python -m tests.layer_check --docs`'s table and rules"
    assert lc.allowance_line() in page, f"docs/architecture.md must say: {lc.allowance_line()}"


def test_the_importlinter_contracts_are_current(checked: tuple[lc.Findings, dict[str, dict[str, int]]]) -> None:
    _, graph = checked
    assert lc.CONFIG.read_text(encoding="utf-8") == lc.importlinter_config(graph), (
        ".importlinter is generated from tests/layer_check.py and the modules there are: "
        "run `python -m tests.layer_check --write-config`")


def _lint(config: Path) -> bool:
    pytest.importorskip("importlinter")
    from importlinter import configuration
    from importlinter.application import use_cases

    configuration.configure()
    return use_cases.lint_imports(config_filename=str(config), cache_dir=None, no_logo=True)


def test_import_linter_keeps_the_contracts() -> None:
    assert _lint(lc.CONFIG), "lint-imports: a contract of .importlinter is broken (its report is above)"


def test_import_linter_breaks_the_contracts_without_the_allowance(
        checked: tuple[lc.Findings, dict[str, dict[str, int]]], tmp_path: Path) -> None:
    """The contracts bite on corerl itself: with no ignore_imports, what the allowance lets through
    breaks them."""
    found, graph = checked
    if not found.upward and not found.broken:
        pytest.skip("nothing left for the allowance to let through")
    config = tmp_path / "contracts.ini"
    config.write_text(lc.importlinter_config(graph, allowed_imports={}), encoding="utf-8")
    assert not _lint(config)


def test_import_linter_counts_imports_inside_functions_and_under_type_checking(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the contracts rely on: import-linter sees a lazy import as the dependency it is."""
    pkg = tmp_path / "layered_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "high.py").write_text("X = 1\n")
    (pkg / "low.py").write_text("")
    config = tmp_path / "contracts.ini"
    config.write_text("[importlinter]\nroot_package = layered_probe\n\n[importlinter:contract:layers]\n"
                      "name = probe\ntype = layers\nlayers =\n    layered_probe.high\n    layered_probe.low\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _lint(config)
    for body in ["def f():\n    from layered_probe import high\n    return high.X\n",
                 "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from layered_probe import high\n"]:
        (pkg / "low.py").write_text(body)
        assert not _lint(config), body


# -- the checker catches what it must, on a small package of corerl's names ---------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> list[Path]:
    src = tmp_path / "core" / "src"
    base = {"corerl/__init__.py": "", "corerl/errors.py": "", "corerl/failures.py": "",
            "corerl/training/__init__.py": "", "corerl/algorithms/__init__.py": "",
            "corerl/algorithms/batches.py": "def step_seed(): ...\n", "corerl/asynchronous/__init__.py": "",
            "corerl/run/__init__.py": "", "corerl/run/context.py": "", "corerl/models/__init__.py": ""}
    for rel, text in {**base, **files}.items():
        path = src / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return [src]


def _problems(tmp_path: Path, files: dict[str, str], allowed: dict[str, str] | None = None,
              circles: dict[tuple[str, ...], str] | None = None) -> list[str]:
    found, _ = lc.check(_tree(tmp_path, files))
    return lc.problems(found, allowed or {}, circles or {})


def test_a_clean_package_passes(tmp_path: Path) -> None:
    assert _problems(tmp_path, {"corerl/training/engine.py": "from corerl import errors\n",
                                "corerl/run/context.py": "import corerl.algorithms.batches\n"}) == []


def test_a_circle_closed_inside_a_function_fails(tmp_path: Path) -> None:
    files = {"corerl/errors.py": "from corerl import failures\n",
             "corerl/failures.py": "def f():\n    from corerl.errors import Error\n"}
    assert _problems(tmp_path, files) == ["circle: corerl.errors, corerl.failures"]
    assert _problems(tmp_path, files, circles={("corerl.errors", "corerl.failures"): "TODO(issue 74)"}) == []


def test_an_upward_import_under_type_checking_fails(tmp_path: Path) -> None:
    files = {"corerl/errors.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                 "    from corerl.training import engine\n",
             "corerl/training/engine.py": ""}
    assert _problems(tmp_path, files) == ["upward import: corerl.errors -> corerl.training.engine (leaves -> contracts)"]
    allowed = {"corerl.errors -> corerl.training.engine": "a reason"}
    assert _problems(tmp_path, files, allowed) == []


def test_a_broken_rule_fails(tmp_path: Path) -> None:
    files = {"corerl/asynchronous/producer.py": "def seed():\n    from corerl.algorithms.batches import step_seed\n"
                                                "    return step_seed()\n"}
    assert _problems(tmp_path, files) == [
        "rule broken: corerl.asynchronous.producer -> corerl.algorithms.batches "
        "(asynchronous knows no algorithm module: shared helpers live below both)"]


def test_a_relative_import_counts(tmp_path: Path) -> None:
    files = {"corerl/models/facts.py": "def f():\n    from ..training import engine\n",
             "corerl/training/engine.py": ""}
    assert _problems(tmp_path, files) == [
        "rule broken: corerl.models.facts -> corerl.training.engine (model facts stand below the engines)"]


def test_a_module_on_no_layer_fails(tmp_path: Path) -> None:
    assert _problems(tmp_path, {"corerl/somewhere.py": ""}) == [
        "on no layer: corerl.somewhere (give it one in tests/layer_check.py's LAYERS, after shared/design.md)"]


def test_a_stale_allowance_entry_fails(tmp_path: Path) -> None:
    left = _problems(tmp_path, {}, {"corerl.errors -> corerl.run.context": "gone"}, {("corerl.a", "corerl.b"): "gone"})
    assert [p.split(":")[0] for p in left] == ["stale allowance", "stale allowance"]


def test_a_circle_that_shrank_narrows_its_allowance(tmp_path: Path) -> None:
    files = {"corerl/errors.py": "from corerl import failures\n",
             "corerl/failures.py": "def f():\n    from corerl.errors import Error\n"}
    left = _problems(tmp_path, files, circles={("corerl.errors", "corerl.failures", "corerl.import_paths"): "x"})
    assert left == ["stale allowance: the circle corerl.errors, corerl.failures, corerl.import_paths is now "
                    "corerl.errors, corerl.failures: narrow it in ALLOWED_CIRCLES"]
