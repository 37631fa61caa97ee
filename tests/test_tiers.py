"""The test tiers of conftest.py: a test that starts a subprocess is slow, and the fast tier
refuses one that is not listed as such; tests run longest scope first, by recorded durations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[1]
STARTS = """
import subprocess

def test_starts_a_subprocess():
    subprocess.run(["true"], check=True)

def test_starts_nothing():
    assert 1 + 1 == 2
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest((REPO / "conftest.py").read_text(encoding="utf-8"))
    pytester.mkdir("tests")
    pytester.makepyfile(test_tiny=STARTS)
    return pytester


def test_the_fast_tier_fails_a_test_that_starts_a_subprocess_unlisted(suite):
    result = suite.runpytest_inprocess("-m", "not slow", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_starts_a_subprocess started a subprocess*in the fast tier*--update-tiers*"])


def test_update_tiers_lists_it_and_the_fast_tier_then_leaves_it_to_the_slow_tier(suite):
    suite.runpytest_inprocess("--update-tiers", "-p", "no:cacheprovider").assert_outcomes(passed=2)
    listed = (suite.path / "tests" / "slow_tests.txt").read_text().splitlines()
    assert "test_tiny.py::test_starts_a_subprocess" in listed and "test_tiny.py::test_starts_nothing" not in listed
    suite.runpytest_inprocess("-m", "not slow", "-p", "no:cacheprovider").assert_outcomes(passed=1, deselected=1)
    suite.runpytest_inprocess("-m", "slow", "-p", "no:cacheprovider").assert_outcomes(passed=1, deselected=1)


LONG_AND_SHORT = """
def test_short():
    pass

class TestLong:
    def test_one(self):
        pass

    def test_two(self):
        pass
"""
#: an injected clock for the durations the conftest records: the seconds each test's call phase
#: reports (its setup and teardown 0), so what is recorded and the order do not hang on the load
DURATIONS = """


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    report.duration = {"test_one": 0.6, "test_two": 0.4}.get(item.name, 0.0) if report.when == "call" else 0.0
"""
OTHER = """
def test_unrecorded():
    pass
"""


def test_tests_run_longest_scope_first_by_the_recorded_durations(pytester: pytest.Pytester):
    pytester.makeconftest((REPO / "conftest.py").read_text(encoding="utf-8") + DURATIONS)
    pytester.mkdir("tests")
    pytester.makepyfile(test_a=OTHER, test_b=LONG_AND_SHORT)
    before = pytester.runpytest_inprocess("--collect-only", "-q", "-p", "no:cacheprovider").stdout.lines
    assert [line for line in before if "::" in line][:2] == ["test_a.py::test_unrecorded", "test_b.py::test_short"]

    pytester.runpytest_inprocess("--record-durations", "-p", "no:cacheprovider").assert_outcomes(passed=4)
    recorded = json.loads((pytester.path / "tests" / "slow_durations.json").read_text())
    assert recorded == {"test_b.py::TestLong::test_one": 0.6}  # 0.5 s and more: test_two's 0.4 is not kept
    after = pytester.runpytest_inprocess("--collect-only", "-q", "-p", "no:cacheprovider").stdout.lines
    # the class first (its scope's seconds), its tests in their order; the unrecorded scopes after, in theirs
    assert [line for line in after if "::" in line] == [
        "test_b.py::TestLong::test_one", "test_b.py::TestLong::test_two", "test_a.py::test_unrecorded",
        "test_b.py::test_short"]
