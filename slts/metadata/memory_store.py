"""The reference metadata store: sorted dictionaries in memory, one lock.

Invariants (asserted where they are established):

* ``_sequence`` is the version of the newest value anywhere; it only grows.
* A table dictionary that an open snapshot references (``_pins``) is never mutated:
  a commit that would write to it writes to a copy instead (copy-on-write), so a
  snapshot sees one committed state without holding the lock and never blocks a commit.
* ``floor`` bisects the sorted keys (O(log n)); ``count`` is a dictionary's size (O(1));
  nothing scans a table linearly.
* With capture on, ``_changes`` holds one ``Change`` per commit, added under the lock in
  the same step that applies the commit; its keys (sequences) ascend and never exceed
  ``_sequence``.

Not durable: ``close`` forgets everything. Used by tests, simulations and as the model
the other stores are checked against.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import TypeAlias

from sortedcontainers import SortedDict

from slts.errors import InvalidArgument, StorageClosed
from slts.metadata import _checks
from slts.metadata.store import (
    SCAN_LIMIT_DEFAULT,
    SEQUENCE_MAX,
    Change,
    CommitOp,
    Delete,
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

_Table: TypeAlias = SortedDict  # bytes -> Versioned


def floor_entry(table: _Table, key: bytes, lowest: bytes) -> tuple[bytes, Versioned] | None:
    """The entry with the greatest key in ``[lowest, key]`` of a sorted table, by bisection."""
    index = table.bisect_right(key) - 1
    if index < 0:
        return None
    found_key, found = table.peekitem(index)
    assert found_key <= key
    if found_key < lowest:
        return None
    return found_key, found


def scan_entries(
    table: _Table, start: bytes, stop: bytes | None, limit: int, reverse: bool
) -> list[tuple[bytes, Versioned]]:
    """Up to ``limit`` entries of a sorted table with ``start <= key < stop``."""
    if stop is not None and stop <= start:
        return []
    keys = table.irange(start, stop, inclusive=(True, False), reverse=reverse)
    return [(key, table[key]) for key in itertools.islice(keys, limit)]


class _MemoryView(ReadView):
    """A read view over table dictionaries that no commit mutates while the view is open."""

    def __init__(self, tables: dict[str, _Table], sequence: int) -> None:
        self._tables = tables
        self._sequence = sequence
        self._open = True

    @property
    def sequence(self) -> int:
        if not self._open:
            raise StorageClosed("snapshot used outside its with block")
        return self._sequence

    def _table(self, table: str) -> _Table:
        if not self._open:
            raise StorageClosed("snapshot used outside its with block")
        return self._tables[_checks.check_table(self._tables, table)]

    def get(self, table: str, key: bytes) -> Versioned | None:
        data = self._table(table)
        return data.get(_checks.check_bound("key", key))

    def floor(self, table: str, key: bytes, lowest: bytes = b"") -> tuple[bytes, Versioned] | None:
        data = self._table(table)
        return floor_entry(data, _checks.check_bound("key", key), _checks.check_bound("lowest", lowest))

    def scan(
        self,
        table: str,
        start: bytes = b"",
        stop: bytes | None = None,
        limit: int = SCAN_LIMIT_DEFAULT,
        reverse: bool = False,
    ) -> list[tuple[bytes, Versioned]]:
        data = self._table(table)
        _checks.check_scan(start, stop, limit)
        return scan_entries(data, start, stop, limit, reverse)

    def count(self, table: str) -> int:
        return len(self._table(table))

    def close(self) -> None:
        self._open = False


class MemoryMetadataStore(MetadataStore):
    """In-memory ``MetadataStore`` with the exact semantics of the durable ones (not durable)."""

    def __init__(self, tables: Sequence[str]) -> None:
        self.tables = _checks.check_tables(tables)
        self._lock = threading.Lock()
        self._data: dict[str, _Table] = {name: SortedDict() for name in self.tables}
        self._pins: dict[int, int] = {}  # id(table dictionary) -> open snapshots using it
        self._in_snapshot = threading.local()  # .depth: this thread's open snapshot blocks
        self._sequence = 0
        self._capture = False
        self._changes: SortedDict = SortedDict()  # sequence -> Change
        self._closed = False
        self._commits = 0
        self._conflicts = 0
        self._reads = 0

    # -- reads -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[ReadView]:
        """A consistent read view; commits made while it is open copy what they change."""
        with self._lock:
            self._check_open()
            tables = dict(self._data)
            for data in tables.values():
                self._pins[id(data)] = self._pins.get(id(data), 0) + 1
            self._reads += 1
            sequence = self._sequence
        view = _MemoryView(tables, sequence)
        depth = getattr(self._in_snapshot, "depth", 0)
        self._in_snapshot.depth = depth + 1
        try:
            yield view
        finally:
            self._in_snapshot.depth = depth
            view.close()
            with self._lock:
                for data in tables.values():
                    remaining = self._pins[id(data)] - 1
                    assert remaining >= 0
                    if remaining:
                        self._pins[id(data)] = remaining
                    else:
                        del self._pins[id(data)]

    def get(self, table: str, key: bytes) -> Versioned | None:
        """The value under ``key``, read under the lock (no snapshot needed)."""
        _checks.check_table(self.tables, table)
        _checks.check_bound("key", key)
        with self._lock:
            self._check_open()
            self._reads += 1
            return self._data[table].get(key)

    def floor(self, table: str, key: bytes, lowest: bytes = b"") -> tuple[bytes, Versioned] | None:
        """``ReadView.floor`` under the lock, O(log n)."""
        _checks.check_table(self.tables, table)
        _checks.check_bound("key", key)
        _checks.check_bound("lowest", lowest)
        with self._lock:
            self._check_open()
            self._reads += 1
            return floor_entry(self._data[table], key, lowest)

    def scan(
        self,
        table: str,
        start: bytes = b"",
        stop: bytes | None = None,
        limit: int = SCAN_LIMIT_DEFAULT,
        reverse: bool = False,
    ) -> list[tuple[bytes, Versioned]]:
        """``ReadView.scan`` under the lock."""
        _checks.check_table(self.tables, table)
        _checks.check_scan(start, stop, limit)
        with self._lock:
            self._check_open()
            self._reads += 1
            return scan_entries(self._data[table], start, stop, limit, reverse)

    def count(self, table: str) -> int:
        """The table dictionary's size, read under the lock (O(1))."""
        _checks.check_table(self.tables, table)
        with self._lock:
            self._check_open()
            self._reads += 1
            return len(self._data[table])

    # -- commits ---------------------------------------------------------------------------

    def _check_expectations(self, expect: Sequence[Expect]) -> None:
        """``VersionConflict`` (counted) at the first expectation that does not hold now
        (lock held)."""
        for condition in expect:
            current = self._data[condition.table].get(condition.key)
            actual = current.version if current is not None else 0
            if actual != condition.version:
                self._conflicts += 1
                raise _checks.conflict(condition, actual)

    def commit(self, ops: Sequence[CommitOp], expect: Sequence[Expect] = ()) -> int:
        """Check every expectation, then apply every operation under one new sequence."""
        _checks.check_commit(self.tables, ops, expect)
        self._check_not_in_snapshot("commit")
        with self._lock:
            self._check_open()
            self._check_expectations(expect)
            sequence = self._sequence + 1
            applied: list[Operation] = []  # what a capture records: a range as its keys
            for op in ops:
                data = self._writable(op.table)
                if isinstance(op, Put):
                    data[op.key] = Versioned(sequence, op.value)
                    applied.append(op)
                elif isinstance(op, Delete):
                    data.pop(op.key, None)
                    applied.append(op)
                elif isinstance(op, DeleteKeys):
                    for key in op.keys:
                        data.pop(key, None)
                    applied.extend(Delete(op.table, key) for key in op.keys)
                else:
                    assert isinstance(op, DeleteRange)
                    keys = list(data.irange(op.start, op.stop, inclusive=(True, False)))
                    for key in keys:
                        del data[key]
                    applied.extend(Delete(op.table, key) for key in keys)
            assert sequence > self._sequence
            self._sequence = sequence
            if self._capture:
                assert not self._changes or self._changes.peekitem(-1)[0] < sequence
                self._changes[sequence] = Change(sequence, tuple(applied))
            self._commits += 1
            return sequence

    def replicate(
        self, sequence: int, ops: Sequence[Operation], versions: Sequence[int] | None = None
    ) -> None:
        """Apply ``ops`` at ``sequence`` with the given versions (see ``MetadataStore``)."""
        resolved = _checks.check_replicate(self.tables, sequence, ops, versions)
        self._check_not_in_snapshot("replicate")
        with self._lock:
            self._check_open()
            _checks.check_replicate_order(sequence, self._sequence)
            for op, version in zip(ops, resolved, strict=True):
                data = self._writable(op.table)
                if isinstance(op, Put):
                    assert 1 <= version <= sequence
                    data[op.key] = Versioned(version, op.value)
                else:
                    assert isinstance(op, Delete)
                    data.pop(op.key, None)
            assert sequence >= self._sequence
            self._sequence = sequence

    def replicate_rows(self, sequence: int, rows: Mapping[str, Sequence[Row]]) -> None:
        """Apply ``rows`` at ``sequence`` (see ``MetadataStore``)."""
        checked_sequence, checked = _checks.check_replicate_rows(self.tables, sequence, rows)
        self._check_not_in_snapshot("replicate_rows")
        with self._lock:
            self._check_open()
            _checks.check_replicate_order(checked_sequence, self._sequence)
            for table, table_rows in checked:
                data = self._writable(table)
                for key, version, value in table_rows:
                    if value is None:
                        data.pop(key, None)
                    else:
                        data[key] = Versioned(version, value)
            self._sequence = checked_sequence

    # -- change capture --------------------------------------------------------------------

    def enable_change_capture(self) -> None:
        """Capture every later commit in memory (forgotten on ``close`` like the data)."""
        self._check_not_in_snapshot("enable_change_capture")
        with self._lock:
            self._check_open()
            self._capture = True

    @property
    def change_capture_enabled(self) -> bool:
        """Whether commits are captured."""
        with self._lock:
            self._check_open()
            return self._capture

    def changes(self, after: int, limit: int = SCAN_LIMIT_DEFAULT) -> list[Change]:
        """Captured changes with ``sequence > after``, ascending, at most ``limit``."""
        _checks.check_sequence_bound("after", after)
        _checks.check_limit(limit, "changes")
        with self._lock:
            self._check_open()
            if after >= SEQUENCE_MAX:
                return []
            sequences = self._changes.irange(minimum=after, inclusive=(False, True))
            return [self._changes[sequence] for sequence in itertools.islice(sequences, limit)]

    def discard_changes(self, through: int, expect: Sequence[Expect] = ()) -> int:
        """Drop captured changes with ``sequence <= through`` if every ``expect`` holds
        (``VersionConflict`` otherwise, nothing dropped); how many were dropped."""
        _checks.check_sequence_bound("through", through)
        _checks.check_commit(self.tables, (), expect)
        self._check_not_in_snapshot("discard_changes")
        with self._lock:
            self._check_open()
            self._check_expectations(expect)
            removed = 0
            while self._changes and self._changes.peekitem(0)[0] <= through:
                self._changes.popitem(0)
                removed += 1
            assert not self._changes or self._changes.peekitem(0)[0] > through
            return removed

    def _writable(self, table: str) -> _Table:
        """The dictionary of ``table``, copied first if an open snapshot still reads it."""
        data = self._data[table]
        if id(data) in self._pins:
            data = data.copy()
            self._data[table] = data
        assert id(data) not in self._pins
        return data

    # -- life cycle ------------------------------------------------------------------------

    @property
    def last_sequence(self) -> int:
        """The sequence of the latest commit (0 before the first)."""
        self._check_open()
        return self._sequence

    def statistics(self) -> StoreStatistics:
        """Commits, conflicts and reads since the store was created."""
        with self._lock:
            return StoreStatistics(commits=self._commits, conflicts=self._conflicts, reads=self._reads)

    def close(self) -> None:
        """Mark the store closed (idempotent); its contents are dropped."""
        with self._lock:
            self._closed = True
            self._data = {name: SortedDict() for name in self.tables}
            self._changes = SortedDict()

    def _check_open(self) -> None:
        if self._closed:
            raise StorageClosed("metadata store is closed")

    def _check_not_in_snapshot(self, call: str) -> None:
        if getattr(self._in_snapshot, "depth", 0):
            raise InvalidArgument(f"{call} inside an open snapshot() block of the same thread")
