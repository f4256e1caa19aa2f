"""One priority rate limiter for all tier-2 traffic (bytes/s and requests/s per class).

Every call to a chunk storage belongs to a *traffic class*; the classes in priority order:

    TAIL_WRITE > READ > OFFLOAD > DEFRAG > GC > SCRUB

A ``PriorityLimiter`` holds, per class, an optional limit of its own (``Limit``: bytes per
second, requests per second) and, optionally, a ``total`` limit the classes share. One
limiter is shared by every user of one chunk storage in the process; the engine puts it in
the one place every binding call passes through (``slts.storage.gate``), so callers only
say which class they are (``traffic_class(TrafficClass.GC)``, a context variable; calls
outside any say ``TAIL_WRITE`` for changes and ``READ`` for reads).

**Buckets.** Each limit is a token bucket that starts empty, refills at its rate and holds
at most ``burst_s`` seconds of it. A request takes its amount at once, going into debt,
and waits until the debt is paid (a *reservation*): requests are served in arrival order,
one larger than the burst is delayed, never refused, and over any interval the amount let
through is at most rate x interval + burst + one request.

**Priority within the total.** Each class draws from the total through a bucket of its own
at its *share* of the total, recomputed at each of its requests from the top class down: a
class gets what the active classes above it leave, less the minimum share (``min_share`` of
the total) kept for each active class below it, and never less than ``min_share``. A class
above whose share bucket is in debt wants all of its share; one that is not uses what it
used lately (an exponentially decayed rate over ``burst_s``). So the highest active class
gets nearly everything, a lower one what the higher ones leave, no active class starves,
and a class that goes idle (nothing used for a few ``burst_s``) leaves its share to the
ones below.

``reserve`` returns the seconds to wait without sleeping (what simulations and tests
drive); ``acquire`` sleeps them. Counters per class: bytes, requests, throttled requests,
seconds throttled (PIP-211's metrics, for every class). The clock and sleep are injectable.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from slts.errors import InvalidArgument


class TrafficClass(enum.IntEnum):
    """What a chunk storage call is for; a lower value is a higher priority."""

    TAIL_WRITE = 0
    READ = 1
    OFFLOAD = 2
    DEFRAG = 3
    GC = 4
    SCRUB = 5


_CURRENT: contextvars.ContextVar[TrafficClass | None] = contextvars.ContextVar(
    "slts_traffic_class", default=None
)


@contextlib.contextmanager
def traffic_class(kind: TrafficClass) -> Iterator[None]:
    """Chunk storage calls made inside (in this thread or task) count as ``kind``."""
    if not isinstance(kind, TrafficClass):
        raise InvalidArgument(f"{kind!r} is not a TrafficClass")
    token = _CURRENT.set(kind)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current_traffic_class(default: TrafficClass) -> TrafficClass:
    """The class set by the innermost ``traffic_class``, else ``default``."""
    kind = _CURRENT.get()
    return default if kind is None else kind


@dataclass(frozen=True, slots=True)
class Limit:
    """Bytes and requests per second; ``None`` (or 0) is unlimited."""

    bytes_per_s: float | None = None
    requests_per_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("bytes_per_s", "requests_per_s"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
            ):
                raise InvalidArgument(f"{name} must be a non-negative number or None, got {value!r}")


@dataclass(frozen=True, slots=True)
class ClassStats:
    """What one class was let through and held back."""

    bytes: int
    requests: int
    requests_throttled: int
    seconds_throttled: float


class TokenBucket:
    """A reservation token bucket (see module doc), started empty; not thread-safe (its
    owner's lock guards it)."""

    __slots__ = ("burst_s", "rate", "tokens", "updated")

    def __init__(self, burst_s: float, now: float) -> None:
        self.burst_s = burst_s
        self.rate = 0.0
        self.tokens = 0.0
        self.updated = now

    def in_debt(self, now: float) -> bool:
        """Whether requests already taken still wait (at the last rate)."""
        return self.tokens + max(0.0, now - self.updated) * self.rate < 0

    def reserve(self, amount: float, rate: float, now: float) -> float:
        """Take ``amount`` at ``rate``; the seconds until the debt is paid."""
        assert rate > 0 and amount >= 0, (rate, amount)
        self.tokens = min(rate * self.burst_s, self.tokens + max(0.0, now - self.updated) * rate)
        self.updated = max(now, self.updated)
        self.rate = rate
        self.tokens -= amount
        return -self.tokens / rate if self.tokens < 0 else 0.0

    def adjust(self, amount: float) -> None:
        """Take ``amount`` more (or give back a negative amount) without waiting: a
        reservation's estimate corrected once the actual size is known."""
        self.tokens -= amount


class _Usage:
    """An exponentially decayed rate (per second, time constant ``tau``)."""

    __slots__ = ("rate", "tau", "updated")

    def __init__(self, tau: float, now: float) -> None:
        self.tau = tau
        self.rate = 0.0
        self.updated = now

    def at(self, now: float) -> float:
        return self.rate * math.exp(-(now - self.updated) / self.tau) if now > self.updated else self.rate

    def add(self, amount: float, now: float) -> None:
        self.rate = self.at(now) + amount / self.tau
        self.updated = max(now, self.updated)


#: The defaults of ``PriorityLimiter``'s ``min_share`` and ``burst_s``.
MIN_SHARE_DEFAULT = 0.05
BURST_S_DEFAULT = 1.0
#: Below this fraction of the total a class counts as idle.
_ACTIVE_FRACTION = 1e-3


class PriorityLimiter:
    """The limiter of one chunk storage (thread-safe; see module doc)."""

    def __init__(
        self,
        limits: Mapping[TrafficClass, Limit] | None = None,
        *,
        total: Limit | None = None,
        min_share: float = MIN_SHARE_DEFAULT,
        burst_s: float = BURST_S_DEFAULT,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        limits = dict(limits or {})
        for kind, limit in limits.items():
            if not isinstance(kind, TrafficClass) or not isinstance(limit, Limit):
                raise InvalidArgument(f"limits map TrafficClass to Limit, got {kind!r}: {limit!r}")
        if total is not None and not isinstance(total, Limit):
            raise InvalidArgument(f"total must be a Limit, got {total!r}")
        if isinstance(min_share, bool) or not isinstance(min_share, int | float):
            raise InvalidArgument(f"min_share must be a number, got {min_share!r}")
        if not 0 < min_share * len(TrafficClass) <= 1:
            raise InvalidArgument(f"min_share must be in (0, 1/{len(TrafficClass)}], got {min_share!r}")
        if isinstance(burst_s, bool) or not isinstance(burst_s, int | float) or not 0 < burst_s <= 60:
            raise InvalidArgument(f"burst_s must be in (0, 60], got {burst_s!r}")
        self.limits = {kind: limits.get(kind, Limit()) for kind in TrafficClass}
        self.total = total if total is not None else Limit()
        self.min_share = float(min_share)
        self.burst_s = float(burst_s)
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        now = clock()
        # per class: (own bytes, own requests, share of the total bytes, of the total requests)
        self._buckets = {
            kind: tuple(TokenBucket(self.burst_s, now) for _ in range(4)) for kind in TrafficClass
        }
        self._usage = {kind: (_Usage(self.burst_s, now), _Usage(self.burst_s, now)) for kind in TrafficClass}
        self._counts = {kind: [0, 0, 0, 0.0] for kind in TrafficClass}

    @property
    def unlimited(self) -> bool:
        """True when no limit is set at all (every request passes at once)."""
        limits = [*self.limits.values(), self.total]
        return not any(limit.bytes_per_s or limit.requests_per_s for limit in limits)

    def reserve(self, kind: TrafficClass, nbytes: int, requests: int = 1) -> float:
        """Take ``nbytes`` and ``requests`` for class ``kind`` now; return the seconds the
        caller must wait before it goes ahead (0: at once)."""
        assert isinstance(kind, TrafficClass), kind
        assert nbytes >= 0 and requests >= 0, (nbytes, requests)
        with self._lock:
            now = self._clock()
            own_bytes, own_requests, share_bytes, share_requests = self._buckets[kind]
            limit = self.limits[kind]
            waits = [0.0]
            if limit.bytes_per_s:
                waits.append(own_bytes.reserve(nbytes, limit.bytes_per_s, now))
            if limit.requests_per_s:
                waits.append(own_requests.reserve(requests, limit.requests_per_s, now))
            for which, amount, share, total in (
                (0, nbytes, share_bytes, self.total.bytes_per_s),
                (1, requests, share_requests, self.total.requests_per_s),
            ):
                if total:
                    waits.append(share.reserve(amount, self._shares(kind, which, total, now) * total, now))
            self._usage[kind][0].add(nbytes, now)
            self._usage[kind][1].add(requests, now)
            wait = max(waits)
            counts = self._counts[kind]
            counts[0] += nbytes
            counts[1] += requests
            counts[2] += wait > 0
            counts[3] += wait
            return wait

    def acquire(self, kind: TrafficClass, nbytes: int, requests: int = 1) -> float:
        """``reserve``, then sleep the wait; returns the seconds slept."""
        wait = self.reserve(kind, nbytes, requests)
        if wait > 0:
            self._sleep(wait)
        return wait

    def _shares(self, kind: TrafficClass, which: int, total: float, now: float) -> float:
        """``kind``'s fraction of the total (module doc), the active classes taken from the
        top: each gets what the ones above left, less ``min_share`` for each active one
        below, at least ``min_share``; a class whose share bucket is in debt wants all of
        its share, any other uses what it used lately (at most its share)."""
        active = [
            other
            for other in TrafficClass
            if other == kind or self._usage[other][which].at(now) >= _ACTIVE_FRACTION * total
        ]
        remaining = 1.0
        for place, other in enumerate(active):
            below = len(active) - place - 1
            share = max(self.min_share, remaining - below * self.min_share)
            if other == kind:
                return share
            bucket = self._buckets[other][2 + which]
            used = share if bucket.in_debt(now) else min(share, self._usage[other][which].at(now) / total)
            remaining = max(0.0, remaining - used)
        raise AssertionError(f"{kind} is active")  # pragma: no cover - kind is in the list

    def stats(self) -> dict[TrafficClass, ClassStats]:
        """The counters of every class so far."""
        with self._lock:
            return {
                kind: ClassStats(int(c[0]), int(c[1]), int(c[2]), float(c[3]))
                for kind, c in self._counts.items()
            }
