"""The test tiers of the whole workspace.

- ``gpu``: tests of real CUDA paths, skipped with the reason where torch sees no GPU.
- ``slow``: tests that start something expensive: a subprocess (a CLI run, a pip install), a
  process of a multiprocessing pool (a vLLM engine), or a Ray runtime (every world-size-2
  group). The mark is given by what a test was seen to start, not by hand: ``tests/slow_tests.txt``
  lists those tests and the fixtures that started such a thing (every test using one of those
  fixtures is slow too). ``pytest --update-tiers`` rewrites the list from what the run saw; a
  run of the fast tier (``-m "not slow"``) fails a test that starts one of them unlisted,
  naming what it started, so the fast tier cannot slow down unnoticed.

Order: the tests run longest scope first (a scope is what pytest-xdist's ``--dist loadscope`` hands a
worker whole: a class, or a module's functions), by the seconds ``tests/slow_durations.json``
records; scopes it does not know keep their place after the known ones. Two workers that take
the longest scopes first end together; in collection order a 5-minute test could start last
and leave the other worker idle. ``pytest --record-durations`` rewrites the file from the run
(setup, call and teardown of every test of over half a second).
"""

from __future__ import annotations

import json
import multiprocessing.process
import subprocess
from pathlib import Path
from typing import Any

import pytest

TIERS = Path(__file__).parent / "tests" / "slow_tests.txt"
DURATIONS = Path(__file__).parent / "tests" / "slow_durations.json"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-tiers", action="store_true",
                     help=f"rewrite {TIERS.relative_to(Path(__file__).parent)} from what this run's tests start")
    parser.addoption("--record-durations", action="store_true",
                     help=f"rewrite {DURATIONS.relative_to(Path(__file__).parent)} (the order tests run in) "
                          "from this run's durations")


class _Starts:
    """What the current test or fixture started, seen through the three ways in."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.originals: tuple[Any, ...] = ()

    def install(self) -> None:
        import platform

        # platform's processor name is read once per process through `uname -p` (MLflow asks for it
        # when imported, and DeepSpeed imports MLflow where it is installed): read it before the watch
        platform.processor()
        popen_init, process_start = subprocess.Popen.__init__, multiprocessing.process.BaseProcess.start
        self.originals = (popen_init, process_start)

        def popen(this: Any, args: Any, *rest: Any, **kwargs: Any) -> None:
            self.seen.append(f"a subprocess ({str(args)[:60]})")
            popen_init(this, args, *rest, **kwargs)

        def start(this: Any) -> None:
            self.seen.append("a multiprocessing process")
            process_start(this)

        subprocess.Popen.__init__ = popen  # type: ignore[method-assign]
        multiprocessing.process.BaseProcess.start = start  # type: ignore[method-assign]
        try:
            from corerl.distributed import worker_group
        except ImportError:
            return
        from tests.ray_nodes import joining_the_shared_head

        ensure_ray = worker_group.ensure_ray
        joining = joining_the_shared_head(ensure_ray)  # no local runtime in a test process

        def ray(*args: Any, **kwargs: Any) -> Any:
            self.seen.append("a Ray runtime")
            return joining(*args, **kwargs)

        worker_group.ensure_ray = ray
        self.originals += (ensure_ray,)

    def uninstall(self) -> None:
        subprocess.Popen.__init__, multiprocessing.process.BaseProcess.start = self.originals[:2]  # type: ignore[method-assign]
        if len(self.originals) > 2:
            from corerl.distributed import worker_group

            worker_group.ensure_ray = self.originals[2]


STARTS = _Starts()
GC_BEFORE: list[tuple[int, int, int]] = []  # the garbage collector's thresholds before each configure
RECORDED: set[str] = set()  # test ids and "fixture:<name>" entries seen starting something


def _listed() -> set[str]:
    if not TIERS.exists():
        return set()
    return {line.strip() for line in TIERS.read_text().splitlines() if line.strip() and not line.startswith("#")}


def pytest_configure(config: pytest.Config) -> None:
    import gc

    from corerl.start_up import START_UP_THRESHOLD

    # a test process imports torch, transformers and the backends and builds models all along: few
    # garbage collections, as a corerl process has while it starts (the fast tier: 140 s of CPU, 122)
    GC_BEFORE.append(gc.get_threshold())
    gc.set_threshold(START_UP_THRESHOLD, *GC_BEFORE[-1][1:])
    _warm_matplotlib_font_cache()
    STARTS.install()


def _warm_matplotlib_font_cache() -> None:
    """matplotlib lists the system's fonts with ``fc-list`` (a subprocess) the first time it runs
    on a machine, and writes its cache: done here, before the fast tier's subprocess guard, so
    that whichever test draws curves.png first on a fresh machine is not failed for it."""
    import matplotlib  # one of corerl's dependencies (core/pyproject.toml)

    matplotlib.use("Agg")
    import matplotlib.font_manager  # noqa: F401 - builds (or reads) the font cache


def pytest_unconfigure(config: pytest.Config) -> None:
    import gc

    STARTS.uninstall()  # a pytest run inside this one (tests/test_tiers.py) leaves the process as it was
    gc.set_threshold(*GC_BEFORE.pop())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # a test that another covers where its condition holds is deselected there: a skip means
    # "cannot run here", not "run elsewhere"
    covered = [item for item in items if any(mark.args and mark.args[0] for mark in item.iter_markers("covered_elsewhere"))]
    if covered:
        config.hook.pytest_deselected(items=covered)
        items[:] = [item for item in items if item not in covered]
    listed = _listed()
    slow_fixtures = {entry.split(":", 1)[1] for entry in listed if entry.startswith("fixture:")}
    for item in items:
        if item.nodeid in listed or slow_fixtures & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    if DURATIONS.exists():
        items[:] = longest_scopes_first(items, json.loads(DURATIONS.read_text()))
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch sees none); run `bash scripts/test.sh -m gpu` on a GPU machine")
    for item in gpu_items:  # the end-to-end runs a CPU can run have CPU cases of their own (tests/test_gpu_runs.py)
        item.add_marker(skip)


def scope_of(nodeid: str) -> str:
    """What ``--dist loadscope`` hands one worker: a test's class, or its module."""
    return nodeid.rsplit("::", 1)[0]


def longest_scopes_first(items: list[pytest.Item], seconds: dict[str, float]) -> list[pytest.Item]:
    """``items`` by their scope's recorded seconds, longest first; within a scope, and between
    scopes of equal seconds (those not recorded), in collection order."""
    total: dict[str, float] = {}
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        scope = scope_of(item.nodeid)
        total[scope] = total.get(scope, 0.0) + seconds.get(item.nodeid, 0.0)
        first.setdefault(scope, index)
    order = sorted(range(len(items)), key=lambda i: (-total[scope_of(items[i].nodeid)],
                                                     first[scope_of(items[i].nodeid)], i))
    return [items[i] for i in order]


SECONDS: dict[str, float] = {}  # --record-durations: setup + call + teardown of each test that ran


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    SECONDS[report.nodeid] = SECONDS.get(report.nodeid, 0.0) + report.duration


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest) -> Any:
    before = len(STARTS.seen)
    yield
    if len(STARTS.seen) > before:
        RECORDED.add(f"fixture:{fixturedef.argname}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    before = len(STARTS.seen)
    outcome = yield
    started = STARTS.seen[before:]
    if not started:
        return
    RECORDED.add(item.nodeid)
    fast_tier = "not slow" in (item.config.getoption("markexpr") or "")
    if fast_tier and not item.get_closest_marker("slow") and not item.config.getoption("update_tiers"):
        outcome.force_exception(pytest.fail.Exception(
            f"{item.nodeid} started {started[0]} in the fast tier: run `pytest --update-tiers` once to list it "
            f"in {TIERS.name} (the slow tier)", pytrace=False))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if session.config.getoption("record_durations") and not hasattr(session.config, "workerinput"):
        # the controller of pytest-xdist's workers, or the one process: it sees every test's reports
        recorded = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
        root = session.config.rootpath
        recorded = {nodeid: s for nodeid, s in recorded.items() if (root / nodeid.split("::")[0]).exists()}
        recorded.update({nodeid: round(s, 1) for nodeid, s in SECONDS.items() if s >= 0.5})
        DURATIONS.write_text(json.dumps(dict(sorted(recorded.items())), indent=0) + "\n")
    if not session.config.getoption("update_tiers"):
        return
    ran = {item.nodeid for item in session.items}
    kept = {entry for entry in _listed() if entry.startswith("fixture:") or entry not in ran}
    lines = sorted(kept | RECORDED)
    TIERS.write_text("# tests and fixtures seen starting a subprocess, a process or a Ray runtime (the slow tier);\n"
                     "# written by `pytest --update-tiers`, read by conftest.py\n" + "".join(f"{x}\n" for x in lines))
