"""What a container asks of its chunk storage: requests by kind, bytes and call latency,
per traffic class, in process and kept in the metadata store for ``slts cost``.

A ``UsageMeter`` counts, for each traffic class (``slts.limiter``):

* **requests by kind** (``REQUEST_KINDS``: PUT, GET, HEAD, LIST, DELETE, COPY,
  MULTIPART). A binding that counts its own requests (``counts_own_requests``: S3) tells
  the meter each request it sends, retries included, so the counts are the ones the
  storage bills. For the others (filesystem, HDFS, memory) every call counts as the one
  request an object store would need for it (``CALL_KINDS``): these are the requests the
  same traffic would make on an object store, what capacity planning prices;
* **bytes** sent (create, write), received (read) and copied inside the storage (the
  sources of a native concat);
* **latency** of every binding call by call name (a fixed-bucket histogram, seconds) and
  **errors** by call and error type: in process only (metrics).

``GatedChunkStorage`` (``slts.storage.gate``) feeds it from the one place every binding call
passes. The counts since the last flush are added to the ``usage`` table of the metadata
store (one record per container and class) by ``flush``: periodically while the container
runs and when it closes, in one conditional commit (retried on a conflict with another
process adding its own). So ``slts cost`` sees the requests of every process that ran the
container, less at most one flush interval of a process that was killed (accounting, not
layout: documented in docs/operations.md).

An owner flushes through its ownership's fenced commit (``flush``'s ``commit``): once a
newer epoch started the container, its flush raises ``Fenced`` and writes nothing, and at
close its unflushed counts are dropped (``drop_unflushed``) with a log line, like every
other change of a fenced instance (DESIGN.md §5 invariant 4). A read-only instance and a
defrag batch driver own no epoch and fence nobody: they record their usage with a plain
conditional commit.
"""

from __future__ import annotations

import bisect
import logging
import struct
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from slts.bindings.base import REQUEST_KINDS
from slts.errors import Fenced, InvalidArgument, VersionConflict
from slts.limiter import TrafficClass, current_traffic_class
from slts.metadata.records import Record
from slts.metadata.schema import USAGE
from slts.metadata.store import Expect, MetadataStore, Operation, Put, ReadView, prefix_stop

_log = logging.getLogger(__name__)

#: How a flush commits: ``(ops, expect) -> sequence``, raising ``VersionConflict`` (or
#: ``Fenced``) with nothing applied, as ``MetadataStore.commit`` and ``Ownership.commit``.
Commit = Callable[[Sequence[Operation], Sequence[Expect]], int]

#: The request an object store needs for each binding call, for bindings that do not count
#: their own (see module doc). A write appends on a filesystem; on an object store it is a
#: new object (the engine writes a new chunk): one PUT either way.
CALL_KINDS: Mapping[str, str] = MappingProxyType(
    {
        "exists": "HEAD",
        "get_info": "HEAD",
        "create": "PUT",
        "write": "PUT",
        "read": "GET",
        "list": "LIST",
        "delete": "DELETE",
        "concat": "COPY",
        "truncate": "PUT",
        "set_readonly": "PUT",
    }
)
#: Upper bounds (seconds) of the latency histogram's buckets; the last one is +Inf.
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    float("inf"),
)
#: How often a running container adds its counts to the metadata store, by default.
FLUSH_INTERVAL_S_DEFAULT = 30.0
_FLUSH_ATTEMPTS = 8
_CONTAINER = struct.Struct(">Q")
_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class UsageRecord(Record):
    """What one traffic class of one container asked of the chunk storage, in total."""

    KIND: ClassVar[str] = "usage"

    requests: Mapping[str, int]
    bytes_sent: int
    bytes_received: int
    bytes_copied: int
    extra: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, compare=False)

    def check(self) -> None:
        assert isinstance(self.requests, Mapping), self.requests
        for kind, count in self.requests.items():
            assert isinstance(kind, str) and isinstance(count, int) and count >= 0, (kind, count)
        for value in (self.bytes_sent, self.bytes_received, self.bytes_copied):
            assert isinstance(value, int) and value >= 0, value

    def plus(self, other: UsageRecord) -> UsageRecord:
        """The sum of two records."""
        return self._combined(other, 1)

    def minus(self, earlier: UsageRecord) -> UsageRecord:
        """What was added since ``earlier`` (a record this one grew from); kinds without
        new requests are left out."""
        return self._combined(earlier, -1)

    def _combined(self, other: UsageRecord, sign: int) -> UsageRecord:
        requests = dict(self.requests)
        for kind, count in other.requests.items():
            requests[kind] = requests.get(kind, 0) + sign * count
        return self.replace(
            requests={kind: count for kind, count in requests.items() if count},
            bytes_sent=self.bytes_sent + sign * other.bytes_sent,
            bytes_received=self.bytes_received + sign * other.bytes_received,
            bytes_copied=self.bytes_copied + sign * other.bytes_copied,
        )

    @property
    def request_count(self) -> int:
        return sum(self.requests.values())


EMPTY_USAGE = UsageRecord({}, 0, 0, 0)


def usage_key(container_id: int, kind: TrafficClass) -> bytes:
    """Key of a usage record: the container id (u64 BE), then the class's name."""
    return _CONTAINER.pack(container_id) + kind.name.lower().encode("ascii")


def read_usage(view: ReadView, container_id: int) -> dict[TrafficClass, UsageRecord]:
    """The recorded usage of container ``container_id`` per class (classes without any are
    absent). ``MetadataCorrupted`` for a damaged record."""
    prefix = _CONTAINER.pack(container_id)
    by_name = {kind.name.lower(): kind for kind in TrafficClass}
    usage: dict[TrafficClass, UsageRecord] = {}
    for key, versioned in view.scan(USAGE, prefix, prefix_stop(prefix)):
        kind = by_name.get(key[len(prefix) :].decode("ascii", "replace"))
        if kind is not None:  # a class a newer version added: not ours to price
            usage[kind] = UsageRecord.decode(versioned.value)
    return usage


@dataclass(frozen=True, slots=True)
class CallTimings:
    """Latency of one binding call name: counts per bucket of ``LATENCY_BUCKETS_S`` (not
    cumulative), their sum in seconds, and failures by error type."""

    buckets: tuple[int, ...]
    sum_s: float
    errors: Mapping[str, int]

    @property
    def count(self) -> int:
        return sum(self.buckets)


class _Tally:
    """Mutable counters of one class (under the meter's lock)."""

    __slots__ = ("bytes_copied", "bytes_received", "bytes_sent", "requests")

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}
        self.bytes_sent = 0
        self.bytes_received = 0
        self.bytes_copied = 0

    def record(self) -> UsageRecord:
        return UsageRecord(dict(self.requests), self.bytes_sent, self.bytes_received, self.bytes_copied)


class UsageMeter:
    """Counters of one container's chunk storage traffic (see module doc). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total = {kind: _Tally() for kind in TrafficClass}
        #: What ``flush`` has added to a store (under ``_flush_lock``): the totals then.
        self._flushed = dict.fromkeys(TrafficClass, EMPTY_USAGE)
        self._flush_lock = threading.Lock()
        self._latency: dict[str, list[int]] = {}
        self._latency_sum: dict[str, float] = {}
        self._errors: dict[str, dict[str, int]] = {}
        self._flusher: threading.Thread | None = None
        self._stop = threading.Event()

    # -- counting (the hot path) -------------------------------------------------------------

    def request(self, kind: str) -> None:
        """One request of ``kind`` sent by a binding, in the caller's traffic class (a
        ``RequestObserver``). Outside any class, a GET, HEAD or LIST is a read and anything
        else a tail write, as the limiter counts them."""
        assert kind in REQUEST_KINDS, kind
        reads = kind in ("GET", "HEAD", "LIST")
        traffic = current_traffic_class(TrafficClass.READ if reads else TrafficClass.TAIL_WRITE)
        with self._lock:
            requests = self._total[traffic].requests
            requests[kind] = requests.get(kind, 0) + 1

    def call(
        self,
        traffic: TrafficClass,
        name: str,
        seconds: float,
        *,
        request: str | None = None,
        sent: int = 0,
        received: int = 0,
        copied: int = 0,
        error: BaseException | None = None,
    ) -> None:
        """One binding call ``name`` of class ``traffic`` that took ``seconds``: its bytes,
        its request (``request``: a kind, for bindings that do not count their own) and
        the error it raised, if any."""
        slot = bisect.bisect_left(LATENCY_BUCKETS_S, seconds)
        with self._lock:
            tally = self._total[traffic]
            tally.bytes_sent += sent
            tally.bytes_received += received
            tally.bytes_copied += copied
            if request is not None:
                tally.requests[request] = tally.requests.get(request, 0) + 1
            buckets = self._latency.get(name)
            if buckets is None:
                buckets = self._latency[name] = [0] * len(LATENCY_BUCKETS_S)
                self._latency_sum[name] = 0.0
            buckets[slot] += 1
            self._latency_sum[name] += seconds
            if error is not None:
                errors = self._errors.setdefault(name, {})
                errors[type(error).__name__] = errors.get(type(error).__name__, 0) + 1

    def read_call(self, traffic: TrafficClass, seconds: float, received: int, request: str | None) -> None:
        """``call`` of a read that returned ``received`` bytes (the hot path's one: every
        chunk read passes here, so without keywords or the branches it does not need)."""
        slot = bisect.bisect_left(LATENCY_BUCKETS_S, seconds)
        with self._lock:
            tally = self._total[traffic]
            tally.bytes_received += received
            if request is not None:
                tally.requests[request] = tally.requests.get(request, 0) + 1
            buckets = self._latency.get("read")
            if buckets is None:
                buckets = self._latency["read"] = [0] * len(LATENCY_BUCKETS_S)
                self._latency_sum["read"] = 0.0
            buckets[slot] += 1
            self._latency_sum["read"] += seconds

    # -- reading -----------------------------------------------------------------------------

    def usage(self) -> dict[TrafficClass, UsageRecord]:
        """Usage since this meter was made, per class (classes with no traffic too)."""
        with self._lock:
            return {kind: tally.record() for kind, tally in self._total.items()}

    def timings(self) -> dict[str, CallTimings]:
        """Latency and errors per binding call name since this meter was made."""
        with self._lock:
            return {
                name: CallTimings(
                    tuple(buckets),
                    self._latency_sum[name],
                    MappingProxyType(dict(self._errors.get(name, {}))),
                )
                for name, buckets in self._latency.items()
            }

    # -- persisting --------------------------------------------------------------------------

    def flush(self, store: MetadataStore, container_id: int, commit: Commit | None = None) -> int:
        """Add the counts since the last flush to ``store``'s usage records of
        ``container_id`` in one conditional commit (re-read and retried when another
        process's flush came between), made with ``commit`` (an owner's fenced
        ``Ownership.commit``; default: ``store.commit``). Returns the requests added. On an
        error (``Fenced`` included) nothing is written, the counts stay unflushed and the
        error propagates (the next flush adds them)."""
        with self._flush_lock:
            totals = self.usage()
            pending = self._pending(totals)
            if not pending:
                return 0
            _add_usage(store, container_id, pending, commit if commit is not None else store.commit)
            self._flushed = totals
        return sum(record.request_count for record in pending.values())

    def drop_unflushed(self) -> int:
        """Forget the counts since the last flush, as if flushed (a fenced owner's, which
        may not be written); returns the requests dropped."""
        with self._flush_lock:
            totals = self.usage()
            dropped = self._pending(totals)
            self._flushed = totals
        return sum(record.request_count for record in dropped.values())

    def _pending(self, totals: Mapping[TrafficClass, UsageRecord]) -> dict[TrafficClass, UsageRecord]:
        """What ``totals`` holds beyond the last flush, by class (flush lock held)."""
        return {
            kind: added
            for kind, total in totals.items()
            if (added := total.minus(self._flushed[kind])) != EMPTY_USAGE
        }

    def start(self, flush: Callable[[], object], interval_s: float) -> None:
        """Call ``flush`` every ``interval_s`` seconds in a daemon thread until ``stop``;
        a flush that fails is tried again at the next interval, but one that raises
        ``Fenced`` ends the thread: a newer owner runs the container, and a fenced
        instance never writes again."""
        if not interval_s > 0:
            raise InvalidArgument(f"interval_s must be > 0, got {interval_s!r}")
        assert self._flusher is None, "started twice"

        def run() -> None:
            while not self._stop.wait(interval_s):
                try:
                    flush()
                except Fenced:
                    _log.info("usage flushes stop: a newer epoch owns the container")
                    return
                except Exception:  # noqa: BLE001 - kept unflushed; retried next time
                    continue

        self._flusher = threading.Thread(target=run, name="slts-usage-flush", daemon=True)
        self._flusher.start()

    def stop(self) -> None:
        """Stop the periodic flush (the caller flushes once more). Idempotent."""
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join()


def _add_usage(
    store: MetadataStore, container_id: int, pending: Mapping[TrafficClass, UsageRecord], commit: Commit
) -> None:
    for attempt in range(_FLUSH_ATTEMPTS):
        ops, expect = [], []
        with store.snapshot() as view:
            for kind, record in pending.items():
                key = usage_key(container_id, kind)
                current = view.get(USAGE, key)
                total = record if current is None else UsageRecord.decode(current.value).plus(record)
                ops.append(Put(USAGE, key, total.encode()))
                expect.append(Expect(USAGE, key, 0 if current is None else current.version))
        try:
            commit(ops, expect)
            return
        except VersionConflict:  # another flusher came between (``Fenced`` is not one)
            if attempt == _FLUSH_ATTEMPTS - 1:
                raise


def total_usage(usage: Mapping[TrafficClass, UsageRecord]) -> UsageRecord:
    """All classes together."""
    total = EMPTY_USAGE
    for record in usage.values():
        total = total.plus(record)
    return total


def iter_kinds(usage: Mapping[TrafficClass, UsageRecord]) -> Iterator[str]:
    """The request kinds present, in ``REQUEST_KINDS`` order (unknown ones last, sorted)."""
    present = {kind for record in usage.values() for kind in record.requests}
    yield from (kind for kind in REQUEST_KINDS if kind in present)
    yield from sorted(present - set(REQUEST_KINDS))


__all__ = [
    "CALL_KINDS",
    "EMPTY_USAGE",
    "FLUSH_INTERVAL_S_DEFAULT",
    "LATENCY_BUCKETS_S",
    "CallTimings",
    "UsageMeter",
    "UsageRecord",
    "read_usage",
    "total_usage",
    "usage_key",
]
