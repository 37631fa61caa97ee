"""Which sandbox runs model-written code: the core's two (``namespaces``, ``audit``) as registered
sandboxes, and the choice ``env.code.isolation`` makes among every registered one.

``auto`` (the default) is the available *contained* sandbox of highest priority; where none is
available, a recipe that runs model-written code (``data.env_name=code``, ``data.task=humaneval``,
``data.reward=humaneval_tests``) is refused before anything starts, in one line naming the opt-in
(``env.code.isolation=audit``, which is not a security boundary) and the alternatives. Nothing
falls back without being asked to.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from corerl.environments import sandbox
from corerl.environments.sandbox import SandboxResult
from corerl.errors import ConfigError

#: the ``env.code.isolation`` value that picks the best contained sandbox available
AUTO = "auto"
#: the key that names the sandbox
KEY = "env.code.isolation"
#: what the audit mode does not protect against, said wherever a recipe may opt into it
AUDIT_LIMITS = "not a security boundary: native code can step around its hook, and it runs as your user"


class SandboxRunner(Protocol):
    """What a sandbox's factory returns (:class:`corerl.registry.Sandbox`)."""

    def unavailable(self) -> str | None:
        """Why this sandbox cannot run on this machine, in one line; None when it can."""

    def run(self, source: str, *, timeout_s: float, memory_mb: int, max_processes: int,
            files: Mapping[str, str] | None = None) -> SandboxResult:
        """Run ``source`` as a Python program in a fresh sandbox and wait for it."""


class BuiltinSandbox:
    """One of :mod:`corerl.environments.sandbox`'s isolation modes as a registered sandbox."""

    mode = ""

    def unavailable(self) -> str | None:
        return None

    def run(self, source: str, *, timeout_s: float, memory_mb: int, max_processes: int,
            files: Mapping[str, str] | None = None) -> SandboxResult:
        return sandbox.run_python(source, timeout_s=timeout_s, memory_mb=memory_mb, max_processes=max_processes,
                                  isolation=self.mode, files=dict(files or {}))  # type: ignore[arg-type]


class NamespacesSandbox(BuiltinSandbox):
    """``namespaces``: new user, mount, PID, network, IPC and UTS namespaces (docs/security.md)."""

    mode = "namespaces"

    def unavailable(self) -> str | None:
        if sandbox.isolation_available() == "namespaces":
            return None
        return "user namespaces are refused on this machine"


class AuditSandbox(BuiltinSandbox):
    """``audit``: a Python audit hook and a seccomp filter, where namespaces are refused."""

    mode = "audit"

    def unavailable(self) -> str | None:
        import sys

        return None if sys.platform == "linux" else "the audit mode's system-call filter needs Linux"


#: how a recipe opts into the audit mode, by the way it runs model-written code
OPT_IN_ENV = f"{KEY}=audit"
OPT_IN_REWARD = f"data.env_name=code and {KEY}=audit"


def choose(isolation: str, host: Any, opt_in: str = OPT_IN_ENV, key: str = KEY) -> tuple[Any, SandboxRunner]:
    """The sandbox registration ``isolation`` names (``auto``: the best contained one available)
    and its runner; a :class:`ConfigError` at ``key`` when there is none, whose hint names ``opt_in``."""
    registry = host.sandboxes
    if isolation != AUTO:
        chosen = registry.get(isolation)
        if chosen is None:
            raise ConfigError(f"no sandbox {isolation!r} is registered (sandboxes: {', '.join(registry.ids())})",
                              key=key, hint="name one of them, or auto for the best contained one available")
        runner = chosen.create()
        why = runner.unavailable()
        if why:
            raise ConfigError(f"sandbox {isolation!r} cannot run here: {why}", key=key,
                              hint=f"set {key}=auto, or run on a machine it supports")
        return chosen, runner
    refused = []
    for registration in registry:  # highest priority first
        if not registration.contained:
            continue
        runner = registration.create()
        why = runner.unavailable()
        if not why:
            return registration, runner
        refused.append(f"{registration.id}: {why}")
    raise ConfigError(
        "no sandbox that contains model-written code is available here (" + "; ".join(refused or ["none registered"])
        + ")", key=key,
        hint=f"to run it behind the audit hook anyway, set {opt_in} ({AUDIT_LIMITS}); or run where user namespaces "
             "are allowed, or install a sandbox plugin (corerl plugins lists them)")


def runs_model_code(config: Any) -> bool:
    """Whether the recipe runs model-written code: the ``code`` environment, the ``humaneval``
    task scoring by its own reward, or the ``humaneval_tests`` reward."""
    data = config.core.data
    if getattr(data, "env_name", None) == "code" or getattr(data, "reward", None) == "humaneval_tests":
        return True
    return getattr(data, "task", None) == "humaneval" and not getattr(data, "reward", None) and not getattr(
        data, "env_name", None)


def isolation_of(config: Any) -> str:
    """``env.code.isolation`` as the recipe sets it (``auto`` when the section is absent)."""
    settings = config.section("env.code")
    return getattr(settings, "isolation", AUTO) if settings is not None else AUTO


def check_sandbox(config: Any) -> None:
    """Refuse, in one line at ``env.code.isolation``, a recipe that runs model-written code where
    the sandbox it names (or ``auto``'s choice) cannot run; nothing for any other recipe."""
    if not runs_model_code(config):
        return
    from corerl.plugin_manager import process_host

    if config.core.data.env_name == "code":
        choose(isolation_of(config), process_host())
    else:
        key = "data.reward" if config.core.data.reward == "humaneval_tests" else "data.task"
        choose(AUTO, process_host(), opt_in=OPT_IN_REWARD, key=key)


def runner_for(isolation: str) -> SandboxRunner:
    """The runner ``isolation`` names, from this process's plugins (a run's environment)."""
    from corerl.plugin_manager import process_host

    return choose(isolation, process_host())[1]
