"""The recovery tests' comparison (tests/recovery_runs.py ``assert_same_steps``) can fail: a
metric one run logged as None and the other as a number is a difference, in either order."""

from __future__ import annotations

import pytest

from tests.recovery_runs import assert_same_steps


def _row(**metrics: object) -> dict:
    return {"phase": "grpo", "step": 1, "note": "x", **metrics}


def test_equal_rows_pass_with_none_in_both():
    assert_same_steps([_row(loss=0.5, kl=None, lengths=[1.0, 2.0])], [_row(loss=0.5, kl=None, lengths=[1.0, 2.0])])


@pytest.mark.parametrize("want, got", [(None, 0.5), (0.5, None), (None, [1.0]), (None, "text")])
def test_a_none_in_one_run_and_a_value_in_the_other_fails(want, got):
    with pytest.raises(AssertionError, match="kl"):
        assert_same_steps([_row(loss=0.5, kl=want)], [_row(loss=0.5, kl=got)])


def test_numbers_apart_by_more_than_the_tolerance_fail():
    with pytest.raises(AssertionError, match="loss"):
        assert_same_steps([_row(loss=0.5)], [_row(loss=0.5001)])
