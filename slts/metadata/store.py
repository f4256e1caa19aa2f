"""The metadata store contract: ordered tables of versioned records, conditional commits.

A store holds a fixed set of named tables; each maps ``bytes`` keys (ordered bytewise)
to ``bytes`` values. Every value carries a *version*: the store-wide sequence number of
the commit that last wrote it. Sequence numbers start at 1 and grow by one per commit,
so a version is never reused, even after a key is deleted and written again (no ABA).

**Commits are atomic and conditional.** ``commit(ops, expect)`` checks every
expectation (``version == 0`` means "the key must be absent") and, only if all hold,
applies every operation, all under one new sequence number, and makes it durable
before returning (when the store is durable). If any expectation fails it raises
``VersionConflict`` and applies nothing. This is the only way to change a store.

**Keys** are 1 to ``KEY_BYTES_MAX`` bytes (LMDB's limit, enforced by every store so
that the memory store accepts nothing LMDB would refuse); values are any ``bytes``.
Read bounds (``floor``'s key, ``scan``'s start and stop) may be any ``bytes``, and so
may a ``DeleteRange``'s bounds: the one operation that removes every key of a range
(the offset index keys of a truncated head, in one cursor walk).

**Reads** are consistent per call; ``snapshot()`` gives a read view in which several
reads see one committed state. Keep snapshots short (an LMDB read transaction pins
pages and grows the file while it is open, and growing the map waits for open
snapshots), and never call ``commit`` inside a ``snapshot()`` block on the same thread
(it raises ``InvalidArgument``): read, leave the block, then commit with expectations.
``count(table)`` is a table's number of entries in O(1), whatever its size (gauges read
at every metrics scrape: no entry of the table is read).

**Change capture** (``enable_change_capture``, ``changes``, ``discard_changes``): once
enabled, every commit also records ``Change(sequence, ops)`` in the store's change log, in
the same atomic (and, for durable stores, durable) step as the commit itself, whoever made
it (every store object, and for LMDB every process on the folder). The engine ships this
log to tier-2 as the metadata log; ``discard_changes`` trims what has been shipped.
``replicate`` applies changes with given sequence and versions (restore into a fresh store);
it is not captured. ``ReadView.sequence`` tells which commit a snapshot reflects.

Implementations: ``MemoryMetadataStore`` (the reference, for tests and simulation),
``LmdbMetadataStore`` (the default, durable), and ``CachedMetadataStore`` (a bounded
write-through cache in front of either). One test suite (``tests/metadata``) runs all.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import msgpack

#: Default bound on how many entries one ``scan`` returns; callers page with ``start``.
SCAN_LIMIT_DEFAULT = 1000

#: The longest key any store accepts (LMDB's compile-time maximum key size).
KEY_BYTES_MAX = 511

#: The greatest sequence number a store can hold (LMDB stores it as 8 bytes big-endian).
SEQUENCE_MAX = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class Versioned:
    """A stored value with the sequence number of the commit that wrote it (>= 1)."""

    version: int
    value: bytes


@dataclass(frozen=True, slots=True)
class Put:
    """Write ``value`` under ``key`` in ``table`` (insert or replace)."""

    table: str
    key: bytes
    value: bytes


@dataclass(frozen=True, slots=True)
class Delete:
    """Remove ``key`` from ``table``; deleting an absent key is allowed and does nothing."""

    table: str
    key: bytes


@dataclass(frozen=True, slots=True)
class DeleteRange:
    """Remove every key ``k`` of ``table`` with ``start <= k < stop`` (``start < stop``;
    bounds are any ``bytes``, as ``scan``'s). A range that holds no key does nothing.

    One operation, however many keys it removes: the store walks the range with a cursor
    in the commit's own transaction (LMDB) or slices its sorted keys (memory). The caller
    bounds how many keys a range holds (``Expect`` cannot name keys it does not know, so
    a range is for keys the caller has just read in a snapshot whose state the commit's
    expectations pin). Captured as the per-key ``Delete`` of each key it removed, in its
    place among the commit's operations (see ``Change``)."""

    table: str
    start: bytes
    stop: bytes


@dataclass(frozen=True, slots=True)
class DeleteKeys:
    """Remove each of ``keys`` from ``table`` (a tuple of keys, each valid as a
    ``Delete``'s; absent keys do nothing; an empty tuple does nothing).

    ``Delete`` for a batch of keys known by name (the chunk records of a truncated head):
    one operation object instead of one per key, checked and applied in one loop. It
    counts as ``len(keys)`` items towards a commit's bound. Captured as the per-key
    ``Delete`` of each of its keys, in its place and order (see ``Change``), whether the
    key was present or not, as a ``Delete`` is."""

    table: str
    keys: tuple[bytes, ...]


#: What a ``Change`` holds, and what ``replicate`` applies: operations on one key each.
Operation = Put | Delete

#: What ``commit`` applies: ``Operation``, a ``DeleteRange`` or a ``DeleteKeys``.
CommitOp = Put | Delete | DeleteRange | DeleteKeys

#: A row of ``replicate_rows``: (key, version, value), value None for a delete.
Row = tuple[bytes, int, bytes | None]


@dataclass(frozen=True, slots=True)
class Change:
    """One captured commit: its sequence and its operations, in commit order. A
    ``DeleteRange`` of the commit is captured as one ``Delete`` per key it removed, and a
    ``DeleteKeys`` as one ``Delete`` per key it names, in its place: replaying the change
    (``replicate``) on the state before the commit gives exactly the state after it, and
    readers of the log see only per-key operations."""

    sequence: int
    ops: tuple[Operation, ...]


def encode_operations(ops: Sequence[Operation]) -> bytes:
    """The msgpack array ``[[table, key, value or nil], ...]`` of a captured change's
    per-key operations (``Put`` and ``Delete``; ``Change`` holds no others), as a
    store's change log keeps them and the metadata log ships them."""
    assert all(isinstance(op, (Put, Delete)) for op in ops), ops
    return msgpack.packb(
        [[op.table, op.key, op.value if isinstance(op, Put) else None] for op in ops], use_bin_type=True
    )


@dataclass(frozen=True, slots=True)
class Expect:
    """Commit only if ``key`` in ``table`` is at ``version`` (0: the key must be absent)."""

    table: str
    key: bytes
    version: int


@dataclass(frozen=True, slots=True)
class StoreStatistics:
    """Counters a store exposes (``statistics()``); all monotonically increasing."""

    commits: int
    conflicts: int
    reads: int
    cache_hits: int = 0
    cache_misses: int = 0
    group_commits: int = 0


class ReadView(abc.ABC):
    """A consistent read-only view of the store (one committed state)."""

    @property
    @abc.abstractmethod
    def sequence(self) -> int:
        """The sequence of the last commit (or ``replicate``) this view sees; 0 for an empty
        store. Fixed for the life of the view, whatever is committed meanwhile."""

    @abc.abstractmethod
    def get(self, table: str, key: bytes) -> Versioned | None:
        """The value under ``key``, or None."""

    @abc.abstractmethod
    def floor(self, table: str, key: bytes, lowest: bytes = b"") -> tuple[bytes, Versioned] | None:
        """The entry with the greatest key ``k`` such that ``lowest <= k <= key``, or None.

        O(log n). This is how an offset is mapped to the chunk that holds it.
        """

    @abc.abstractmethod
    def scan(
        self,
        table: str,
        start: bytes = b"",
        stop: bytes | None = None,
        limit: int = SCAN_LIMIT_DEFAULT,
        reverse: bool = False,
    ) -> list[tuple[bytes, Versioned]]:
        """Up to ``limit`` entries with ``start <= key < stop`` (stop None: no upper bound),
        ascending, or descending with ``reverse``. Page by passing the last key + b"\\x00"
        as the next ``start`` (or the last key as the next ``stop`` when reversing).
        ``limit`` must be >= 1 (``InvalidArgument`` otherwise)."""

    def scan_values(
        self, table: str, start: bytes = b"", stop: bytes | None = None, limit: int = SCAN_LIMIT_DEFAULT
    ) -> list[tuple[bytes, bytes]]:
        """``scan`` (ascending) without the versions: up to ``limit`` (key, value) pairs with
        ``start <= key < stop``. For walks over many entries that need no version (the
        offset index), where a store can skip making a ``Versioned`` per entry; the same
        checks and errors as ``scan``. This default takes them from ``scan``."""
        return [(key, stored.value) for key, stored in self.scan(table, start, stop, limit)]

    @abc.abstractmethod
    def count(self, table: str) -> int:
        """How many entries ``table`` holds in this view's state (>= 0), in time that does
        not grow with the table (LMDB: the sub-database's own entry count; the memory
        store: its dictionary's size). Only the table's own keys: never the change log or
        a store's bookkeeping. ``InvalidArgument`` for an unknown table."""


class MetadataStore(abc.ABC):
    """Abstract metadata store. Thread-safe: any method may be called from many threads."""

    #: The tables this store was opened with.
    tables: tuple[str, ...]

    @abc.abstractmethod
    def snapshot(self) -> contextlib.AbstractContextManager[ReadView]:
        """A consistent read view, valid inside the ``with`` block only."""

    @abc.abstractmethod
    def commit(self, ops: Sequence[CommitOp], expect: Sequence[Expect] = ()) -> int:
        """Apply ``ops`` atomically if every ``expect`` holds; return the commit's sequence.

        Operations apply in order (a ``Put`` after a ``DeleteRange`` that covers its key
        stays; one before it is removed).

        Raises ``VersionConflict`` (nothing applied) if an expectation fails,
        ``InvalidArgument`` for an unknown table, a non-bytes key/value, a key of 0 or
        more than ``KEY_BYTES_MAX`` bytes, a ``DeleteRange`` whose bounds are not bytes
        or whose ``start`` is not below its ``stop``, a ``DeleteKeys`` whose keys are not
        a tuple, more than 100,000 operations and expectations (a ``DeleteKeys`` counts
        its keys),
        or a call inside this thread's open
        ``snapshot()`` block, ``StorageClosed`` after ``close``. Durable on return for
        durable stores.
        """

    @property
    @abc.abstractmethod
    def last_sequence(self) -> int:
        """The sequence number of the latest commit (0 for an empty store)."""

    @property
    def change_marker(self) -> object:
        """A value that differs after any commit (or ``replicate``) by anyone, and is
        cheaper to read than ``last_sequence`` where the store can offer that (LMDB: the
        meta page's transaction id, no read transaction). Equal markers read at two times
        mean no commit landed between them; different ones mean one may have. Default:
        ``last_sequence``."""
        return self.last_sequence

    def make_durable(self) -> None:
        """On return every commit applied so far, by any store object or process on this
        store, survives a power loss.

        A commit is durable when ``commit`` returns; a commit that another thread's
        ``commit`` has applied but not returned yet may already be visible to reads (a
        durable store shares one sync among the commits of several callers). Whoever
        copies what it reads beyond the process (the metadata's durable copy on tier-2)
        calls this first. A no-op for stores that are not durable or that sync every
        commit before it becomes visible (the default). ``StorageClosed`` after ``close``;
        ``MetadataError`` if the sync fails.
        """
        return  # the default: nothing applied is ever left un-synced

    # -- change capture and replication ----------------------------------------------------
    # Concrete (raising NotImplementedError) rather than abstract so that delegating test
    # doubles written before change capture existed still instantiate; every store of this
    # package implements them.

    def enable_change_capture(self) -> None:
        """Capture every commit from now on, in this store's change log. Idempotent.

        From the moment this returns, every commit (through any store object and, for a
        persistent store, any process on it, including ones that never called this) also
        records ``Change(sequence, ops)`` in the same transaction as the commit: a commit
        is captured if and only if it is applied. Commits that finished before this call
        returned may or may not be captured. Persistent stores remember the setting (it
        survives reopening). Failed commits capture nothing; ``replicate`` and
        ``discard_changes`` are not captured. ``InvalidArgument`` on a read-only store
        (unless already enabled) or inside this thread's open ``snapshot()`` block,
        ``StorageClosed`` after ``close``.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support change capture")

    @property
    def change_capture_enabled(self) -> bool:
        """Whether commits are being captured (see ``enable_change_capture``)."""
        raise NotImplementedError(f"{type(self).__name__} does not support change capture")

    def changes(self, after: int, limit: int = SCAN_LIMIT_DEFAULT) -> list[Change]:
        """Up to ``limit`` captured changes with ``sequence > after``, ascending; page by
        passing the last one's sequence as the next ``after``. Sequences are contiguous
        from the first change captured after ``enable_change_capture`` (except around
        ``replicate``, which takes sequences without capturing them) up to what
        ``discard_changes`` removed. ``InvalidArgument`` unless ``after`` is an int >= 0 and
        ``limit`` an int >= 1."""
        raise NotImplementedError(f"{type(self).__name__} does not support change capture")

    def encoded_changes(self, after: int, limit: int = SCAN_LIMIT_DEFAULT) -> list[tuple[int, bytes]]:
        """The captured changes of ``changes(after, limit)`` as ``(sequence, operations)``,
        ``operations`` the msgpack array ``[[table, key, value or nil], ...]`` of the
        change's operations in order (``encode_operations``): what the metadata log ships
        inside its records, with no Python object per operation where the store keeps
        them encoded (LMDB hands back its change log's bytes as stored, unchecked: the
        caller checks them before it trusts them). Errors as ``changes``."""
        return [(change.sequence, encode_operations(change.ops)) for change in self.changes(after, limit)]

    def discard_changes(self, through: int, expect: Sequence[Expect] = ()) -> int:
        """Remove the captured changes with ``sequence <= through``; return how many.

        Maintenance of the change log, not a commit: it takes no sequence number, is not
        captured and changes no table. Safe concurrently with commits (which keep being
        captured). Persistent stores remove a large backlog in bounded transactions, so an
        interrupted call may have removed a prefix of it. ``expect`` is checked as
        ``commit`` checks it, inside each of those transactions: if one fails, that
        transaction removes nothing and ``VersionConflict`` is raised (an owner passes its
        container record's version, so that a fenced instance trims nothing).
        ``InvalidArgument`` unless ``through`` is an int >= 0 and ``expect`` is valid as
        for ``commit``, on a read-only store, or inside this thread's open ``snapshot()``
        block; ``StorageClosed`` after ``close``.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support change capture")

    def replicate(
        self, sequence: int, ops: Sequence[Operation], versions: Sequence[int] | None = None
    ) -> None:
        """Apply ``ops`` as if committed with number ``sequence`` (restore, replication).

        Requires ``1 <= sequence`` and ``sequence >= last_sequence`` (equal is allowed, so
        that a large snapshot can be loaded in several calls at one sequence).
        ``versions``, if given, has one int per op: the version stored with that op's
        ``Put`` (``1 <= version <= sequence``); the entry of a ``Delete`` is ignored (any
        int). Without ``versions`` every ``Put`` gets version ``sequence``. Afterwards
        ``last_sequence == sequence``. Applied atomically, no expectations, not captured
        into the change log. Raises ``InvalidArgument`` (nothing applied) for what
        ``commit`` refuses, for a bad ``sequence`` or ``versions`` (the message says what was
        wrong), on a read-only store or inside this thread's open ``snapshot()`` block;
        ``StorageClosed`` after ``close``.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support replication")

    def replicate_rows(self, sequence: int, rows: Mapping[str, Sequence[Row]]) -> None:
        """``replicate`` for bulk loads (restore): apply ``rows`` at ``sequence``. For each
        table of ``rows``, each row ``(key, version, value)`` is ``Put(table, key, value)``
        stored with ``version``, or, with ``value`` None, ``Delete(table, key)`` (its version
        is any int and ignored). Keys must be distinct within a table, so a store may apply
        the rows in any order (LMDB sorts them, and appends those past a table's last key).

        The same as ``replicate(sequence, ops, versions)`` of those operations: the same
        checks and ``InvalidArgument``s (also for a repeated key, or a row that is not a
        3-item tuple or list), nothing applied on error, atomic, not captured,
        ``last_sequence == sequence`` afterwards. This default builds the operations and
        calls ``replicate``; stores with a faster bulk path override it."""
        from slts.metadata import _checks  # it imports this module

        ops, versions = _checks.rows_as_ops(self.tables, rows)
        self.replicate(sequence, ops, versions)

    @abc.abstractmethod
    def statistics(self) -> StoreStatistics:
        """Counters since this store object was opened."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release resources. Idempotent; further calls raise ``StorageClosed``."""

    # -- conveniences, each one consistent read ------------------------------------------------

    def get(self, table: str, key: bytes) -> Versioned | None:
        """``snapshot().get`` in a read of its own."""
        with self.snapshot() as view:
            return view.get(table, key)

    def floor(self, table: str, key: bytes, lowest: bytes = b"") -> tuple[bytes, Versioned] | None:
        """``snapshot().floor`` in a read of its own."""
        with self.snapshot() as view:
            return view.floor(table, key, lowest)

    def scan(
        self,
        table: str,
        start: bytes = b"",
        stop: bytes | None = None,
        limit: int = SCAN_LIMIT_DEFAULT,
        reverse: bool = False,
    ) -> list[tuple[bytes, Versioned]]:
        """``snapshot().scan`` in a read of its own."""
        with self.snapshot() as view:
            return view.scan(table, start, stop, limit, reverse)

    def count(self, table: str) -> int:
        """``snapshot().count`` in a read of its own: O(1), whatever the table's size (read
        several counts in one ``snapshot()`` to have them from one committed state)."""
        with self.snapshot() as view:
            return view.count(table)

    def iterate(
        self, table: str, start: bytes = b"", stop: bytes | None = None, page: int = SCAN_LIMIT_DEFAULT
    ) -> Iterator[tuple[bytes, Versioned]]:
        """Every entry in ``[start, stop)``, ascending, read page by page (each page is one
        consistent read; the whole iteration is not one snapshot)."""
        while True:
            entries = self.scan(table, start, stop, limit=page)
            yield from entries
            if len(entries) < page:
                return
            start = entries[-1][0] + b"\x00"

    def dump(self) -> dict[str, dict[bytes, Versioned]]:
        """Everything, table by table, in one snapshot (for tests and small stores)."""
        result: dict[str, dict[bytes, Versioned]] = {}
        with self.snapshot() as view:
            for table in self.tables:
                result[table] = dict(scan_all(view, table))
        return result

    def __enter__(self) -> MetadataStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def prefix_stop(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix`` (None: no bound)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def scan_all(
    view: ReadView, table: str, start: bytes = b"", stop: bytes | None = None, page: int = SCAN_LIMIT_DEFAULT
) -> Iterator[tuple[bytes, Versioned]]:
    """Every entry with ``start <= key < stop`` of one consistent ``view``, in key order,
    read ``page`` entries at a time (``scan`` alone stops at its limit)."""
    assert page >= 1, page
    while True:
        entries = view.scan(table, start, stop, limit=page)
        yield from entries
        if len(entries) < page:
            return
        start = entries[-1][0] + b"\x00"
