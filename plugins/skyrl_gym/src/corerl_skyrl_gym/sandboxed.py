"""skyrl-gym's ``lcb`` with its tests run in corerl's sandbox.

skyrl-gym's ``LCBEnv`` scores a turn with ``compute_score``: the last fenced code block of the
turn, run against the row's tests by ``lcb_check_correctness`` in a ``multiprocessing.Process`` of
the caller's (no sandbox), 1.0 when every test passes. Here the episode's environment is wrapped
(:class:`SandboxedLCB`): its ``step`` does the same, but the tests run as one Python program in
the sandbox ``env.skyrl_gym.isolation`` names (corerl's registered sandboxes; ``auto``: the best
contained one available). The program is skyrl-gym's own grading module, given to the sandbox as
a file (it imports nothing outside Python's standard library), and a short driver of ours that
calls its ``run_test`` on the row's tests, as ``lcb_check_correctness``'s process does, and
writes each test's result behind a random tag, with ``os.write`` bound before the code runs; the
verdict (every result ``True``) is reached in corerl's process, so that neither what the code
prints nor a builtin it patches (``all``, ``json``) passes for it (code that reaches into the
grader's frames can forge the results, as it can forge the list skyrl-gym's process hands
back). What stays
in this process is what runs no model code: finding the code block, reading the tests
(``postprocess_lcb_sample``, whose assertion on a malformed row is the episode's error, as in
SkyRL).

The same reward for the same code, with three differences, each in the code's disfavour:

- the sandbox's limits: ``env.skyrl_gym.sandbox_memory_mb`` of address space (skyrl-gym sets
  none), :data:`MAX_PROCESSES` processes, a 64 MiB cap on a written file, no network, nothing
  outside its own folder;
- the sandbox sees Python's own install only, not this environment's packages: skyrl-gym's
  prelude imports ``numpy`` and ``pandas`` for the code where they import there (a sandbox that
  shows them), and leaves them out where they do not, so code using ``np`` or ``pd`` fails here;
- the whole run is cut at skyrl-gym's own limit (``(6 + 1) * tests + 5`` seconds) plus
  :data:`START_S` for the sandbox to start.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

from corerl.sdk import ConfigError

#: the classes whose code runs in corerl's sandbox unless env.skyrl_gym.allow_unsandboxed_code
SANDBOXED = {"lcb"}
#: the sandbox key of the section, and how a recipe opts into the audit mode
ISOLATION_KEY = "env.skyrl_gym.isolation"
OPT_IN = f"{ISOLATION_KEY}=audit"
#: skyrl-gym's per-test limit in seconds (``lcb_check_correctness``'s default)
TEST_TIMEOUT_S = 6
#: seconds the sandbox is given to start, past skyrl-gym's own limit
START_S = 2.0
#: processes the program may have at once (skyrl-gym's guard takes fork away anyway)
MAX_PROCESSES = 32
#: the names of the files the program reads in its folder
GRADER, CASE = "livecodebench.py", "lcb_case.json"

#: the program run in the sandbox: skyrl-gym's run_test on the case, the verdict behind the tag
DRIVER = f'''
import importlib.util, json, os, sys


def _grade():  # the case in this function's frame, not in the module the code can import
    write = os.write  # bound before the code runs: it cannot swap what writes the verdict
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    with open(os.path.join(here, "{CASE}"), encoding="utf-8") as handle:
        case = json.load(handle)
    os.remove(os.path.join(here, "{CASE}"))  # the tag is not left for the code to read
    try:
        import _posixsubprocess  # unittest.mock, which the grader imports, imports subprocess
    except PermissionError:  # the audit mode's hook refuses it: a stand-in that starts nothing
        import types

        def refused(*args, **kwargs):
            raise PermissionError("sandbox: starting a process is not allowed")
        sys.modules["_posixsubprocess"] = types.ModuleType("_posixsubprocess")
        sys.modules["_posixsubprocess"].fork_exec = refused
    import livecodebench as grader
    for line in ("import numpy as np\\n", "import pandas as pd\\n"):  # the prelude's, where they import
        if importlib.util.find_spec(line.split()[1]) is None:
            grader.import_string = grader.import_string.replace(line, "")
    results, _ = grader.run_test(case["sample"], test=case["code"], debug=False, timeout=case["timeout"])
    # each result as it is (True: passed), judged in corerl's process: no builtin the code could
    # patch (all, json) decides the verdict here
    marks = " ".join("T" if r is True else "F" for r in results)
    write(1, ("\\n" + case["tag"] + " " + marks + "\\n").encode())


_grade()
'''


def sandbox_runner(isolation: str) -> Any:
    """The runner of the sandbox ``isolation`` names (``auto``: the best contained one available
    here), from this process's plugins; a :class:`ConfigError` at ``env.skyrl_gym.isolation``
    saying why there is none, its hint naming the opt-in."""
    from corerl.sdk.environments import (
        sandbox_runner as choose,  # contract 2.17, which this plugin states
    )

    try:
        return choose(isolation, key=ISOLATION_KEY, opt_in=OPT_IN)
    except ConfigError as error:  # a named sandbox's refusal: said at this section's key
        if error.key == ISOLATION_KEY:
            raise
        raise ConfigError(error.message, key=ISOLATION_KEY,
                          hint=(error.hint or "").replace(str(error.key), ISOLATION_KEY) or None) from None


class LCBScorer:
    """Scores a turn as skyrl-gym's ``compute_score`` does, its tests run in ``runner``'s sandbox."""

    def __init__(self, runner: Any, memory_mb: int) -> None:
        from skyrl_gym.envs.lcb import livecodebench

        self.runner, self.memory_mb = runner, memory_mb
        self.grading = livecodebench
        self.grader = Path(livecodebench.__file__).read_text(encoding="utf-8")

    def score(self, response: str, tests: list[dict[str, Any]]) -> tuple[str | None, float]:
        """The code found in ``response`` and its reward: 1.0 when it passes every test, else 0.0."""
        code = self.grading.extract_code_from_model(response)
        if code is None:
            return None, 0.0
        if not tests:  # skyrl-gym's own check (an assert in lcb_check_correctness)
            raise ValueError("the row's reward_spec.ground_truth holds no test: lcb needs at least one")
        sample = self.grading.postprocess_lcb_sample(tests)
        return code, 1.0 if self.passes(code, sample) else 0.0

    def passes(self, code: str, sample: dict[str, str]) -> bool:
        """Whether ``code`` passes every test of ``sample`` (skyrl-gym's ``input_output`` layout)."""
        tag = secrets.token_hex(16)
        case = {"sample": sample, "code": code, "timeout": TEST_TIMEOUT_S, "tag": tag}
        tests = len(json.loads(sample["input_output"])["inputs"])
        result = self.runner.run(DRIVER, timeout_s=(TEST_TIMEOUT_S + 1) * tests + 5 + START_S,
                                 memory_mb=self.memory_mb, max_processes=MAX_PROCESSES,
                                 files={GRADER: self.grader, CASE: json.dumps(case)})
        verdicts = [line.split()[1:] for line in result.stdout.splitlines() if line.startswith(tag + " ")]
        if not verdicts and not result.timed_out and result.why.startswith("corerl-sandbox:"):
            raise RuntimeError(f"the sandbox ({result.isolation}) could not run lcb's tests: {result.why}")
        # every test's result True, as skyrl-gym's own check reads run_test's list
        return bool(verdicts) and all(mark == "T" for mark in verdicts[-1])


class SandboxedLCB:
    """An episode's skyrl-gym ``LCBEnv`` whose ``step`` runs the tests in the sandbox (see the
    module's docstring); ``init`` and ``close`` are the environment's own."""

    def __init__(self, env: Any, scorer: LCBScorer) -> None:
        self.env, self.scorer = env, scorer

    def init(self, prompt: Any) -> Any:
        return self.env.init(prompt)

    def step(self, action: str) -> dict[str, Any]:
        code, reward = self.scorer.score(action, self.env.tests)
        return {"observations": [], "reward": reward, "done": True, "metadata": {"parsed_code": code}}

    def close(self) -> None:
        self.env.close()

    def __repr__(self) -> str:
        return f"{self.env!r} (tests in the sandbox)"
