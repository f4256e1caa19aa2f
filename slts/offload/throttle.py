"""Offload throttling (PIP-211): broker-wide flow permits on the bytes offload reads from
its source.

PIP-211 decorates the ledger read handle an offload reads from, and every offload of the
process draws from one budget of bytes per second, so that offloading does not starve
the bookies (here: whatever the source handle reads from) of the bandwidth that serves
consumers. ``FlowPermits`` is that budget: a token bucket refilled at ``bytes_per_second``
holding at most ``burst_seconds`` of it, started empty. A read takes its estimated bytes
(entries asked times the ledger's average entry size, as PIP-211 does) before it reads,
going into debt if needed and sleeping until the debt is paid; once the read returns,
the difference to the actual bytes is settled without sleeping. So over any interval the
bytes read are at most the rate times the interval, plus the burst after idleness, plus
one read: a single request larger than the budget is delayed, never refused.

``None``, 0 or a negative rate means unthrottled, as in Pulsar. Metrics: bytes read,
reads, reads that waited, seconds waited (PIP-211's ``ledger_offload_limited`` and
``ledger_offload_time``). The bucket is ``slts.limiter``'s: these permits pace what offload
reads from its *source*; what it writes to tier-2 goes through the container's priority
limiter (``slts.limiter``) as the OFFLOAD class.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from slts.errors import InvalidArgument
from slts.limiter import TokenBucket
from slts.offload.ledger_metadata import LedgerMetadata
from slts.offload.ledgers import Entry, LedgerReadHandle


@dataclass(frozen=True, slots=True)
class ThrottleStats:
    """What the permits have let through and held back, since they were made."""

    bytes_read: int
    reads: int
    reads_throttled: int
    seconds_throttled: float


class FlowPermits:
    """Bytes per second shared by every throttled reader holding this object (thread-safe).

    ``clock`` and ``sleep`` are injectable (a fake clock's ``advance`` as ``sleep`` makes
    time move only when a reader waits)."""

    def __init__(
        self,
        bytes_per_second: int | None,
        *,
        burst_seconds: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if bytes_per_second is not None and (
            isinstance(bytes_per_second, bool) or not isinstance(bytes_per_second, int)
        ):
            raise InvalidArgument(
                f"flow permits must be an integer number of bytes per second, got {bytes_per_second!r}"
            )
        if (
            isinstance(burst_seconds, bool)
            or not isinstance(burst_seconds, int | float)
            or not 0 < burst_seconds <= 60
        ):
            raise InvalidArgument(f"burst_seconds must be in (0, 60], got {burst_seconds!r}")
        self.rate = bytes_per_second if bytes_per_second is not None and bytes_per_second > 0 else None
        self.burst_seconds = float(burst_seconds)
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._bucket = TokenBucket(self.burst_seconds, clock())
        self._bytes = 0
        self._reads = 0
        self._throttled = 0
        self._waited = 0.0

    @property
    def unthrottled(self) -> bool:
        """True when no rate is set (``None``, 0 or negative)."""
        return self.rate is None

    def acquire(self, estimate: int) -> float:
        """Take ``estimate`` bytes before a read; sleep until they are paid for. Returns
        the seconds slept."""
        assert estimate >= 0, estimate
        if self.rate is None:
            return 0.0
        with self._lock:
            wait = self._bucket.reserve(estimate, self.rate, self._clock())
        if wait > 0:
            self._sleep(wait)
        return wait

    def settle(self, estimate: int, actual: int, waited: float) -> None:
        """After the read: correct the bucket by ``actual - estimate`` (no sleep; a debt
        is paid by the next reader) and count the read."""
        with self._lock:
            if self.rate is not None:
                self._bucket.adjust(actual - estimate)
            self._bytes += actual
            self._reads += 1
            self._throttled += waited > 0
            self._waited += waited

    def stats(self) -> ThrottleStats:
        """The counters so far."""
        with self._lock:
            return ThrottleStats(self._bytes, self._reads, self._throttled, self._waited)


class ThrottledReadHandle:
    """PIP-211's ``OffloadReadHandle``: ``handle`` with its reads paid from ``permits``;
    everything else is the handle's own."""

    def __init__(self, handle: LedgerReadHandle, permits: FlowPermits) -> None:
        if not isinstance(handle, LedgerReadHandle):
            raise InvalidArgument(f"{handle!r} is not a ledger read handle")
        if not isinstance(permits, FlowPermits):
            raise InvalidArgument(f"{permits!r} is not FlowPermits")
        self._handle = handle
        self._permits = permits

    @property
    def ledger_id(self) -> int:
        return self._handle.ledger_id

    @property
    def last_entry_id(self) -> int:
        return self._handle.last_entry_id

    @property
    def length(self) -> int:
        return self._handle.length

    @property
    def closed(self) -> bool:
        return self._handle.closed

    @property
    def metadata(self) -> LedgerMetadata:
        return self._handle.metadata

    def read(self, first: int, last: int) -> Sequence[Entry]:
        """The inner handle's ``read``, after the permits allow its estimated bytes."""
        entries_in_ledger = max(1, self._handle.last_entry_id + 1)
        average = max(1, self._handle.length // entries_in_ledger)
        estimate = (
            max(0, last - first + 1) * average if isinstance(first, int) and isinstance(last, int) else 0
        )
        waited = self._permits.acquire(estimate)
        try:
            entries = self._handle.read(first, last)
        except BaseException:
            self._permits.settle(estimate, 0, waited)  # nothing was read: the bytes go back
            raise
        self._permits.settle(estimate, sum(map(len, entries)), waited)
        return entries


class _ProcessPermits:
    """The process-wide permits, replaced whole when the rate is set."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.permits = FlowPermits(None)


_PROCESS = _ProcessPermits()


def process_flow_permits() -> FlowPermits:
    """The permits every offloader of this process shares unless given its own
    (unthrottled until ``set_process_flow_permits``)."""
    with _PROCESS.lock:
        return _PROCESS.permits


def set_process_flow_permits(bytes_per_second: int | None) -> FlowPermits:
    """Set the process-wide rate (PIP-211's ``managedLedgerOffloadBrokerFlowPermits``;
    ``None``, 0 or negative: unthrottled) and return the new permits; offloads started
    from now on draw from them."""
    permits = FlowPermits(bytes_per_second)
    with _PROCESS.lock:
        _PROCESS.permits = permits
    return permits
