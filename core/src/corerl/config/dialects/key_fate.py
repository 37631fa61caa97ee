"""What a dialect did with each key of a recipe (:class:`KeyFate`): the record every dialect
writes and ``corerl validate --explain`` shows. Its own module so that a dialect imports it
without importing the package that detects the dialects (:mod:`corerl.config.dialects`, which
re-exports it)."""

from __future__ import annotations

from typing import Literal

import attrs


@attrs.frozen
class KeyFate:
    """What a dialect did with one key: ``acts`` (mapped to ``detail``, a corerl key),
    ``inert`` (accepted, no effect; ``detail`` says why) or ``unknown`` (neither the dialect's table
    nor corerl knows it: left out with a warning, refused with ``--strict``; ``detail`` is its file)."""

    key: str
    fate: Literal["acts", "inert", "unknown"]
    detail: str
