"""skyrl-gym's ``lcb`` played with its tests in corerl's sandbox (corerl_skyrl_gym.sandboxed): the
same reward as skyrl-gym's own ``compute_score`` for the same code, code that tries to escape
contained, and a recipe refused only where no contained sandbox is available."""

from __future__ import annotations

import json
import socket
import time

import pytest

from corerl.sdk import ConfigError, ConfigErrors, EnvironmentContext, EpisodeView
from corerl.testing import select_for, write_recipe
from corerl_skyrl_gym.environment import SkyRLGymEnvironment
from corerl_skyrl_gym.plugin import SkyRLGymSettings
from corerl_skyrl_gym.sandboxed import LCBScorer

RECIPE = {"policy": {"model_name": "builtin:tiny-qwen2"}, "data": {"env_name": "skyrl_gym"}}

#: stdin tests, as SkyRL's LiveCodeBench data lays them out (reward_spec.ground_truth is their JSON)
ADD = [{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}, {"input": "5 7\n", "output": "12\n", "testtype": "stdin"}]
#: call-based tests: a LeetCode-style method, its arguments one JSON value a line
CALL = [{"input": "1\n2", "output": "3", "testtype": "functional", "metadata": {"func_name": "add"}},
        {"input": "[1, 2]\n[3]", "output": "[1, 2, 3]", "testtype": "functional", "metadata": {"func_name": "add"}}]


def adapter(**settings):
    return SkyRLGymEnvironment(EnvironmentContext(SkyRLGymSettings(**settings), seed=0))


def lcb_row(tests):
    return {"prompt": [{"role": "user", "content": "Solve it."}], "env_class": "lcb",
            "reward_spec": {"method": "rule", "ground_truth": json.dumps(tests)}}


def fenced(code):
    return f"Here it is:\n```python\n{code}\n```\n"


@pytest.fixture
def lcb_in_sandbox(corerl_host):
    """The lcb adapter with the sandbox ``auto`` picks here (skipped where none is available)."""
    from corerl.environments.sandboxes import AUTO, choose

    try:
        registration, runner = choose(AUTO, corerl_host)
    except ConfigError as error:
        pytest.skip(f"no contained sandbox here: {error.message}")
    environment = adapter(env_class="lcb")
    environment.scorer = LCBScorer(runner, memory_mb=1024)
    return environment, registration.id


def score(environment, tests, response):
    turn = environment.step(EpisodeView(row=lcb_row(tests), turn=1, responses=(response,)))
    assert turn.done
    return turn.reward


def test_lcb_in_the_sandbox_scores_as_skyrl_gyms_compute_score(lcb_in_sandbox):
    from skyrl_gym.envs.lcb.livecodebench import compute_score

    environment, _ = lcb_in_sandbox
    cases = [  # (tests, response, reward): code safe to run unsandboxed too, through skyrl-gym's own scorer
        (ADD, fenced("a, b = map(int, input().split())\nprint(a + b)"), 1.0),
        (ADD, fenced("print(3)"), 0.0),  # the first test only
        (ADD, fenced("if __name__ == '__main__':\n    import sys\n    a, b = map(int, sys.stdin.readline().split())"
                     "\n    print(a + b)"), 1.0),
        (ADD, fenced("print(1 / 0)"), 0.0),
        (CALL, fenced("class Solution:\n    def add(self, a, b):\n        return a + b"), 1.0),
        (CALL, fenced("class Solution:\n    def add(self, a, b):\n        return [a, b]"), 0.0),
        (ADD, "a, b = map(int, input().split()); print(a + b)", 0.0),  # no fenced block: no code
    ]
    for tests, response, reward in cases:
        assert (score(environment, tests, response), compute_score(response, tests)[1]) == (reward, reward), response
    assert "tests in the sandbox" in repr(environment.make(lcb_row(ADD)))


def test_lcb_code_that_tries_to_escape_is_contained(lcb_in_sandbox, tmp_path):
    """Each program prints the right answer only where its escape worked: 0 says it did not, and
    what it aimed at outside (a file, the caller's loopback, processes past its limit) shows it."""
    import psutil

    from corerl.testing.sandbox_conformance import program_processes
    from corerl_skyrl_gym.sandboxed import MAX_PROCESSES

    environment, sandbox = lcb_in_sandbox
    outside = tmp_path / "escaped"
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    escapes = {
        "write outside": f"import os\nos.close(os.open({str(outside)!r}, os.O_CREAT | os.O_WRONLY))\nprint(3)",
        "network": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'x')\nprint(3)",
        # the guard takes os.fork away; posix.fork is the same call: each child waits, none may outlive the run
        "fork bomb": "import posix, time\nborn = 0\nfor _ in range(200):\n    if posix.fork() == 0:\n"
                     "        time.sleep(60)\n        posix._exit(0)\n    born += 1\nprint(3 if born == 200 else 0)",
        # a wrong answer that patches what the grader's process would judge the results with
        "forged verdict": "import builtins, json, os\nbuiltins.all = lambda *a, **k: True\n"
                          "json.dumps = lambda *a, **k: 'true'\nprint(0)",
    }
    before = {(p.pid, p.create_time()) for p in psutil.Process().children(recursive=True)}
    for name, code in escapes.items():
        started = time.monotonic()
        assert score(environment, ADD[:1], fenced(code)) == 0.0, f"{name} escaped the {sandbox} sandbox"
        assert time.monotonic() - started < 30, f"{name}: the run waited for what the code left behind"
    assert not outside.exists()
    with pytest.raises(BlockingIOError):
        listener.accept()
    listener.close()
    assert program_processes(before) == [], f"processes outlived the sandbox (limit {MAX_PROCESSES})"
    assert score(environment, ADD, fenced("a, b = map(int, input().split())\nprint(a + b)")) == 1.0  # and it goes on


def test_lcb_is_refused_only_where_no_contained_sandbox_is_available(corerl_host, tmp_path, monkeypatch):
    monkeypatch.setattr("corerl.environments.sandbox.isolation_available", lambda: "audit")  # namespaces refused
    recipe = write_recipe(tmp_path / "recipe.yaml", RECIPE)
    with pytest.raises(ConfigErrors) as refused:
        select_for(corerl_host, recipe, ["env.skyrl_gym.env_class=lcb"])
    (error,) = refused.value.errors
    line = error.one_line()
    assert error.key == "env.skyrl_gym.isolation" and "\n" not in line
    assert "no sandbox that contains model-written code is available here" in line
    assert "env.skyrl_gym.isolation=audit (not a security boundary" in line
    with pytest.raises(ConfigErrors) as unknown:
        select_for(corerl_host, recipe, ["env.skyrl_gym.env_class=lcb", "env.skyrl_gym.isolation=nosuch"])
    assert [(e.key, "no sandbox 'nosuch' is registered" in e.message) for e in unknown.value.errors] == [
        ("env.skyrl_gym.isolation", True)]
    for opt_in in ("env.skyrl_gym.isolation=audit", "env.skyrl_gym.allow_unsandboxed_code=true"):
        config, _ = select_for(corerl_host, recipe, ["env.skyrl_gym.env_class=lcb", opt_in])
        assert config.section("env.skyrl_gym").env_class == "lcb"


def test_unsandboxed_lcb_is_skyrl_gyms_own_environment():
    from skyrl_gym.envs.lcb.env import LCBEnv

    assert type(adapter(env_class="lcb", allow_unsandboxed_code=True).make(lcb_row(ADD))) is LCBEnv
    with pytest.raises(ValueError, match="not skyrl-gym's LCBEnv"):
        adapter(env_class="lcb").contained("lcb", object())


def test_a_row_without_tests_is_the_episodes_error_as_in_skyrl_gym():
    environment = adapter(env_class="lcb")
    environment.scorer = LCBScorer(runner=None, memory_mb=1024)  # never reached: no test to run
    with pytest.raises(ValueError, match="holds no test"):
        score(environment, [], fenced("print(3)"))
