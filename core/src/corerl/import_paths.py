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


def import_function(path: str, key: str, wanted: str, hint: str,
                    import_hint: str = "put the module on PYTHONPATH (or install its package)") -> Any:
    """The callable at import path ``path`` (``pkg.module:fn``), named by the recipe key ``key``
    as a ``wanted`` (``"reward"``, ``"agent"``): refused in one line naming ``key`` when it leads
    into a code-running module (before and after importing), its module does not import, it has
    no such attribute, or it is not callable (``hint`` says what it should be, ``import_hint`` how
    to make its module importable)."""
    import importlib

    refuse_code_runners(path, key, wanted=f"{wanted} function")
    module_name, _, attr_path = path.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {wanted} module {module_name!r}: {exc}", key=key, hint=import_hint) from exc
    for part in attr_path.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"module {module_name!r} has no {attr_path!r}", key=key,
                              hint=f"check the function name in {path!r}")
        target = getattr(target, part)
    refuse_code_runners(path, key, target, wanted=f"{wanted} function")
    if not callable(target):
        raise ConfigError(f"{path!r} is not callable", key=key, hint=hint)
    return target
