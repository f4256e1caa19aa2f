"""A bounded write-through cache in front of any metadata store (PDP-34: records cache well).

``get`` is served from an LRU map of at most ``capacity`` entries (absent keys are cached
too); a miss reads the inner store and fills the cache. ``commit`` goes to the inner store
and, on success, caches what it wrote at the returned sequence (a delete caches "absent",
unless the commit is a bulk delete, below).
``floor``, ``scan``, ``count`` and ``snapshot`` always read the inner store. Change capture
(``enable_change_capture``, ``changes``, ``discard_changes``) is the inner store's;
``replicate`` goes to the inner store and leaves the keys it wrote uncached.

**Uncached tables.** Tables named in ``uncached_tables`` pass through: ``get`` reads the
inner store, and commits do not cache what they write there. For tables that are written
on every change but read by scans and floors (the engine's GC queue and offset index),
so that their keys do not push the records that ``get`` serves out of the LRU.

**Bulk deletes.** A commit that deletes at least ``bulk_deletes_min`` keys of cached
tables (a truncate batch drops up to ``gc_batch_max`` chunk records, as one
``DeleteKeys``; each of its keys counts as a delete) evicts those keys
instead of caching "absent" for each: what a bulk delete removes is rarely read again,
and thousands of "absent" entries would push the live records out of the LRU. Its keys
are kept out of the cache while it is in flight as one set (``_bulk``: no fill, no
caching by another commit's landing), not as one flight each, so the cache's work per
deleted key is two dictionary pops and a set lookup. When it ends, flights still open on
its keys end uncached (the cache cannot tell which of the two the store ordered first).
The commit's puts, and the deletes of a smaller commit, are cached as before.

**Other writers.** Every ``get`` first compares the inner store's latest sequence with
the last one it saw: if a commit that did not go through this cache landed in between
(another process, such as a defrag batch driver, or another store object), every cached
value is dropped. So ``get`` never returns a value older than the newest commit that
finished before it started. Other writers are rare next to an owner's own commits, so
coarse invalidation costs little; the check itself is one read of the latest sequence.
Conditional commits are always checked by the inner store as well, and on
``VersionConflict`` every key named in the commit's ops and expectations is evicted.

Invariants (asserted):

* ``len(_entries) <= capacity``.
* A key with a commit in flight through this cache (``_writing``), inside the span of a
  ``DeleteRange`` in flight (``_ranges``), or deleted by a bulk delete in flight
  (``_bulk``), has no entry and no fill token: until every such commit has finished,
  its reads go to the inner store.
* A miss may fill its key only while its token is still current (``_fills``); starting a
  commit on the key, ``invalidate``, ``clear`` and conflict eviction withdraw the token,
  so a read that raced with a commit never caches a value older than the commit's.
* When the last in-flight commit on a key finishes, the key is cached at the highest
  sequence committed through this cache during the flight, and only if every commit of
  the flight had a known outcome (applied, or refused by a conflict) and no range or
  bulk delete that may have been ordered after it covers the key. A bulk delete caches
  nothing. A ``replicate`` on
  the key counts as a flight member without a known outcome: its versions are not its
  sequence, and a commit racing it may have landed on either side of it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

from slts.errors import InvalidArgument, StorageClosed, VersionConflict
from slts.metadata import _checks
from slts.metadata.store import (
    SCAN_LIMIT_DEFAULT,
    Change,
    CommitOp,
    DeleteKeys,
    DeleteRange,
    Expect,
    MetadataStore,
    Operation,
    Put,
    ReadView,
    Row,
    StoreStatistics,
    Versioned,
)

_Key = tuple[str, bytes]
_Range = tuple[str, bytes, bytes]  # a DeleteRange's table, start, stop

#: Default ``bulk_deletes_min``: below it a commit's deletes are cached as "absent".
BULK_DELETES_MIN_DEFAULT = 64


def _in_range(name: _Key, span: _Range) -> bool:
    table, start, stop = span
    return name[0] == table and start <= name[1] < stop


class _Flight:
    """The commits in flight on one key, and the newest outcome among the finished ones."""

    __slots__ = ("count", "newest", "unknown", "value")

    def __init__(self) -> None:
        self.count = 0
        self.newest = 0  # highest sequence committed on the key during this flight
        self.value: Versioned | None = None  # what that commit left under the key
        self.unknown = False  # a commit of this flight ended with an unknown outcome


class CachedMetadataStore(MetadataStore):
    """``inner`` with a bounded LRU cache of ``get`` results; closing it closes ``inner``."""

    def __init__(
        self,
        inner: MetadataStore,
        capacity: int,
        uncached_tables: frozenset[str] = frozenset(),
        bulk_deletes_min: int = BULK_DELETES_MIN_DEFAULT,
    ) -> None:
        if not isinstance(capacity, int) or capacity < 1:
            raise InvalidArgument("cache capacity must be an int >= 1", capacity=capacity)
        if not isinstance(bulk_deletes_min, int) or bulk_deletes_min < 1:
            raise InvalidArgument("bulk_deletes_min must be an int >= 1", bulk_deletes_min=bulk_deletes_min)
        if not isinstance(uncached_tables, frozenset) or not uncached_tables <= set(inner.tables):
            raise InvalidArgument(
                "uncached_tables must be a frozenset of the store's tables",
                uncached_tables=uncached_tables,
                tables=inner.tables,
            )
        self.tables = inner.tables
        self.capacity = capacity
        self.uncached_tables = uncached_tables
        self.bulk_deletes_min = bulk_deletes_min
        self._inner = inner
        self._lock = threading.Lock()
        self._entries: OrderedDict[_Key, Versioned | None] = OrderedDict()
        self._fills: dict[_Key, object] = {}  # key -> token of the one miss allowed to fill it
        self._writing: dict[_Key, _Flight] = {}
        self._ranges: list[_Range] = []  # DeleteRange spans of commits in flight (cached tables)
        self._bulk: list[frozenset[_Key]] = []  # keys of bulk deletes in flight (see module doc)
        self._hits = 0
        self._misses = 0
        self._closed = False
        self._marker = inner.change_marker  # read before _seen: no commit since it went unseen
        self._seen = inner.last_sequence  # the latest sequence this cache accounted for
        self._own: set[int] = set()  # sequences of commits through this cache after _seen
        self.foreign_invalidations = 0

    @property
    def inner(self) -> MetadataStore:
        """The store behind the cache."""
        return self._inner

    @property
    def cached_entries(self) -> int:
        """How many keys are cached now (never more than ``capacity``)."""
        with self._lock:
            return len(self._entries)

    # -- reads -----------------------------------------------------------------------------

    def get(self, table: str, key: bytes) -> Versioned | None:
        """The cached value, or the inner store's (then cached unless a commit raced it)."""
        _checks.check_table(self.tables, table)
        _checks.check_bound("key", key)
        self._check_open()
        if table in self.uncached_tables:
            return self._inner.get(table, key)
        self._follow()
        name = (table, key)
        token: object | None = None
        with self._lock:
            if name in self._entries:
                self._entries.move_to_end(name)
                self._hits += 1
                return self._entries[name]
            self._misses += 1
            if name not in self._writing and not self._blocked(name):
                token = object()
                self._fills[name] = token
        try:
            value = self._inner.get(table, key)
        except BaseException:
            with self._lock:
                if token is not None and self._fills.get(name) is token:
                    del self._fills[name]
            raise
        with self._lock:
            if token is not None and self._fills.get(name) is token:
                del self._fills[name]
                # A current token means no commit touched the key since the miss, and no
                # other miss filled it (a later miss would have replaced the token).
                assert name not in self._entries and name not in self._writing
                self._insert(name, value)
        return value

    def _follow(self) -> None:
        """Drop every cached value if a commit not made through this cache landed since
        the last look (see module doc). Fill tokens go too, so a read that started
        before such a commit never caches its result. While the inner store's change
        marker stays what it was at the last full look, nothing landed: no sequence read."""
        marker = self._inner.change_marker
        if marker == self._marker:
            return
        latest = self._inner.last_sequence
        with self._lock:
            self._marker = marker  # every commit up to the marker is accounted for below
            if latest <= self._seen:
                return
            ours = sum(1 for sequence in self._own if self._seen < sequence <= latest)
            if ours != latest - self._seen:
                self._entries.clear()
                self._fills.clear()
                self.foreign_invalidations += 1
            self._own = {sequence for sequence in self._own if sequence > latest}
            self._seen = latest

    def snapshot(self) -> contextlib.AbstractContextManager[ReadView]:
        """The inner store's snapshot (never cached)."""
        self._check_open()
        return self._inner.snapshot()

    def floor(self, table: str, key: bytes, lowest: bytes = b"") -> tuple[bytes, Versioned] | None:
        """The inner store's floor (never cached)."""
        self._check_open()
        return self._inner.floor(table, key, lowest)

    def scan(
        self,
        table: str,
        start: bytes = b"",
        stop: bytes | None = None,
        limit: int = SCAN_LIMIT_DEFAULT,
        reverse: bool = False,
    ) -> list[tuple[bytes, Versioned]]:
        """The inner store's scan (never cached)."""
        self._check_open()
        return self._inner.scan(table, start, stop, limit, reverse)

    def count(self, table: str) -> int:
        """The inner store's count (never cached: O(1) there already)."""
        self._check_open()
        return self._inner.count(table)

    @property
    def last_sequence(self) -> int:
        """The inner store's latest sequence."""
        self._check_open()
        return self._inner.last_sequence

    @property
    def change_marker(self) -> object:
        """The inner store's change marker."""
        self._check_open()
        return self._inner.change_marker

    def make_durable(self) -> None:
        """The inner store's ``make_durable``."""
        self._check_open()
        self._inner.make_durable()

    # -- commits ---------------------------------------------------------------------------

    def commit(self, ops: Sequence[CommitOp], expect: Sequence[Expect] = ()) -> int:
        """Commit through the inner store, then cache what was written (see module doc)."""
        _checks.check_commit(self.tables, ops, expect)
        self._check_open()
        written: dict[_Key, bytes | None] = {}  # the last op per key wins; None: deleted
        ranges: list[_Range] = []  # of cached tables
        for op in ops:
            if op.table in self.uncached_tables:
                continue
            if isinstance(op, DeleteRange):
                ranges.append((op.table, op.start, op.stop))
                for name in written:  # what the commit wrote before the range, it removes
                    if _in_range(name, ranges[-1]):
                        written[name] = None
            elif isinstance(op, DeleteKeys):
                table = op.table
                written.update(dict.fromkeys([(table, key) for key in op.keys]))
            else:
                written[(op.table, op.key)] = op.value if isinstance(op, Put) else None
        bulk: frozenset[_Key] = frozenset()
        if len(written) >= self.bulk_deletes_min:
            bulk = frozenset(name for name, value in written.items() if value is None)
            if len(bulk) >= self.bulk_deletes_min:
                written = {name: value for name, value in written.items() if value is not None}
            else:
                bulk = frozenset()
        with self._lock:
            for name in written:
                self._entries.pop(name, None)
                self._fills.pop(name, None)
                self._writing.setdefault(name, _Flight()).count += 1
            if bulk:
                self._bulk.append(bulk)
                for name in bulk:
                    self._entries.pop(name, None)
                    self._fills.pop(name, None)
            for span in ranges:
                self._ranges.append(span)
                self._forget_range(span)
        outcome_known = False
        sequence = 0
        try:
            sequence = self._inner.commit(ops, expect)
            outcome_known = True
            with self._lock:
                if sequence > self._seen:
                    self._own.add(sequence)
        except VersionConflict:
            outcome_known = True
            with self._lock:
                for name in [*written, *((c.table, c.key) for c in expect)]:
                    self._entries.pop(name, None)
                    self._fills.pop(name, None)
            raise
        finally:
            with self._lock:
                if bulk:
                    self._land_bulk(bulk, sequence, outcome_known)
                self._land(written, sequence, outcome_known)
                for span in ranges:
                    self._land_range(span, sequence, outcome_known)
        return sequence

    def replicate(
        self, sequence: int, ops: Sequence[Operation], versions: Sequence[int] | None = None
    ) -> None:
        """The inner store's ``replicate``; the keys it writes are not cached (they are read
        from the inner store until a later commit through the cache caches them)."""
        _checks.check_replicate(self.tables, sequence, ops, versions)
        self._check_open()
        self._write_uncached(
            [(op.table, op.key) for op in ops], lambda: self._inner.replicate(sequence, ops, versions)
        )

    def replicate_rows(self, sequence: int, rows: Mapping[str, Sequence[Row]]) -> None:
        """The inner store's ``replicate_rows``; the keys it writes are not cached (as
        ``replicate``'s)."""
        _, checked = _checks.check_replicate_rows(self.tables, sequence, rows)
        self._check_open()
        self._write_uncached(
            [(table, key) for table, table_rows in checked for key, _, _ in table_rows],
            lambda: self._inner.replicate_rows(sequence, rows),
        )

    def _write_uncached(self, keys: Sequence[_Key], write: Callable[[], None]) -> None:
        """Run ``write`` (a replication into the inner store) with ``keys`` dropped from the
        cache and in flight; they land as "outcome unknown", so they stay uncached."""
        written: dict[_Key, bytes | None] = dict.fromkeys(keys)
        with self._lock:
            for name in written:
                self._entries.pop(name, None)
                self._fills.pop(name, None)
                self._writing.setdefault(name, _Flight()).count += 1
        try:
            write()
        finally:
            with self._lock:
                self._land(written, 0, known=False)

    # -- change capture: the inner store's -------------------------------------------------

    def enable_change_capture(self) -> None:
        """The inner store's ``enable_change_capture``."""
        self._check_open()
        self._inner.enable_change_capture()

    @property
    def change_capture_enabled(self) -> bool:
        """The inner store's ``change_capture_enabled``."""
        self._check_open()
        return self._inner.change_capture_enabled

    def changes(self, after: int, limit: int = SCAN_LIMIT_DEFAULT) -> list[Change]:
        """The inner store's ``changes``."""
        self._check_open()
        return self._inner.changes(after, limit)

    def encoded_changes(self, after: int, limit: int = SCAN_LIMIT_DEFAULT) -> list[tuple[int, bytes]]:
        """The inner store's ``encoded_changes``."""
        self._check_open()
        return self._inner.encoded_changes(after, limit)

    def discard_changes(self, through: int, expect: Sequence[Expect] = ()) -> int:
        """The inner store's ``discard_changes``."""
        self._check_open()
        return self._inner.discard_changes(through, expect)

    def _land(self, written: dict[_Key, bytes | None], sequence: int, known: bool) -> None:
        """One commit on ``written`` finished (``sequence`` 0: not applied). Lock held."""
        for name, value in written.items():
            flight = self._writing[name]
            flight.count -= 1
            flight.unknown |= not known
            if sequence > flight.newest:
                flight.newest = sequence
                flight.value = None if value is None else Versioned(sequence, value)
            if flight.count == 0:
                del self._writing[name]
                assert name not in self._entries and name not in self._fills
                if flight.newest and not flight.unknown and not self._blocked(name):
                    self._insert(name, flight.value)

    def _blocked(self, name: _Key) -> bool:
        """Is ``name`` inside a ``DeleteRange`` in flight, or deleted by a bulk delete in
        flight? Lock held."""
        return any(name in keys for keys in self._bulk) or any(_in_range(name, span) for span in self._ranges)

    def _land_bulk(self, bulk: frozenset[_Key], sequence: int, known: bool) -> None:
        """A bulk delete of ``bulk`` finished (``sequence`` 0: not applied, or the outcome
        is unknown if not ``known``). While it was in flight no key of it was filled or
        cached (see ``get``, ``_land``), so none has an entry; unless it was surely not
        applied, flights still open on its keys end uncached (whichever of them the store
        ordered first, the cache cannot tell). Lock held."""
        self._bulk.remove(bulk)
        if known and not sequence:
            return
        if len(self._writing) < len(bulk):  # the smaller side: usually no flight is open
            open_flights = [flight for name, flight in self._writing.items() if name in bulk]
        else:
            open_flights = [flight for name in bulk if (flight := self._writing.get(name)) is not None]
        for flight in open_flights:
            flight.unknown = True

    def _forget_range(self, span: _Range) -> None:
        """Drop the cached values and fill tokens of every key in ``span`` (a walk over
        the cache: O(capacity), paid by commits with a ``DeleteRange`` on a cached table
        only; the engine's ranges are on uncached tables). Lock held."""
        for name in [name for name in self._entries if _in_range(name, span)]:
            del self._entries[name]
        for name in [name for name in self._fills if _in_range(name, span)]:
            del self._fills[name]

    def _land_range(self, span: _Range, sequence: int, known: bool) -> None:
        """A commit with the ``DeleteRange`` ``span`` finished (``sequence`` 0: not
        applied, or the outcome is unknown if not ``known``). While it was in flight no
        key of the span was filled (see ``get``); now, unless it was surely not applied,
        a value cached meanwhile by a commit ordered before it in the store goes, and
        flights still open on keys of the span end uncached (whichever of them the store
        ordered first, the cache cannot tell). Lock held."""
        self._ranges.remove(span)
        if known and not sequence:
            return
        for name in [
            name
            for name, value in self._entries.items()
            if _in_range(name, span) and value is not None and (not known or value.version < sequence)
        ]:
            del self._entries[name]
        for name, flight in self._writing.items():
            if _in_range(name, span):
                flight.unknown = True

    # -- cache management ------------------------------------------------------------------

    def invalidate(self, table: str, key: bytes) -> None:
        """Forget the cached value of one key (the next ``get`` reads the inner store)."""
        with self._lock:
            self._entries.pop((table, key), None)
            self._fills.pop((table, key), None)

    def clear(self) -> None:
        """Forget every cached value."""
        with self._lock:
            self._entries.clear()
            self._fills.clear()

    def _insert(self, name: _Key, value: Versioned | None) -> None:
        """Cache ``value`` as the most recently used entry, evicting beyond capacity. Lock held."""
        self._entries[name] = value
        self._entries.move_to_end(name)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        assert len(self._entries) <= self.capacity

    # -- life cycle ------------------------------------------------------------------------

    def statistics(self) -> StoreStatistics:
        """The inner store's counters, with this cache's hits and misses."""
        inner = self._inner.statistics()
        with self._lock:
            return dataclasses.replace(inner, cache_hits=self._hits, cache_misses=self._misses)

    def close(self) -> None:
        """Drop the cache and close the inner store. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._entries.clear()
            self._fills.clear()
        self._inner.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StorageClosed("metadata store is closed")
