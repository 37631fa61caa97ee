"""corerl's layers, checked from the code's own imports.

shared/design.md ("Layers, and what never depends on what") is the source of the picture; this
module restates it as data (``LAYERS``, ``NEVER``) and checks the code against it:

- every module of ``core/src/corerl`` and ``plugins/*/src`` is read with ``ast`` (nothing is
  imported) and every ``import`` / ``from ... import`` of a corerl module counts, at module level,
  inside a function or under ``TYPE_CHECKING`` alike: a lazy import hides a dependency, it does not
  remove it;
- a module's layer is the one whose longest prefix matches its dotted name (``corerl.algorithms``
  is algorithms, ``corerl.algorithms.contract`` contracts); a plugin's modules (``corerl_*``) are
  the ``plugins`` part, outside the layers;
- findings: circles (modules that import each other, directly or around a loop), broken rules (an
  import ``NEVER`` forbids), upward imports (to a layer above the importer's), and modules on no
  layer (a new root module or package: give it a layer in ``LAYERS``).

What the code does today and the design does not want yet is in ``ALLOWED_IMPORTS`` and
``ALLOWED_CIRCLES``, each entry with its reason. **These lists may only shrink**: an entry that no
longer matches the code fails the test too (remove it), and a new finding fails until it is fixed.
tests/test_layers.py runs the check in the fast tier.

The project's import-linter contracts (``.importlinter`` at the repository root, checked by
``lint-imports``) are generated from the same data, so both tools state one picture::

    python -m tests.layer_check                  # every finding, and what the allowance covers
    python -m tests.layer_check --write-config   # rewrite .importlinter from LAYERS/NEVER/allowance
    python -m tests.layer_check --docs           # the table and rules docs/architecture.md shows
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / ".importlinter"
PLUGINS = "plugins"

#: From the top (faces) down to the leaves: a module may import the layers below its own, never
#: above. Prefixes are dotted module paths; the longest matching prefix decides a module's layer
#: (``corerl`` itself, the Python API, is a face; tools/layers.py in shared/ assigns the same way).
LAYERS: list[tuple[str, list[str]]] = [
    ("faces", ["corerl.cli", "corerl.api", "corerl.evaluation.command", "corerl.planning.command"]),
    # corerl.run and corerl.evaluation are the run layer's packages (their modules' old root paths
    # import as aliases: corerl.import_paths.MOVED_MODULES)
    # the algorithm conformance suite drives an algorithm through the run's own code (open, start,
    # steps, checkpoint, resume): it is a test of the run layer, published beside the SDK's suites
    ("run", ["corerl.run", "corerl.evaluation", "corerl.testing.algorithm_conformance"]),
    ("builtin", ["corerl.builtin_plugin"]),
    ("sdk", ["corerl.sdk", "corerl.testing"]),
    ("algorithms", ["corerl.algorithms"]),
    ("asynchronous", ["corerl.asynchronous"]),
    ("environments", ["corerl.environments", "corerl.tasks"]),
    ("planning", ["corerl.planning"]),
    ("reporting", ["corerl.reporting"]),
    ("config", ["corerl.config", "corerl.validation"]),
    ("registry", ["corerl.plugin_manager", "corerl.registry", "corerl.hookspecs", "corerl.component_kinds",
                  "corerl.known_plugins"]),
    ("contracts", ["corerl.training", "corerl.generation", "corerl.distributed", "corerl.packing", "corerl.offload",
                   "corerl.algorithms.contract", "corerl.environments.contract", "corerl.reporting.loggers.contract"]),
    ("schema", ["corerl.config.schema", "corerl.config.fields", "corerl.config.tree", "corerl.config.structure"]),
    ("models", ["corerl.models", "corerl.lora"]),
    ("leaves", ["corerl.errors", "corerl.failures", "corerl.import_paths", "corerl.complete_folders",
                "corerl.checkpoint_safety", "corerl.progress_markers", "corerl.start_up", "corerl.recipes"]),
]

#: What each layer holds, in shared/design.md's words (docs/architecture.md shows the table).
HOLDS: dict[str, str] = {
    "faces": "the command, the Python API, the commands' own modules (`corerl plan`, `corerl eval`)",
    "run": "the run loop and everything that has a run directory: steps, context, resume, checkpoints, "
           "recovery, evaluation during a run",
    "builtin": "the core's own plugin (its registrations), a plugin like any other",
    "sdk": "what plugins import: `corerl.sdk`, `corerl.testing`",
    "algorithms": "the registered algorithms and their math",
    "asynchronous": "buffer, producer, generation worker",
    "environments": "tasks, rewards, environments, tools, rollout, the agent endpoint, the sandbox",
    "planning": "`corerl plan`'s search and memory arithmetic",
    "reporting": "console, metrics, loggers",
    "config": "recipes, dialects, validation and selection",
    "registry": "plugin host, hook specs, registrations, kinds",
    "contracts": "training / generation / distributed / packing / offload contracts and ranks; the algorithm, "
                 "environment and logger contracts",
    "schema": "config field types and helpers",
    "models": "model facts read from a checkpoint, tiny models, adapters: no engine",
    "leaves": "errors, failure lines, import paths, write-once folders, checkpoint safety, progress markers",
}

#: (from, to, why): imports that must never exist, layers or not ("plugins": every corerl_* module).
NEVER: list[tuple[str, str, str]] = [
    ("contracts", "algorithms", "contracts know no algorithm"),
    ("contracts", "run", "contracts know no run"),
    ("config", "algorithms", "validation asks registrations, not algorithm modules"),
    ("asynchronous", "algorithms", "asynchronous knows no algorithm module: shared helpers live below both"),
    ("environments", "algorithms", "environments know no algorithm"),
    ("models", "contracts", "model facts stand below the engines"),
    ("run", PLUGINS, "the core knows no engine"),
    ("config", PLUGINS, "the core knows no engine"),
    (PLUGINS, "run", "plugins never drive a run"),
]

# ---------------------------------------------------------------------------------------------
# The allowance. IT MAY ONLY SHRINK: remove an entry when its import goes (the test fails while a
# stale entry stays); never add one. Each entry: "importer -> imported": why it is still there.
# Every broken rule is an upward import too; the entries marked "rule" break a NEVER rule.
# ---------------------------------------------------------------------------------------------
ALLOWED_IMPORTS: dict[str, str] = {
    "corerl.sdk -> corerl.run.context":
        "RunContext stays importable from corerl.sdk through contract 2.x (deprecated since 2.15: algorithms are typed against RunServices); the export and this entry go with 3.0",
}

#: Circles still closed today (each by a function-level or TYPE_CHECKING import): a circle found
#: must lie inside one of these groups. May only shrink, like ALLOWED_IMPORTS.
ALLOWED_CIRCLES: dict[tuple[str, ...], str] = {}


def layer_of(module: str) -> str | None:
    """The layer (or ``plugins``) of a dotted module name; None where no prefix covers it."""
    if module.startswith("corerl_"):
        return PLUGINS
    if module == "corerl":  # the package's own __init__: the Python API
        return LAYERS[0][0]
    best, best_len = None, -1
    for name, prefixes in LAYERS:
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = name, len(p)
    return best


def rank_of(layer: str | None) -> int | None:
    """0 for the top layer; None for ``plugins`` and no layer."""
    return next((i for i, (name, _) in enumerate(LAYERS) if name == layer), None)


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def source_folders(root: Path) -> list[Path]:
    return [root / "core" / "src", *sorted((root / "plugins").glob("*/src"))]


def read_modules(folders: Iterable[Path]) -> dict[str, Path]:
    """Dotted name -> file of every module under the source folders."""
    mods: dict[str, Path] = {}
    for src in folders:
        for f in sorted(src.rglob("*.py")):
            mods[module_name(f, src)] = f
    return mods


def imports_of(name: str, path: Path, known: set[str]) -> dict[str, int]:
    """The corerl modules ``name`` imports (each with its first line): every import statement in
    the file, wherever it stands. ``from a import b`` is ``a.b`` where that is a module, else ``a``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}

    def resolve(target: str, line: int) -> None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name and target.startswith("corerl"):
            found.setdefault(target, line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                resolve(a.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[: len(up) - (node.level - 1)] if node.level > 1 else up
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                full = f"{base}.{a.name}" if base else a.name
                resolve(full if full in known else base, node.lineno)
    return found


def import_graph(mods: Mapping[str, Path]) -> dict[str, dict[str, int]]:
    known = set(mods)
    return {m: imports_of(m, p, known) for m, p in mods.items()}


def circles(graph: Mapping[str, Iterable[str]]) -> list[tuple[str, ...]]:
    """Groups of two or more modules that reach each other (strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[tuple[str, ...]] = []
    for start in sorted(graph):
        if start in index:
            continue
        # iterative Tarjan: (node, iterator over its targets)
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, targets = work[-1]
            w = next(targets, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                group = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    group.append(x)
                    if x == v:
                        break
                if len(group) > 1:
                    out.append(tuple(sorted(group)))
    return sorted(out)


@dataclass
class Findings:
    circles: list[tuple[str, ...]] = field(default_factory=list)
    #: "importer -> imported" -> why (the NEVER rule)
    broken: dict[str, str] = field(default_factory=dict)
    #: "importer -> imported" -> "importer's layer -> imported's layer"
    upward: dict[str, str] = field(default_factory=dict)
    nowhere: list[str] = field(default_factory=list)


def find(graph: Mapping[str, Iterable[str]]) -> Findings:
    never = {(a, b): why for a, b, why in NEVER}
    out = Findings(circles=circles(graph))
    for m in sorted(graph):
        lm = layer_of(m)
        if lm is None:
            out.nowhere.append(m)
            continue
        for t in sorted(graph[m]):
            lt = layer_of(t)
            if lt is None or lt == lm:
                continue
            edge = f"{m} -> {t}"
            if (lm, lt) in never:
                out.broken[edge] = never[(lm, lt)]
            rm, rt = rank_of(lm), rank_of(lt)
            if rm is not None and rt is not None and rt < rm:
                out.upward[edge] = f"{lm} -> {lt}"
    return out


def problems(found: Findings, allowed_imports: Mapping[str, str] = ALLOWED_IMPORTS,
             allowed_circles: Mapping[tuple[str, ...], str] = ALLOWED_CIRCLES) -> list[str]:
    """What fails the test: every finding the allowance does not cover, every allowance entry that
    no longer matches the code (the lists only shrink), every module on no layer."""
    out = [f"circle: {', '.join(c)}" for c in found.circles
           if not any(set(c) <= set(group) for group in allowed_circles)]
    out += [f"rule broken: {e} ({why})" for e, why in found.broken.items() if e not in allowed_imports]
    out += [f"upward import: {e} ({layers})" for e, layers in found.upward.items()
            if e not in allowed_imports and e not in found.broken]
    out += [f"on no layer: {m} (give it one in tests/layer_check.py's LAYERS, after shared/design.md)"
            for m in found.nowhere]
    out += [f"stale allowance: {e} is no longer an upward import or a broken rule: remove it from "
            "ALLOWED_IMPORTS (the list only shrinks)" for e in allowed_imports
            if e not in found.upward and e not in found.broken]
    for group in allowed_circles:
        inside = [c for c in found.circles if set(c) <= set(group)]
        if not inside:
            out.append(f"stale allowance: no circle left inside {', '.join(group)}: remove it from ALLOWED_CIRCLES")
        elif {m for c in inside for m in c} != set(group):
            now = " and ".join(", ".join(c) for c in inside)
            out.append(f"stale allowance: the circle {', '.join(group)} is now {now}: narrow it in ALLOWED_CIRCLES")
    return out


def check(folders: Iterable[Path] | None = None) -> tuple[Findings, dict[str, dict[str, int]]]:
    graph = import_graph(read_modules(source_folders(REPO) if folders is None else folders))
    return find(graph), graph


# -- the import-linter contracts, generated from the same data --------------------------------


def covers(modules: Iterable[str]) -> tuple[dict[str, list[str]], list[str]]:
    """Each layer (and ``plugins``) as import-linter needs it: the fewest modules whose whole
    subtree lies on that layer (import-linter counts a package with all its descendants). A
    package whose descendants lie on other layers (``corerl.algorithms`` holds the contracts'
    ``algorithms.contract``) cannot be named without them: those packages' own ``__init__`` are
    returned apart, checked by the ast check alone."""
    mods = sorted(modules)
    layer = {m: layer_of(m) for m in mods}
    subtree_layers: dict[str, set[str | None]] = {m: set() for m in mods}
    for m in mods:
        parts = m.split(".")
        for i in range(1, len(parts) + 1):
            a = ".".join(parts[:i])
            if a in subtree_layers:
                subtree_layers[a].add(layer[m])
    cover: dict[str, set[str]] = {}
    apart: list[str] = []
    for m in mods:
        if layer[m] is None:
            continue
        if subtree_layers[m] != {layer[m]}:
            apart.append(m)
            continue
        top = m
        while "." in top:
            parent = top.rpartition(".")[0]
            if parent not in subtree_layers or subtree_layers[parent] != {layer[m]}:
                break
            top = parent
        cover.setdefault(layer[m], set()).add(top)  # type: ignore[arg-type]
    return {k: sorted(v) for k, v in cover.items()}, apart


def importlinter_config(graph: Mapping[str, Iterable[str]], allowed_imports: Mapping[str, str] = ALLOWED_IMPORTS) -> str:
    found = find(graph)
    cover, apart = covers(graph)
    roots = sorted({m.split(".")[0] for m in graph})
    plugin_roots = [r for r in roots if r.startswith("corerl_")]

    def block(key: str, items: Iterable[str]) -> list[str]:
        items = list(items)
        return [f"{key} =", *(f"    {i}" for i in items)] if items else []

    lines = [
        "# corerl's import contracts for import-linter (`lint-imports`; tests/test_layers.py runs them).",
        "# GENERATED by `python -m tests.layer_check --write-config` from tests/layer_check.py, which",
        "# restates shared/design.md's layers: edit there, then regenerate (a test checks this file is current).",
        "# Imports inside functions and under TYPE_CHECKING count (import-linter reads every import statement).",
        "# The ignore_imports are tests/layer_check.py's ALLOWED_IMPORTS (each with its reason there): they may only shrink.",
        "# Checked by the ast check alone: packages whose descendants lie on other layers, which",
        "# import-linter cannot name without them: " + ", ".join(apart) + ".",
        "",
        "[importlinter]",
        *block("root_packages", roots),
        "",
        "[importlinter:contract:layers]",
        "name = corerl's layers, top to bottom (shared/design.md): a module imports only the layers below its own",
        "type = layers",
        "layers =",
    ]
    for name, _ in LAYERS:
        if cover.get(name):
            lines.append(f"    {' : '.join(cover[name])}")
    lines += block("ignore_imports", sorted(e for e in allowed_imports if e in found.upward))
    for a, b, why in NEVER:
        edges = sorted(e for e in allowed_imports if found.broken.get(e) == why
                       and (layer_of(e.split(" -> ")[0]), layer_of(e.split(" -> ")[1])) == (a, b))
        lines += ["", f"[importlinter:contract:never-{a}-{b}]",
                  f"name = never {a} -> {b}: {why}", "type = forbidden",
                  *block("source_modules", plugin_roots if a == PLUGINS else cover.get(a, [])),
                  *block("forbidden_modules", plugin_roots if b == PLUGINS else cover.get(b, [])),
                  "allow_indirect_imports = True", *block("ignore_imports", edges)]
    lines += ["", "[importlinter:contract:plugins-independent]",
              "name = the first-party plugins never import each other", "type = independence",
              *block("modules", plugin_roots)]
    return "\n".join(lines) + "\n"


def picture() -> str:
    """The layers and the rules as docs/architecture.md shows them (a test keeps the page current)."""
    lines = ["| layer | holds | modules (the longest prefix decides) |", "| --- | --- | --- |"]
    for name, prefixes in LAYERS:
        mods = ", ".join(f"`{p}`" for p in (["corerl"] if name == LAYERS[0][0] else []) + prefixes)
        lines.append(f"| {name} | {HOLDS[name]} | {mods} |")
    lines += ["", "Never, whatever the layers say:", ""]
    lines += [f"- {a} -> {b}: {why}" for a, b, why in NEVER]
    return "\n".join(lines) + "\n"


def allowance_line() -> str:
    """The allowance's size as docs/architecture.md states it."""
    return (f"The allowance holds {len(ALLOWED_IMPORTS)} imports and {len(ALLOWED_CIRCLES)} circles")


def main(argv: list[str]) -> int:
    if "--docs" in argv:
        print(picture() + "\n" + allowance_line())
        return 0
    found, graph = check()
    if "--write-config" in argv:
        CONFIG.write_text(importlinter_config(graph), encoding="utf-8")
        print(f"wrote {CONFIG.relative_to(REPO)}")
        return 0
    for c in found.circles:
        print(f"circle: {', '.join(c)}")
    for e, why in found.broken.items():
        print(f"rule broken: {e} ({why})")
    for e, layers in found.upward.items():
        print(f"upward: {e} ({layers})")
    for m in found.nowhere:
        print(f"on no layer: {m}")
    left = problems(found)
    print(f"circles {len(found.circles)}, rules broken {len(found.broken)}, upward imports {len(found.upward)}, "
          f"modules on no layer {len(found.nowhere)}; allowance: {len(ALLOWED_IMPORTS)} imports, "
          f"{len(ALLOWED_CIRCLES)} circles; problems {len(left)}")
    for p in left:
        print(f"PROBLEM {p}")
    return 1 if left else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
