"""Fewer garbage collections while a corerl process starts (the ``corerl`` command, each rank's and
generation worker's Ray actor).

CPython runs its cyclic collector on the youngest generation every 700 net allocations and, every
hundred of those, walks every object the process holds. Starting a rank imports torch,
transformers and a backend (a million objects and more), so those walks grow with every module
imported: measured on this project's 2-core machine, importing transformers' models, the dtensor
worker and DeepSpeed and building the tiny model took 7.3-8.0 s of CPU with the default and
5.7-6.2 s with the youngest generation's threshold at 50,000 (5.9-6.0 s with no collection at
all). The test suite starts hundreds of such processes; a cluster job, one per GPU.

While starting, the threshold is 50,000; once started it is what it was, so that a long run
collects as before (nothing is frozen: an object dropped later in a cycle is still collected).
Why not :func:`gc.freeze`: objects frozen at start-up are never collected, and a worker that drops
what it built while starting (a model replaced by a checkpoint's) would keep it."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

#: the youngest generation's threshold while a process starts (CPython's default: 700)
START_UP_THRESHOLD = 50_000

_saved: tuple[int, int, int] | None = None  # the thresholds before begin(), while starting


def begin() -> None:
    """Collect rarely from here until :func:`end` (a second call before it changes nothing)."""
    global _saved
    if _saved is not None:
        return
    _saved = gc.get_threshold()
    first, second, third = _saved
    gc.set_threshold(max(first, START_UP_THRESHOLD), second, third)


def end() -> None:
    """The thresholds as they were before :func:`begin` (nothing to do without one)."""
    global _saved
    if _saved is not None:
        gc.set_threshold(*_saved)
        _saved = None


@contextmanager
def starting() -> Iterator[None]:
    """:func:`begin` on entry and :func:`end` on exit, however the block ends."""
    begin()
    try:
        yield
    finally:
        end()
