"""An exception raised in a Ray actor reaches the driver with the actor's traceback chained to it
(shown under CORERL_DEBUG=1) and, where its message is empty, the one-line error says where it was
raised. The RayTaskError is Ray's own, built as Ray builds it from a real traceback."""

from __future__ import annotations

import traceback

from corerl.cli import _internal_error_line
from corerl.distributed.remote_errors import RemoteTraceback, last_frame, unwrap_remote


def _bare_assert() -> None:
    raise AssertionError  # an empty message, as the bare asserts of torch's CUDA-graph trees give


def _ray_task_error() -> BaseException:
    from ray.exceptions import RayTaskError

    try:
        _bare_assert()
    except AssertionError as exc:
        return RayTaskError("GenerationWorker.generate", traceback.format_exc(), exc, proctitle="worker",
                            pid=1234, ip="127.0.0.1").as_instanceof_cause()
    raise AssertionError("the assert above must fail")


def test_the_actors_traceback_is_chained_to_the_exception_it_raised():
    cause = unwrap_remote(_ray_task_error())
    assert type(cause) is AssertionError
    assert isinstance(cause.__cause__, RemoteTraceback) and cause.__suppress_context__
    assert "_bare_assert" in str(cause.__cause__) and "raise AssertionError" in str(cause.__cause__)
    assert cause.remote_origin.endswith("test_remote_errors.py:14 in _bare_assert"), cause.remote_origin


def test_the_one_line_error_says_where_an_empty_message_was_raised():
    cause = unwrap_remote(_ray_task_error())
    line = _internal_error_line(cause)
    assert line.startswith("AssertionError raised at ") and line.endswith("test_remote_errors.py:14 in _bare_assert")
    assert _internal_error_line(ValueError("first\nsecond")) == "ValueError: first"


def test_last_frame_of_a_traceback_without_frames_is_none():
    assert last_frame("RuntimeError: no frames here") is None
