"""Errors a user can cause, each carrying where it happened and what to do about it.

Every error here renders as one line: ``<where>: <what>`` plus a hint. The CLI maps
:attr:`CorerlError.exit_code` to the process exit status (2 for config and usage errors,
1 for failures while running) and prints no traceback unless ``CORERL_DEBUG=1``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

EXIT_FAILURE = 1
EXIT_USAGE = 2


class CorerlError(Exception):
    """Base class of every error corerl reports to a user in one line."""

    exit_code: int = EXIT_FAILURE

    def __init__(
        self, message: str, *, key: str | None = None, source: str | None = None, hint: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.key = key
        self.source = source
        self.hint = hint

    def one_line(self) -> str:
        """The message as a user sees it: key path, message, hint, then where it came from."""
        text = f"{self.key}: {self.message}" if self.key else self.message
        if self.hint:
            text += f"; {self.hint}"
        if self.source:
            text += f" ({self.source})"
        return text

    def as_dict(self) -> dict[str, str | None]:
        """The JSON form used by ``corerl validate --json``."""
        message = self.message + (f"; {self.hint}" if self.hint else "")
        if self.source:
            message += f" ({self.source})"
        return {"key": self.key, "message": message}

    def __str__(self) -> str:
        return self.one_line()


class UsageError(CorerlError):
    """The command line itself is wrong (unknown flag, malformed override)."""

    exit_code = EXIT_USAGE


class ConfigError(CorerlError):
    """A recipe or override is wrong: unknown key, wrong type, bad value, missing file."""

    exit_code = EXIT_USAGE


class ConfigErrors(ConfigError):
    """Several :class:`ConfigError` found in one pass, reported together (``errors``). It is a
    :class:`ConfigError` itself, so ``except ConfigError`` still catches what a check refused;
    holding one error, it reads as that error and carries its key, hint and origin."""

    exit_code = EXIT_USAGE

    def __init__(self, errors: list[CorerlError]) -> None:
        if len(errors) == 1:
            only = errors[0]
            super().__init__(only.message, key=only.key, source=only.source, hint=only.hint)
        else:
            super().__init__("; ".join(e.one_line() for e in errors))
        self.errors = errors


class SelectionError(CorerlError):
    """No backend can satisfy the config (not installed, failed to load, ambiguous)."""

    exit_code = EXIT_USAGE


class RegistrationError(CorerlError):
    """A plugin registered something invalid, or an id another plugin already holds."""

    exit_code = EXIT_FAILURE


class EngineNotAvailable(CorerlError):
    """A registered component whose engine is not implemented or cannot start here."""

    exit_code = EXIT_FAILURE


class RunError(CorerlError):
    """A run stopped by what it was given or what it computed: a malformed data line, a reward
    function that raised or returned no number, a loss that became NaN."""

    exit_code = EXIT_FAILURE


class PluginError(CorerlError):
    """A plugin called a corerl function wrongly (an SDK function given arguments it does not
    take): one line naming the plugin and the function, e.g. ``plugin 'x': samples_to_batch:
    advantages must be ...``. corerl's own mistakes stay internal errors ("this is a bug")."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str, *, plugin: str | None, function: str, hint: str | None = None,
                 key: str | None = None, source: str | None = None) -> None:
        where = f"plugin {plugin!r}: {function}" if plugin else function
        super().__init__(f"{where}: {message}", key=key, source=source, hint=hint)
        self.plugin, self.function = plugin, function


def argument_error(function: str, message: str, *, hint: str | None = None,
                   internal: type[Exception] = TypeError) -> Exception:
    """The error for arguments ``function`` (a corerl function a plugin may call) does not take:
    a :class:`PluginError` naming the plugin when the code that called it is a plugin's (the
    first frame outside ``function``'s own module, :mod:`corerl.sdk` and its modules, and this one), else, when
    corerl's own code made the call, ``internal(...)``: a bug of corerl's, reported as one."""
    frame = sys._getframe(1)
    own = {frame.f_globals.get("__name__", ""), __name__, "corerl.sdk"}
    caller = frame.f_back
    while caller is not None and (caller.f_globals.get("__name__", "") in own
                                  or caller.f_globals.get("__name__", "").startswith("corerl.sdk.")):
        caller = caller.f_back
    module = caller.f_globals.get("__name__", "") if caller is not None else ""
    if module == "corerl" or module.startswith("corerl."):
        return internal(f"{function}: {message}")
    return PluginError(message, plugin=plugin_of_module(module) if module else None, function=function, hint=hint)


def plugin_of_module(module: str) -> str:
    """The name of the installed plugin (its ``corerl.plugins`` entry point) whose package holds
    ``module``; else the module's top-level package (a plugin registered in code, a script)."""
    top = module.partition(".")[0]
    try:
        from importlib.metadata import entry_points

        for point in entry_points(group="corerl.plugins"):
            if point.value.partition(":")[0].partition(".")[0] == top:
                return point.name
    except Exception:  # a broken distribution's metadata: the package name says enough
        pass
    return top


def origin_of(path: str, origins: Mapping[str, str]) -> str | None:
    """The origin of ``path`` or of its nearest ancestor that has one. ``origins`` maps a dotted
    key path to where its value came from (:data:`corerl.config.tree.Origins`): what an error about
    that key names as its ``source``."""
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        found = origins.get(".".join(parts[:end]))
        if found is not None:
            return found
    return None
