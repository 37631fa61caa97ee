"""``code``: one turn, the model's Python run against the row's tests in a sandbox
(:mod:`corerl.environments.sandbox`); the reward is 1 when every test passes, else 0.

A row carries HumanEval's fields (the ``humaneval`` task gives them): ``prompt`` (the function's
signature and docstring), ``test`` (a ``check(candidate)`` function) and ``entry_point`` (the
function's name). The program run is ``prompt``, the model's code, ``test`` and
``check(entry_point)``. The model's code is its first fenced Python block that defines the entry
point (else its first fenced block); without a fenced block the whole completion, which then
continues the prompt's function body, as HumanEval expects.

This module imports nothing beyond attrs and the standard library (registering it is cheap).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs

from corerl.config.fields import setting
from corerl.environments.contract import EnvironmentContext, EnvironmentSettings, EpisodeView, Turn
from corerl.environments.sandbox import SandboxResult
from corerl.environments.sandboxes import AUDIT_LIMITS, AUTO, SandboxRunner, runner_for


@attrs.define(kw_only=True)
class CodeSettings(EnvironmentSettings):
    """``env.code``: the sandbox each completion runs in."""

    sandbox_timeout_s: float = setting(10.0, min=0.0, min_exclusive=True,
                                       help="wall-clock seconds one program may run; then it is killed and scores 0 "
                                            "(keep it below env.code.timeout_s)")
    memory_mb: int = setting(1024, min=64, help="address-space limit of the program (RLIMIT_AS), in MiB")
    max_processes: int = setting(32, min=1, help="processes the program may have at once (RLIMIT_NPROC)")
    workers: int = setting(2, min=1, help="sandboxes run at once in this process")
    isolation: str = setting(AUTO, help="the sandbox the code runs in (corerl plugins lists them): auto, the best "
                                        "contained one available (namespaces), else the run is refused; audit only "
                                        f"when named, {AUDIT_LIMITS} (docs/security.md)")


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_code(completion: str, entry_point: str) -> str:
    """The code to run from a completion (see the module's docstring)."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(completion)]
    blocks = [(lang, body) for lang, body in blocks if lang in ("", "python", "py", "python3")]
    if not blocks:
        return completion
    defining = [body for _, body in blocks if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", body, re.M)]
    return "\n" + (defining or [blocks[0][1]])[0]


def program(completion: str, row: Mapping[str, Any]) -> str:
    """The whole program that scores ``completion`` on ``row``: prompt, code, tests, the check."""
    entry_point = str(row["entry_point"])
    code = extract_code(completion, entry_point)
    return f"{row['prompt']}{code}\n\n{row['test']}\n\ncheck({entry_point})\n"


class CodeScorer:
    """Runs completions against their rows' tests, at most ``workers`` sandboxes at once."""

    def __init__(self, *, timeout_s: float = 10.0, memory_mb: int = 1024, max_processes: int = 32,
                 workers: int = 2, runner: SandboxRunner | None = None) -> None:
        self.timeout_s, self.memory_mb, self.max_processes, self.workers = timeout_s, memory_mb, max_processes, workers
        self.runner = runner if runner is not None else runner_for(AUTO)
        self.slots = threading.BoundedSemaphore(workers)

    def run(self, completion: str, row: Mapping[str, Any]) -> SandboxResult:
        """One completion's sandboxed run."""
        with self.slots:
            return self.runner.run(program(completion, row), timeout_s=self.timeout_s, memory_mb=self.memory_mb,
                                   max_processes=self.max_processes)

    def score(self, completion: str, row: Mapping[str, Any]) -> float:
        """1.0 when every test passes, else 0.0."""
        return 1.0 if self.run(completion, row).passed else 0.0

    def run_many(self, completions: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> list[SandboxResult]:
        """Several runs, ``workers`` at a time, in order."""
        with ThreadPoolExecutor(self.workers) as pool:
            return list(pool.map(self.run, completions, rows))


class CodeEnvironment:
    """Scores the model's one turn by running it against the row's tests (see the module's docstring)."""

    def __init__(self, context: EnvironmentContext) -> None:
        settings = context.settings if context.settings is not None else CodeSettings()
        self.scorer = CodeScorer(timeout_s=settings.sandbox_timeout_s, memory_mb=settings.memory_mb,
                                 max_processes=settings.max_processes, workers=settings.workers,
                                 runner=runner_for(settings.isolation))

    def step(self, episode: EpisodeView) -> Turn:
        return Turn(reward=self.scorer.score(episode.response, episode.row), done=True)


_DEFAULT: list[CodeScorer] = []


def humaneval_tests(completion: str, example: Mapping[str, Any]) -> float:
    """The ``humaneval_tests`` reward: 1.0 when the completion passes the row's tests in the
    best contained sandbox available (default limits: 10 s, 1 GiB, 32 processes), else 0.0."""
    if not _DEFAULT:
        _DEFAULT.append(CodeScorer())
    return _DEFAULT[0].score(completion, example)
