"""corerl.start_up: few garbage collections while a process starts, the thresholds as they were after."""

from __future__ import annotations

import gc

import pytest

from corerl import start_up


@pytest.fixture(autouse=True)
def _thresholds():
    before, saved = gc.get_threshold(), start_up._saved
    start_up._saved = None  # as in a process that has not begun
    yield
    gc.set_threshold(*before)
    start_up._saved = saved


def test_starting_raises_the_youngest_threshold_and_restores_all_three_after():
    gc.set_threshold(700, 11, 12)
    with start_up.starting():
        assert gc.get_threshold() == (start_up.START_UP_THRESHOLD, 11, 12)
    assert gc.get_threshold() == (700, 11, 12)


def test_the_thresholds_come_back_when_start_up_fails():
    gc.set_threshold(700, 10, 10)
    with pytest.raises(ValueError), start_up.starting():
        raise ValueError("a backend that cannot start")
    assert gc.get_threshold() == (700, 10, 10)


def test_an_end_inside_the_block_ends_it_there_and_once():
    """The run ends start-up at its first step (corerl.run.loop); the block's own end then does nothing."""
    gc.set_threshold(700, 10, 10)
    with start_up.starting():
        start_up.begin()  # a second begin changes nothing: the end restores the first thresholds
        assert gc.get_threshold()[0] == start_up.START_UP_THRESHOLD
        start_up.end()
        assert gc.get_threshold() == (700, 10, 10)
        gc.set_threshold(900, 10, 10)  # set by someone else after the end: left alone
    assert gc.get_threshold() == (900, 10, 10)


def test_a_higher_threshold_already_set_is_kept():
    gc.set_threshold(100_000, 10, 10)
    with start_up.starting():
        assert gc.get_threshold()[0] == 100_000
    assert gc.get_threshold() == (100_000, 10, 10)
