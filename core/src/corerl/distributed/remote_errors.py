"""Exceptions raised inside a Ray actor, as the driver re-raises them.

Ray sends back the exception an actor raised (``RayTaskError.cause``) without its traceback
(tracebacks do not pickle) and keeps the actor's traceback only as text. Re-raising the bare
cause loses where it happened: :func:`unwrap_remote` chains the cause to that text
(:class:`RemoteTraceback`, shown under ``CORERL_DEBUG=1``) and records the actor's last frame
(:func:`remote_origin`), which the one-line error names when the message is empty (a bare
``assert``).
"""

from __future__ import annotations

import re
from typing import Any

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a Ray actor, as the text Ray kept of it."""

    def __str__(self) -> str:
        return "\n" + str(self.args[0]) if self.args else ""


def last_frame(traceback_text: str) -> str | None:
    """``file:line in function`` of the innermost frame of a formatted traceback, if any."""
    frames = list(_FRAME.finditer(traceback_text))
    if not frames:
        return None
    frame = frames[-1]
    return f"{frame['file']}:{frame['line']} in {frame['func']}"


def unwrap_remote(exc: Any) -> BaseException:
    """The exception a ``RayTaskError`` carries (itself where it did not pickle back), chained
    to the actor's traceback and with ``remote_origin`` set to the actor's innermost frame."""
    cause = exc.cause if getattr(exc, "cause", None) is not None else exc
    text = getattr(exc, "traceback_str", None) or str(exc)
    if cause is not exc:
        cause.__cause__ = RemoteTraceback(text)  # also suppresses the RayTaskError as context
    try:
        cause.remote_origin = last_frame(text)  # type: ignore[union-attr]
    except AttributeError:  # an exception type with __slots__: the traceback text still follows it
        pass
    return cause


def remote_origin(exc: BaseException) -> str | None:
    """Where an exception unwrapped by :func:`unwrap_remote` was raised in its actor."""
    return getattr(exc, "remote_origin", None)
