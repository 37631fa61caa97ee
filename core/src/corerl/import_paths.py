"""Import paths (``"package.module:name"``): the one resolver every part of corerl uses, and the
paths a recipe may not name.

:func:`resolve` turns a path into its object for registrations' factories, a recipe's
``data.reward`` or agent, a rank's worker and a plugin's own module; its errors are one line
saying who names the path and how to fix it.

A recipe is code: an import path runs whatever it names (docs/security.md). What is refused here
is the obvious mistake or plant, a path into the modules whose functions run commands or
arbitrary code (``builtins:exec``, ``os:system``, ``subprocess:run``): none of them is a reward
or a plan, and a recipe passed around should not be one edit away from a shell.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import re
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

from corerl.errors import ConfigError, CorerlError, EngineNotAvailable, RegistrationError

_PATH = re.compile(r"^[A-Za-z_][\w.]*(:[A-Za-z_][\w.]*)?$")


class UnimportablePath(EngineNotAvailable, ImportError):
    """An import path whose module does not import (an :class:`ImportError` too)."""


class MissingName(RegistrationError, AttributeError):
    """An import path whose module has no such name (an :class:`AttributeError` too)."""


def resolve(path: str | Callable[..., Any], *, what: str = "", owner: str = "", key: str | None = None,
            hint: str | None = None, error: type[CorerlError] | None = None) -> Any:
    """The object at ``path``: ``"package.module:name"`` (``name`` may be dotted, an attribute of
    an attribute) or ``"package.module"`` for the module itself; a callable is returned as it is.

    A failure is one line. ``what`` says what the path names (``"factory"``, ``"reward"``);
    ``owner``, who names it (``"training backend 'x' (plugin 'y')"``), or ``key``, the recipe key
    that does; ``hint`` says how to fix a module that does not import. ``error`` is the class
    raised (with ``key``); unset, an unimportable module raises :class:`UnimportablePath` and a
    missing name :class:`MissingName`. An exception the module itself raises while importing,
    other than an :class:`ImportError`, is not caught."""
    if not isinstance(path, str):
        return path
    if not _PATH.match(path):
        message = f"{what or 'import path'} {path!r} is not of the form package.module:name"
        raise (error or MissingName)(f"{owner}: {message}" if owner else message, key=key,
                                     hint="write it as package.module:name")
    module_name, _, attr_path = path.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        if owner:
            message = f"{owner} cannot import {path!r}"
        else:
            message = f"cannot import {what} module {module_name!r}" if what else f"cannot import {path!r}"
        raise (error or UnimportablePath)(
            f"{message}: {exc}", key=key,
            hint=hint or "install the package that provides it, or put its module on PYTHONPATH",
        ) from exc
    for part in attr_path.split(".") if attr_path else ():
        if not hasattr(target, part):
            message = f"module {module_name!r} has no {attr_path!r}"
            if owner:
                message = f"{owner} names a missing {what or 'name'} {path!r}: {message}"
            raise (error or MissingName)(message, key=key, hint=f"check the name after ':' in {path!r}")
        target = getattr(target, part)
    return target


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
    to make its module importable). :func:`resolve` imports it."""
    refuse_code_runners(path, key, wanted=f"{wanted} function")
    target = resolve(path, what=wanted, key=key, hint=import_hint, error=ConfigError)
    refuse_code_runners(path, key, target, wanted=f"{wanted} function")
    if not callable(target):
        raise ConfigError(f"{path!r} is not callable", key=key, hint=hint)
    return target


#: modules that moved (issue 74, the core's layers): the old path still imports, as the very module
#: at its new path, with a DeprecationWarning; the old paths go with contract 3.0
MOVED_MODULES: dict[str, str] = {
    "corerl.runner": "corerl.run.loop",
    "corerl.run_context": "corerl.run.context",
    "corerl.run_steps": "corerl.run.steps",
    "corerl.run_directory": "corerl.run.directory",
    "corerl.run_record": "corerl.run.record",
    "corerl.run_inputs": "corerl.run.inputs",
    "corerl.run_evaluation": "corerl.evaluation.during_run",
    "corerl.evaluation_command": "corerl.evaluation.command",
    "corerl.checkpoints": "corerl.run.checkpoints",
    "corerl.recovery": "corerl.run.recovery",
    "corerl.interrupt": "corerl.run.interrupt",
    "corerl.out_of_memory": "corerl.run.out_of_memory",
    "corerl.model_rewards": "corerl.environments.model_rewards",
    "corerl.sandbox": "corerl.environments.sandbox",
    "corerl.presets": "corerl.config.presets",
    "corerl.selection": "corerl.config.selection",
}


class _MovedModule(importlib.abc.Loader):
    """Loads an old module path as the module at its new one (the same object, not a copy)."""

    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        warnings.warn(f"{module.__name__} moved to {self.new}; import it from there (the old path goes with "
                      "contract 3.0)", DeprecationWarning, stacklevel=2)
        # the import system returns what sys.modules holds under the name once this returns
        sys.modules[module.__name__] = resolve(self.new, what="moved module")


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths of :data:`MOVED_MODULES` (``corerl/__init__`` installs one on ``sys.meta_path``)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        new = MOVED_MODULES.get(fullname)
        return importlib.util.spec_from_loader(fullname, _MovedModule(new)) if new else None


def install_moved_module_finder() -> None:
    """Make the old paths of :data:`MOVED_MODULES` importable (once per process)."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
