"""The retry policy every remote binding uses (bindings/retry.py, invariants 1-3)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from slts.bindings.retry import MAX_ATTEMPTS_LIMIT, RetryPolicy

from slts.errors import ChunkExists, ChunkNotFound, InvalidConfig, StorageUnavailable


class Flaky:
    """Raises the given errors in turn, then returns ``"done"``; counts its calls."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


def unavailable() -> StorageUnavailable:
    return StorageUnavailable("not now")


@given(
    attempt=st.integers(1, 200),
    fraction=st.floats(0, 1),
    base=st.floats(0, 2),
    cap=st.floats(0, 5),
    jitter=st.floats(0, 1),
)
def test_every_delay_is_within_the_jitter_range_under_the_cap(attempt, fraction, base, cap, jitter) -> None:
    policy = RetryPolicy(3, delay_s_base=min(base, cap), delay_s_max=cap, jitter=jitter)
    exponential = min(cap, min(base, cap) * 2.0 ** (attempt - 1))
    delay_s = policy.delay_s(attempt, fraction)
    assert exponential * (1 - jitter) - 1e-9 <= delay_s <= exponential + 1e-9
    assert delay_s <= cap + 1e-9


def test_without_jitter_delays_double_up_to_the_cap() -> None:
    policy = RetryPolicy(6, delay_s_base=0.5, delay_s_max=2.0, jitter=0.0)
    assert [policy.delay_s(attempt) for attempt in range(1, 6)] == [0.5, 1.0, 2.0, 2.0, 2.0]


def test_a_transient_failure_is_retried_and_the_sleeps_are_counted() -> None:
    sleeps: list[float] = []
    retried: list[int] = []
    call = Flaky(unavailable(), unavailable())
    policy = RetryPolicy(4, delay_s_base=0.1, delay_s_max=1.0, jitter=0.0)
    result = policy.run(
        call, sleep=sleeps.append, on_retry=lambda error, attempt, delay_s: retried.append(attempt)
    )
    assert (result, call.calls, sleeps, retried) == ("done", 3, [0.1, 0.2], [1, 2])


def test_attempts_are_bounded_and_the_last_error_propagates() -> None:
    sleeps: list[float] = []
    errors = [unavailable() for _ in range(5)]
    call = Flaky(*errors)
    with pytest.raises(StorageUnavailable) as caught:
        RetryPolicy(3).run(call, sleep=sleeps.append)
    assert call.calls == 3 and len(sleeps) == 2 and caught.value is errors[2]


def test_other_errors_are_not_retried() -> None:
    sleeps: list[float] = []
    call = Flaky(ChunkExists("taken"))
    with pytest.raises(ChunkExists):
        RetryPolicy(5).run(call, sleep=sleeps.append)
    assert call.calls == 1 and sleeps == []


def test_retryable_decides_what_is_retried() -> None:
    call = Flaky(KeyError("odd"))
    assert (
        RetryPolicy(2).run(call, sleep=lambda _: None, retryable=lambda e: isinstance(e, KeyError)) == "done"
    )


def test_settle_is_asked_only_after_a_retry() -> None:
    asked: list[Exception] = []

    def settle(error: Exception) -> bool:
        asked.append(error)
        return isinstance(error, ChunkNotFound)

    with pytest.raises(ChunkNotFound):  # first attempt: the answer is not ambiguous
        RetryPolicy(3).run(Flaky(ChunkNotFound("gone")), sleep=lambda _: None, settle=settle)
    assert asked == []
    # A lost answer, then "not found": the first attempt did it.
    assert (
        RetryPolicy(3).run(Flaky(unavailable(), ChunkNotFound("gone")), sleep=lambda _: None, settle=settle)
        is None
    )
    with pytest.raises(ChunkExists):  # settle says no: the error stands
        RetryPolicy(3).run(Flaky(unavailable(), ChunkExists("taken")), sleep=lambda _: None, settle=settle)
    assert len(asked) == 2


@pytest.mark.parametrize(
    "arguments",
    [
        {"max_attempts": 0},
        {"max_attempts": MAX_ATTEMPTS_LIMIT + 1},
        {"max_attempts": True},
        {"max_attempts": 2.0},
        {"delay_s_base": -1.0},
        {"delay_s_base": 3.0, "delay_s_max": 2.0},
        {"delay_s_base": float("nan")},
        {"jitter": 1.5},
    ],
)
def test_bad_settings_are_invalid_config(arguments: dict) -> None:
    with pytest.raises(InvalidConfig):
        RetryPolicy(**arguments)
