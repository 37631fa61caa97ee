"""The check that a ``corerl`` command refused its input the way every refusal must: exit status 2
and one line on stderr, ``corerl: error: <key>: <why>``, naming the key to change and no traceback.
Written once here for the tests that ran it by hand (``assert code == 2``, ``(line,) =
err.strip().splitlines()``, the key and the words in the line)."""

from __future__ import annotations

from typing import Any

PREFIX = "corerl: error: "


def refused_in_one_line(result: Any, *says: str, key: str | None = None, code: int = 2) -> str:
    """The one line a refused command wrote, after checking it: ``result`` is a
    :class:`tests.conftest.CliResult` (a ``corerl`` subprocess) or an ``(exit status, stderr)``
    pair (a command run in process); the status is ``code``, stderr holds exactly one line and no
    traceback, the line starts with ``corerl: error: `` and then ``key: `` where ``key`` is given,
    and it holds each of ``says``."""
    status, err = (result.code, result.err) if hasattr(result, "err") else result
    assert status == code, (status, result)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, result
    (line,) = lines
    start = PREFIX + (f"{key}: " if key is not None else "")
    assert line.startswith(start), (start, line)
    for text in says:
        assert text in line, (text, line)
    return line
