"""The sandbox conformance suite: subclass :class:`SandboxConformance`.

A registered sandbox (``corerl_register_sandboxes``) runs the hostile programs a model may write,
in this process, and must contain each one::

    import corerl_mysandbox.plugin
    from corerl.testing.sandbox_conformance import SandboxConformance

    class TestMySandbox(SandboxConformance):
        sandbox_id = "mysandbox"
        plugin = corerl_mysandbox.plugin      # None: the installed plugins are discovered

Where the sandbox says it cannot run here (``unavailable()``), every check is skipped in one line
saying why. The checks, one test per hostile program (:data:`HOSTILE`):

(a) a plain program runs: it passes, its output comes back, the files given are in its folder;
(b) each hostile program fails or is cut off at its time, and afterwards: the caller (this test
    process) is alive; no process the program started is left
    (none of this process's new descendants, none whose command line names the test's temporary
    folder, where the sandbox makes its own, or the program's tag, which the double fork's daemon
    carries); no
    file it aimed at outside its folder exists (the test's folder, the system's temporary folder,
    Python's own install); no working folder is left in the temporary folder; nothing it read
    outside its folder (a token file, the caller's environment) reaches its output; and the next
    program runs.

The checks read no clock of their own. That a program was cut off at ``timeout_s`` is said by its
outcome: the loops (the infinite loop, SIGTERM ignored) print a word once they have run
``timeout_s + margin_s`` seconds and the double fork's daemon once it has slept 120 s, so a
sandbox that lets them run past their time, or waits for the daemon, gives back that word (and
a program that passed); ``margin_s`` is the seconds the sandbox has past ``timeout_s`` to stop them.

The programs: an infinite loop, a memory bomb, a fork bomb, writes outside its folder, a FIFO
outside, a write through a directory descriptor of Python's install, secrets from the environment
and from a token file, a connection to the caller's loopback and a DNS lookup, the parent killed
by ``kill`` and by ``pidfd_send_signal``, a process left behind by a double fork, 1 GB of output,
SIGTERM ignored, a segfault.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import time
import uuid
from typing import Any, ClassVar

import pytest

#: each hostile program: its source (formatted with ``outside``, ``tmp``, ``token``, ``port``, ``tag``,
#: ``prefix``, ``late``: the seconds a loop runs before it ends and says so), what it must not print (split
#: in its source, so that a traceback quoting the line does not print it), and whether it must fail (a
#: write or a signal a sandbox turns into a harmless no-op may pass: the checks afterwards say whether it
#: was contained)
HOSTILE: dict[str, tuple[str, str, bool]] = {
    "infinite loop": ("import time\nend = time.monotonic() + {late}\nwhile time.monotonic() < end:\n    pass\n"
                      "print('outl' 'asted')\n", "outlasted", True),
    "memory bomb": ("block = bytearray(20 * 1024 ** 3)\nprint('allo' 'cated')\n", "allocated", True),
    "fork bomb": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n", "", True),
    "write outside": ("open({outside!r} + '/written-{tag}', 'w').write('x')\n", "", False),
    "fifo outside": ("import os\nos.mkfifo({tmp!r} + '/corerl-fifo-{tag}')\n", "", False),
    "write through a directory descriptor": (
        "import os\nfolder = os.open({prefix!r}, os.O_RDONLY)\n"
        "os.close(os.open('corerl-escape-{tag}', os.O_CREAT | os.O_WRONLY, dir_fd=folder))\n", "", False),
    "secrets from the environment": ("import os\nprint(dict(os.environ))\n", "SECRET-ENV-{tag}", False),
    "token file": ("print(open({token!r}).read())\n", "SECRET-TOKEN-{tag}", False),
    "network": ("import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'leak')\n", "",
                False),
    "dns": ("import socket\nprint('re' 'solved', socket.getaddrinfo('example.com', 443))\n", "resolved", False),
    "parent kill": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n", "", False),
    "parent kill by pidfd": ("import os, signal\nsignal.pidfd_send_signal(os.pidfd_open(os.getppid()), 9)\n", "", False),
    "double fork": ("import os, sys, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                    "        try:\n            os.execv(sys.executable, [sys.executable, '-c', 'import time; "
                    "time.sleep(120); print(\"outl\" \"ived\")', '{tag}'])\n        finally:\n            time.sleep(120)\n"
                    "    os._exit(0)\nraise SystemExit(3)\n", "outlived", True),
    "1 GB of output": ("import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)\n"
                       "raise SystemExit(3)\n", "", True),
    "SIGTERM ignored": ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                        "end = time.monotonic() + {late}\nwhile time.monotonic() < end:\n    pass\n"
                        "print('outl' 'asted')\n", "outlasted", True),
    "segfault": ("import faulthandler\nfaulthandler._sigsegv()\n", "", True),
}
#: the programs that do not end within their limits by themselves (the loops end after ``timeout_s + margin_s``
#: and say so): the sandbox must cut them off at ``timeout_s``
RUNS_FOREVER = ("infinite loop", "fork bomb", "SIGTERM ignored")
#: the most output a result may hold (its tails of stdout and stderr)
MOST_OUTPUT = 1 << 20


def program_processes(before: set[tuple[int, float]], *marks: str) -> list[Any]:
    """Processes a sandboxed program may have left: this process's descendants not in ``before``
    (pid, start time), and any process whose command line names one of ``marks`` (the test's
    temporary folder, where the sandbox makes its own, and the program's tag: another test's
    sandboxes are not counted)."""
    import psutil

    left = []
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if process.info["status"] != psutil.STATUS_ZOMBIE and any(mark in cmdline for mark in marks):
            left.append(process)
    for process in psutil.Process().children(recursive=True):
        try:
            if (process.pid, process.create_time()) not in before and process.status() != psutil.STATUS_ZOMBIE:
                left.append(process)
        except psutil.NoSuchProcess:
            continue
    return left


def _descendants() -> set[tuple[int, float]]:
    import psutil

    known = set()
    for process in psutil.Process().children(recursive=True):
        try:
            known.add((process.pid, process.create_time()))
        except psutil.NoSuchProcess:
            continue
    return known


class SandboxConformance:
    """Subclass and set :attr:`sandbox_id` (and :attr:`plugin`): see the module's docstring."""

    #: the registered sandbox's id
    sandbox_id: ClassVar[str] = ""
    #: the plugin module that registers it; None: the installed plugins are discovered
    plugin: ClassVar[Any] = None
    #: the limits every hostile program runs under
    timeout_s: ClassVar[float] = 2.0
    memory_mb: ClassVar[int] = 512
    max_processes: ClassVar[int] = 16
    #: seconds past ``timeout_s`` the sandbox has to stop a program: the loops end by themselves, and say
    #: so in their output, once they have run ``timeout_s + margin_s`` (no clock of the test's decides)
    margin_s: ClassVar[float] = 15.0

    @pytest.fixture(scope="class")
    @classmethod
    def sandbox_runner(cls) -> Any:
        """The sandbox's runner; every check is skipped, in one line, where it cannot run here."""
        from corerl.testing import host_for_component

        _, registration = host_for_component("sandboxes", cls.sandbox_id, cls.plugin, "sandbox")
        runner = registration.create()
        why = runner.unavailable()
        if why:
            pytest.skip(f"sandbox {cls.sandbox_id!r} cannot run here: {why}")
        return runner

    @pytest.fixture
    def temporary(self, monkeypatch: pytest.MonkeyPatch) -> Any:
        """A private system temporary folder for the test (``tempfile.tempdir`` and ``TMPDIR``)."""
        folder = tempfile.mkdtemp(prefix="corerl-conformance-tmp-")
        os.chmod(folder, 0o1777)
        monkeypatch.setattr(tempfile, "tempdir", folder)
        monkeypatch.setenv("TMPDIR", folder)
        yield folder
        shutil.rmtree(folder, ignore_errors=True)

    def _run(self, runner: Any, source: str, **limits: Any) -> Any:
        settings = {"timeout_s": self.timeout_s, "memory_mb": self.memory_mb, "max_processes": self.max_processes}
        return runner.run(source, **{**settings, **limits})

    def test_a_plain_program_runs(self, sandbox_runner: Any) -> None:
        result = self._run(sandbox_runner, "print(open('data.txt').read().upper())\n", timeout_s=20.0,
                           files={"data.txt": "hello"})
        assert result.passed, result.why
        assert result.stdout.strip() == "HELLO" and result.returncode == 0 and not result.timed_out

    @pytest.mark.parametrize("name", list(HOSTILE))
    def test_hostile_program_is_contained(self, sandbox_runner: Any, name: str, temporary: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
        tag = uuid.uuid4().hex[:10]
        outside = tempfile.mkdtemp(prefix="corerl-conformance-outside-", dir=os.path.dirname(temporary))
        os.chmod(outside, 0o777)
        token = os.path.join(outside, "token")
        with open(token, "w") as handle:
            handle.write(f"SECRET-TOKEN-{tag}")
        os.chmod(token, 0o644)
        monkeypatch.setenv("CORERL_CONFORMANCE_SECRET", f"SECRET-ENV-{tag}")
        listener = socket.create_server(("127.0.0.1", 0))
        listener.settimeout(0.2)
        prefix = os.path.realpath(sys.base_prefix)
        aimed = [os.path.join(outside, f"written-{tag}"), os.path.join(temporary, f"corerl-fifo-{tag}"),
                 os.path.join(prefix, f"corerl-escape-{tag}")]
        source, forbidden, must_fail = HOSTILE[name]
        before = _descendants()
        try:
            result = self._run(sandbox_runner, source.format(outside=outside, tmp=temporary, token=token, tag=tag,
                                                     prefix=prefix, port=listener.getsockname()[1],
                                                     late=self.timeout_s + self.margin_s))
            with pytest.raises(TimeoutError):
                listener.accept()  # nothing reached the caller's loopback
            assert not (must_fail and result.passed), f"{name}: the program passed ({result.stdout[-200:]!r})"
            if name in RUNS_FOREVER:
                assert result.timed_out, f"{name}: not cut off at its time ({result.why})"
            output = result.stdout + result.stderr
            assert len(output) <= MOST_OUTPUT, f"{name}: {len(output)} characters of output kept"
            if forbidden:
                assert forbidden.format(tag=tag) not in output, f"{name}: the program printed {forbidden!r}"
            escaped = [path for path in aimed if os.path.lexists(path)]
            assert not escaped, f"{name}: the program wrote {escaped}"
            assert os.listdir(outside) == ["token"], f"{name}: the program wrote into {outside}"
            assert not os.listdir(temporary), f"{name}: left {os.listdir(temporary)} in the temporary folder"
            deadline = time.monotonic() + 5
            while program_processes(before, temporary, tag) and time.monotonic() < deadline:
                time.sleep(0.05)
            left = program_processes(before, temporary, tag)
            assert not left, f"{name}: processes left: {[p.pid for p in left]}"
            after = self._run(sandbox_runner, "print(6 * 7)\n", timeout_s=20.0)  # the caller goes on
            assert after.passed and after.stdout.strip() == "42", after.why
        finally:
            listener.close()
            for path in aimed:  # an escape is a failure above; leave nothing behind either way
                if os.path.lexists(path):
                    os.unlink(path)
            shutil.rmtree(outside, ignore_errors=True)
