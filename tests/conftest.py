"""Shared helpers: running the real ``corerl`` command in a subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
#: frozen copies of outside plugins with their own tests (tests/test_compat_plugins.py installs
#: them and runs those in a pytest of their own): never collected with the project's tests
collect_ignore_glob = ["compat/*"]
EXAMPLES = REPO / "examples" / "configs"
CORERL = Path(sys.executable).with_name("corerl")


def clean_env(extra: Mapping[str, str] | None = None, base: Mapping[str, str] | None = None,
              shared_ray: bool = True) -> dict[str, str]:
    """The environment without any CORERL_* variable, plus ``extra``; a run started with it joins
    this test process's shared Ray head (``tests/ray_nodes.py``) unless ``extra`` sets what that
    head's workers would not see (a ``PYTHONPATH``, its own ``RAY_ADDRESS``: then a local runtime)
    or ``shared_ray`` is false (a check that this machine, not a cluster, has no GPU; a check of a
    local runtime's own clean-up; an environment a helper adds a ``PYTHONPATH`` to afterwards, as
    ``FakeSite.env`` does)."""
    from tests.ray_nodes import SHARED_HEAD_ENV, shared_head_address

    env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith("CORERL_")}
    env.update(extra or {})
    # corerl hands its CORERL_* variables to its actors itself (corerl.distributed.run_variables)
    travels = all(k.startswith("CORERL_") or SHARED_HEAD_ENV.get(k) == v for k, v in (extra or {}).items())
    if shared_ray and base is None and travels and "RAY_ADDRESS" not in env:
        env.update({"RAY_ADDRESS": shared_head_address(), "RAY_AUTH_MODE": "disabled", **SHARED_HEAD_ENV})
    return env


def install_copies(packages: Mapping[str, Path], folder: Path) -> tuple[Path, Path]:
    """Outside packages as their authors' users would have them: each source folder of
    ``packages`` copied outside the repository to ``folder/copies/<name>`` and all of them
    pip-installed in one pip call into ``folder/site`` (a folder of their own: a test puts it on
    ``PYTHONPATH``, so the project's .venv and every other test never see them). Built from copies:
    setuptools writes *.egg-info into the source tree, which would make a package look installed
    to every later test. The copies' folder and the install folder."""
    import shutil

    copies = folder / "copies"
    for name, source in packages.items():
        shutil.copytree(source, copies / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    target = folder / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--target", str(target), *(str(copies / name) for name in packages)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return copies, target


class CliResult:
    def __init__(self, proc: subprocess.CompletedProcess[str]) -> None:
        self.code = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr

    def json(self) -> Any:
        return json.loads(self.out)

    def __repr__(self) -> str:
        return f"exit {self.code}\nstdout:\n{self.out}\nstderr:\n{self.err}"


def corerl_env(args: tuple[str, ...], extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of ``corerl *args`` (plus ``extra``): a ``corerl run`` joins the shared Ray
    head (:func:`clean_env`), any other command (``validate`` judges GPU-only options by this
    machine where no cluster is named) sees no cluster."""
    return clean_env(extra, shared_ray=args[:1] == ("run",))


def run_corerl(*args: str, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> CliResult:
    """Run the installed ``corerl`` console script, in :func:`corerl_env` unless ``env`` is given."""
    env = dict(env) if env is not None else corerl_env(args)
    proc = subprocess.run(
        [str(CORERL), *args], capture_output=True, text=True, env=env,
        cwd=cwd or REPO, timeout=600,
    )
    return CliResult(proc)


class StartedRun:
    """A ``corerl`` command started by :class:`RunsBeside`; :meth:`result` waits for it."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    def result(self) -> CliResult:
        out, err = self.proc.communicate(timeout=600)
        return CliResult(subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err))


class RunsBeside:
    """``corerl`` commands a test starts to go on beside its other runs, in the time those spend
    waiting (actors starting, a process killed and started again, a call running into its
    timeout), rather than after them (:func:`runs_beside`). When the test ends, a command still
    running is killed and one still waiting for its marker is never started."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.threads: list[threading.Thread] = []
        self.ended = threading.Event()

    def start(self, *args: str, extra_env: Mapping[str, str] | None = None) -> StartedRun:
        """``corerl *args`` now, in :func:`corerl_env` (plus ``extra_env``)."""
        proc = subprocess.Popen([str(CORERL), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=corerl_env(args, extra_env), cwd=REPO, start_new_session=True)
        self.procs.append(proc)
        return StartedRun(proc)

    def start_at(self, markers: Path, marker: str, *args: str,
                 extra_env: Mapping[str, str] | None = None) -> Callable[[], StartedRun]:
        """:meth:`start` once ``markers`` (another run's progress markers) holds ``marker``; the
        call returned waits for that start and gives the run."""
        started: list[StartedRun] = []

        def watch() -> None:
            while not self.ended.is_set():
                if marker in markers_written(markers):
                    started.append(self.start(*args, extra_env=extra_env))
                    return
                self.ended.wait(0.2)

        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        self.threads.append(thread)

        def run() -> StartedRun:
            thread.join(timeout=600)
            assert started, f"{marker!r} never appeared in {markers}"
            return started[0]

        return run

    def end(self) -> None:
        self.ended.set()
        for thread in self.threads:
            thread.join()
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):  # it may have ended since
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()


@pytest.fixture
def runs_beside() -> Iterator[RunsBeside]:
    """:class:`RunsBeside` for one test."""
    runs = RunsBeside()
    try:
        yield runs
    finally:
        runs.end()


def start_held(tmp_path: Path, markers: Path, hold: str, args: list[str], **popen: Any) -> subprocess.Popen[str]:
    """``corerl run`` (run name ``killed``) in a session of its own, writing its progress markers to
    ``markers`` and stopping at the marker ``hold`` until it is killed."""
    env = clean_env({"CORERL_PROGRESS_MARKERS": str(markers), "CORERL_TEST_HOLD_AT": hold})
    popen = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, **popen}
    return subprocess.Popen([str(CORERL), "run", f"run.output_dir={tmp_path}", "run.name=killed", *args],
                            text=True, env=env, cwd=REPO, start_new_session=True, **popen)


def markers_written(markers: Path) -> list[str]:
    """The progress markers a run has written to ``markers`` so far (none before the file exists)."""
    return markers.read_text().splitlines() if markers.exists() else []


def wait_for_marker(markers: Path, name: str, proc: subprocess.Popen[str], seconds: float = 300) -> None:
    """Wait until the run ``proc`` writes the progress marker ``name`` (fail if it ends first)."""
    import time

    deadline = time.monotonic() + seconds
    while name not in markers_written(markers):
        if proc.poll() is not None:
            output = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"the run ended (exit {proc.returncode}) before reaching {name}:\n{output}")
        assert time.monotonic() < deadline, f"the run did not reach {name}"
        time.sleep(0.02)


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    """A small valid recipe file."""
    path = tmp_path / "recipe.yaml"
    path.write_text("cluster:\n  gpus_per_node: 2\npolicy:\n  model_name: some/model\n", encoding="utf-8")
    return path
