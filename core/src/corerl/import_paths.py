"""Import paths a recipe names (``data.reward``, ``policy.dtensor_cfg.custom_parallel_plan``) and
the ones refused outright.

A recipe is code: an import path runs whatever it names (docs/security.md). What is refused here
is the obvious mistake or plant, a path into the modules whose functions run commands or
arbitrary code (``builtins:exec``, ``os:system``, ``subprocess:run``): none of them is a reward
or a plan, and a recipe passed around should not be one edit away from a shell.
"""

from __future__ import annotations

from typing import Any

from corerl.errors import ConfigError

#: modules (and packages, with everything under them) whose functions run commands or code
CODE_RUNNING_MODULES = frozenset({
    "builtins", "os", "posix", "nt", "subprocess", "shutil", "sys", "pty", "importlib", "runpy", "code",
    "codeop", "ctypes", "multiprocessing", "socket", "pickle", "marshal", "webbrowser", "platform",
})


def runs_code(module_name: str) -> bool:
    """Whether ``module_name`` is, or lies under, one of :data:`CODE_RUNNING_MODULES`."""
    return module_name.split(".")[0] in CODE_RUNNING_MODULES


def code_runner_problem(path: str, target: Any = None, wanted: str = "function") -> str | None:
    """Why ``path`` may not be used as a ``wanted``, when it leads into a module that runs
    commands or code (``target``, the resolved object when there is one, is checked by the
    module that defines it too: ``mymodule:exec`` re-exporting ``builtins.exec``); else None."""
    module_name = path.partition(":")[0]
    defined_in = getattr(target, "__module__", None) or ""
    if runs_code(module_name) or (target is not None and runs_code(defined_in)):
        return f"{path} runs commands or code (it comes from {defined_in or module_name}); it is not a {wanted}"
    return None


def refuse_code_runners(path: str, key: str, target: Any = None, wanted: str = "function") -> None:
    """Raise :func:`code_runner_problem`'s reason as a one-line error naming ``key``."""
    problem = code_runner_problem(path, target, wanted)
    if problem is not None:
        raise ConfigError(problem, key=key, hint=f"point {key} at your own {wanted} (see docs/security.md)")
