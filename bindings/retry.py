"""One retry policy for every remote binding: bounded attempts, exponential backoff with jitter.

A binding holds one ``RetryPolicy`` (built from its ``max_attempts`` option, the one name
every binding uses in its URL and constructor) and runs each request that may be retried
through ``RetryPolicy.run``. What is worth a retry (``retryable``), what to count or log
before one (``on_retry``) and how to settle an ambiguous outcome (``settle``) stay with the
binding; how often and how long to wait is decided here, once.

Invariants (asserted here, checked by ``tests/conformance/test_retry.py``):

1. At most ``max_attempts`` calls per ``run``, so at most ``max_attempts - 1`` sleeps.
2. ``delay_s(attempt)`` is within ``[d * (1 - jitter), d]`` where
   ``d = min(delay_s_max, delay_s_base * 2 ** (attempt - 1))``: never above the cap.
3. ``run`` never sleeps after the last attempt and never swallows an error it does not
   retry (unless ``settle`` says the wanted effect is there).

Ambiguous outcomes: when an attempt fails in a way that may have come after the storage
applied it (a lost answer), the retry can fail *because* the first attempt succeeded (a
conditional create answered "exists", a delete answered "not found"). ``settle`` is asked
about such a final, non-retryable error once at least one attempt was retried; it decides
(a binding-specific check, e.g. "is the object now our own write?") whether the call in
fact succeeded, in which case ``run`` returns ``None``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar, overload

from slts.errors import InvalidConfig, StorageUnavailable

T = TypeVar("T")

#: The attempts a binding makes by default (first try included).
MAX_ATTEMPTS_DEFAULT = 5
#: The most attempts any binding accepts: a bound on every retry loop.
MAX_ATTEMPTS_LIMIT = 100
#: Jitter by default: each delay is drawn from [50 %, 100 %] of its exponential value.
JITTER_DEFAULT = 0.5


def is_unavailable(error: Exception) -> bool:
    """The default retry test: the storage said "not now" (``StorageUnavailable``)."""
    return isinstance(error, StorageUnavailable)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounded retries with capped exponential backoff and jitter (see module doc).

    ``max_attempts`` counts the first attempt; ``delay_s_base`` is the delay before the
    second one, doubled before each further one up to ``delay_s_max``; ``jitter`` is the
    fraction of each delay drawn at random (0: exact delays, 1: anywhere from 0 to the
    delay). Raises ``InvalidConfig`` for values outside these ranges.
    """

    max_attempts: int = MAX_ATTEMPTS_DEFAULT
    delay_s_base: float = 0.05
    delay_s_max: float = 2.0
    jitter: float = JITTER_DEFAULT

    def __post_init__(self) -> None:
        attempts = self.max_attempts
        if (
            isinstance(attempts, bool)
            or not isinstance(attempts, int)
            or not 1 <= attempts <= MAX_ATTEMPTS_LIMIT
        ):
            raise InvalidConfig(
                f"max_attempts must be an integer in [1, {MAX_ATTEMPTS_LIMIT}], got {attempts!r}"
            )
        if not 0 <= self.delay_s_base <= self.delay_s_max:
            raise InvalidConfig(
                f"retry delays must satisfy 0 <= base <= max, got {self.delay_s_base!r}, {self.delay_s_max!r}"
            )
        if not 0 <= self.jitter <= 1:
            raise InvalidConfig(f"retry jitter must be in [0, 1], got {self.jitter!r}")

    def delay_s(self, attempt: int, fraction: float | None = None) -> float:
        """The wait after failed attempt number ``attempt`` (1-based), invariant 2.

        ``fraction`` in ``[0, 1)`` picks the point in the jitter range (default: random).
        """
        assert attempt >= 1, attempt
        exponential = min(self.delay_s_max, self.delay_s_base * 2.0 ** min(attempt - 1, 1000))
        drawn = random.random() if fraction is None else fraction
        assert 0 <= drawn <= 1, drawn
        return exponential * (1 - self.jitter + self.jitter * drawn)

    @overload
    def run(
        self,
        call: Callable[[], T],
        *,
        sleep: Callable[[float], None],
        retryable: Callable[[Exception], bool] = ...,
        on_retry: Callable[[Exception, int, float], None] | None = ...,
        settle: None = None,
    ) -> T: ...

    @overload
    def run(
        self,
        call: Callable[[], T],
        *,
        sleep: Callable[[float], None],
        retryable: Callable[[Exception], bool] = ...,
        on_retry: Callable[[Exception, int, float], None] | None = ...,
        settle: Callable[[Exception], bool],
    ) -> T | None: ...

    def run(
        self,
        call: Callable[[], T],
        *,
        sleep: Callable[[float], None],
        retryable: Callable[[Exception], bool] = is_unavailable,
        on_retry: Callable[[Exception, int, float], None] | None = None,
        settle: Callable[[Exception], bool] | None = None,
    ) -> T | None:
        """``call()`` until it returns, raises an error ``retryable`` refuses, or the
        attempts run out (then its last error propagates, unchanged).

        Before each retry ``on_retry(error, attempt, delay_s)`` runs (to count or log;
        ``attempt`` is the failed one, 1-based), then ``sleep(delay_s)`` (tests inject a fake).
        ``settle(error)``: see the module doc; asked only after a retry, only for an error
        ``retryable`` refuses; if it returns True, ``run`` returns ``None``.
        """
        for attempt in range(1, self.max_attempts + 1):
            try:
                return call()
            except Exception as error:
                if retryable(error):
                    if attempt == self.max_attempts:
                        raise
                    delay_s = self.delay_s(attempt)
                    if on_retry is not None:
                        on_retry(error, attempt, delay_s)
                    sleep(delay_s)
                    continue
                if settle is not None and attempt > 1 and settle(error):
                    return None
                raise
        raise AssertionError("unreachable: the last attempt returns or raises")
