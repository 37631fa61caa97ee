"""Errors a user can cause, each carrying where it happened and what to do about it.

Every error here renders as one line: ``<where>: <what>`` plus a hint. The CLI maps
:attr:`CorerlError.exit_code` to the process exit status (2 for config and usage errors,
1 for failures while running) and prints no traceback unless ``CORERL_DEBUG=1``.
"""

from __future__ import annotations

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


class ConfigErrors(CorerlError):
    """Several :class:`ConfigError` found in one pass, reported together."""

    exit_code = EXIT_USAGE

    def __init__(self, errors: list[CorerlError]) -> None:
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
