"""The durable metadata store: one LMDB environment (a folder), one sub-database per table.

Layout (see ``docs/metadata.md``): every table is a named sub-database whose keys are the
table's keys and whose values are ``8-byte big-endian version || payload``. The internal
sub-database ``__slts_internal__`` holds ``sequence`` (the last commit's sequence, 8 bytes
big-endian), ``format`` (``LAYOUT_FORMAT``) and, once change capture is enabled,
``capture``. The change log is the sub-database ``__slts_changes__``: key the commit's
sequence (8 bytes big-endian), value a msgpack list of ``[table, key, value or nil]``.

Invariants:

* The stored sequence only grows, by one per successful commit, inside the write
  transaction that applies that commit; every value written by it carries it as version.
  (``replicate`` sets it to a given sequence >= the stored one, and the versions given.)
* While ``capture`` is set, the write transaction that applies a commit also writes its
  change under its sequence; ``capture`` is read inside that very transaction, so every
  process captures, whichever one enabled it. Change keys only ever grow.
* Within a process there is one ``lmdb.Environment`` per folder (LMDB forbids opening the
  same files twice in a process, py-lmdb refuses it): store objects opened on the same
  folder share it (``_Environment``, reference counted), and share its group committer.
* ``set_mapsize`` (map growth, or adopting another process's growth) runs only while no
  transaction of this process is open (``_Gate`` exclusive); every transaction holds the
  gate shared.
* An environment is used only by the process that opened it: a store object checks the
  process id on every call, and a forked child gets ``MetadataError``, never LMDB access.

Rules from LMDB (py-lmdb docs): one write transaction at a time per environment (the
group committer's leader is the only writer in this process; LMDB serialises processes);
every transaction in a ``with``; read transactions short; never across ``fork()``.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import os
import stat
import struct
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import lmdb
import msgpack

from slts.compiled import twin
from slts.errors import (
    InvalidArgument,
    InvalidConfig,
    MetadataCorrupted,
    MetadataError,
    SltsError,
    StorageClosed,
    StoreNotFound,
    VersionConflict,
)
from slts.metadata import _checks
from slts.metadata.group_commit import GroupCommitter
from slts.metadata.lmdb_file import CHECK_MODES, UNCHECKED, WALKED, record_good_state, vouch
from slts.metadata.lmdb_lock_file import open_marker
from slts.metadata.store import (
    KEY_BYTES_MAX,
    SCAN_LIMIT_DEFAULT,
    SEQUENCE_MAX,
    Change,
    CommitOp,
    Delete,
    DeleteKeys,
    Expect,
    MetadataStore,
    Operation,
    Put,
    ReadView,
    Row,
    StoreStatistics,
    Versioned,
)

_T = TypeVar("_T")

#: Version of the on-disk layout, stored under ``format`` in the internal sub-database.
LAYOUT_FORMAT = b"1"
INTERNAL_DB = b"__slts_internal__"
SEQUENCE_KEY = b"sequence"
FORMAT_KEY = b"format"
#: Present in the internal sub-database once change capture is enabled (by any process).
CAPTURE_KEY = b"capture"
#: The change log: 8-byte big-endian sequence -> msgpack ``[[table, key, value|nil], ...]``.
CHANGES_DB = b"__slts_changes__"
#: The most change-log entries one ``discard_changes`` write transaction removes.
DISCARD_BATCH_MAX = 10_000

MAP_SIZE_BYTES_DEFAULT = 64 << 30
#: Map growth doubles the map, never beyond this.
MAP_SIZE_BYTES_MAX = 1 << 44
#: After a group, the map doubles if more than this fraction of it is in use.
MAP_FILL_RATIO_MAX = 0.75
#: How many times one group may grow the map (or adopt another process's growth).
MAP_RESIZE_ATTEMPTS_MAX = 24
#: Concurrent read transactions per environment, all processes together.
READERS_MAX = 1024

_VERSION = struct.Struct(">Q")
#: The framing of a version 0, which no stored value has (``_unframe`` refuses it).
_NO_VERSION = bytes(_VERSION.size)

_process_id = os.getpid()


def _after_fork_in_child() -> None:
    global _process_id  # noqa: PLW0603 - the fork hook updates the module's pid
    _process_id = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _frame(version: int, value: bytes) -> bytes:
    assert version >= 1
    return _VERSION.pack(version) + value


def _read_sequence(txn: lmdb.Transaction[bytes], internal: lmdb._Database | None) -> int:
    """The stored last sequence as ``txn`` sees it (0 if none)."""
    raw = txn.get(SEQUENCE_KEY, db=internal) if internal is not None else None
    if raw is None:
        return 0
    if len(raw) != _VERSION.size:
        raise MetadataCorrupted("stored sequence is not 8 bytes", length=len(raw))
    return int(_VERSION.unpack(raw)[0])


def _decode_change(raw_key: bytes, raw: bytes) -> Change:
    """A change-log entry, checking its framing."""
    if len(raw_key) != _VERSION.size:
        raise MetadataCorrupted("change-log key is not 8 bytes", key=raw_key)
    (sequence,) = _VERSION.unpack(raw_key)
    try:
        items = msgpack.unpackb(raw, raw=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise MetadataCorrupted("change-log entry is not valid msgpack", sequence=sequence) from exc
    if not isinstance(items, list):
        raise MetadataCorrupted("change-log entry is not a list", sequence=sequence)
    ops: list[Operation] = []
    for item in items:
        if (
            not isinstance(item, list)
            or len(item) != 3
            or not isinstance(item[0], str)
            or not isinstance(item[1], bytes)
            or not (item[2] is None or isinstance(item[2], bytes))
        ):
            raise MetadataCorrupted("malformed operation in change-log entry", sequence=sequence)
        table, key, value = item
        ops.append(Delete(table, key) if value is None else Put(table, key, value))
    return Change(sequence, tuple(ops))


def _unframe(raw: bytes, table: str, key: bytes) -> Versioned:
    """Decode a stored value, checking its framing."""
    if len(raw) < _VERSION.size:
        raise MetadataCorrupted("stored value shorter than its version header", table=table, key=key)
    (version,) = _VERSION.unpack_from(raw)
    if version < 1:
        raise MetadataCorrupted("stored value has version 0", table=table, key=key)
    return Versioned(version, raw[_VERSION.size :])


def _framed_rows(
    tables: Sequence[str], sequence: int, rows: object
) -> list[tuple[str, list[tuple[bytes, bytes]], list[bytes]]] | None:
    """``replicate_rows``' rows checked and framed: (table, puts as (key, stored value)
    sorted by key, deleted keys) for each table (``frame_rows_python``, or its compiled
    twin); None if anything is other than plain, for ``_checks.check_replicate_rows`` to
    raise what is wrong."""
    if not isinstance(rows, Mapping):
        return None
    frame = ROWS_NATIVE.frame_rows if ROWS_NATIVE is not None else frame_rows_python
    framed = []
    total = 0
    for table, table_rows in rows.items():
        if table not in tables or type(table_rows) not in (list, tuple):
            return None
        total += len(table_rows)
        if total > _checks.COMMIT_ITEMS_MAX:
            return None
        rows_list = table_rows if type(table_rows) is list else list(table_rows)
        found = frame(rows_list, sequence, KEY_BYTES_MAX)  # rows often come sorted (a snapshot's)
        if found is None:
            ordered = _checks.sorted_by_key(rows_list)
            found = frame(ordered, sequence, KEY_BYTES_MAX) if ordered is not None else None
            if found is None:
                return None
        framed.append((table, *found))
    return framed


def frame_rows_python(
    rows: list[Row], sequence: int, key_bytes_max: int
) -> tuple[list[tuple[bytes, bytes]], list[bytes]] | None:
    """One table's rows of ``replicate_rows`` checked and framed in one pass: (puts as
    (key, stored value), deleted keys), the stored value being the 8-byte version and
    the value; None as soon as a row is other than plain: not a 3-item tuple or list, a
    key not exactly bytes or empty or longer than ``key_bytes_max`` or not greater than
    the one before (rows sorted by distinct keys), a version not exactly an int or (for a
    put) outside [1, sequence], a
    value neither exactly bytes nor None. As strict as ``_checks.check_replicate_rows``
    (which then says what is wrong), in one loop instead of three; the reference of the
    compiled ``slts.metadata._rows.frame_rows`` (``ROWS_NATIVE``)."""
    pack = _VERSION.pack
    puts: list[tuple[bytes, bytes]] = []
    deletes: list[bytes] = []
    previous = None
    for row in rows:
        if type(row) not in (tuple, list) or len(row) != 3:
            return None
        key, version, value = row
        if type(key) is not bytes or not 0 < len(key) <= key_bytes_max:
            return None
        if (previous is not None and key <= previous) or type(version) is not int:
            return None
        previous = key
        if value is None:
            deletes.append(key)
        elif type(value) is bytes and 0 < version <= sequence:
            puts.append((key, pack(version) + value))
        else:
            return None
    return puts, deletes


#: The compiled ``frame_rows`` (``slts.metadata._rows``), or None: ``frame_rows_python``.
ROWS_NATIVE = twin("slts.metadata._rows")


def _framed(rows: Sequence[Row]) -> tuple[list[tuple[bytes, bytes]], list[bytes]]:
    """(puts, deleted keys) of checked rows sorted by key."""
    puts = [(bytes(key), _frame(version, bytes(value))) for key, version, value in rows if value is not None]
    return puts, [bytes(key) for key, _, value in rows if value is None]


def _load_rows(
    txn: lmdb.Transaction[bytes], db: lmdb._Database, puts: list[tuple[bytes, bytes]], deletes: list[bytes]
) -> None:
    """Apply a table's framed rows (``replicate_rows``; distinct keys, puts sorted):
    deletes one by one, then the puts in two ``putmulti`` calls: those up to the table's
    last key (LMDB finds each one's page), and those past it appended (MDB_APPEND: each
    goes to the end, no search; a restore's rows are mostly past it, the tables start
    empty)."""
    for key in deletes:
        txn.delete(key, db=db)
    if not puts:
        return
    cursor = txn.cursor(db)
    split = bisect.bisect_right(puts, cursor.key(), key=_first) if cursor.last() else 0
    if split:
        cursor.putmulti(puts[:split])
    if split < len(puts):
        _, added = cursor.putmulti(puts[split:] if split else puts, append=True)
        assert added == len(puts) - split, "appended keys are sorted, distinct and past the last one"


def _first(pair: tuple[bytes, bytes]) -> bytes:
    return pair[0]


class _Gate:
    """Readers-writer gate: transactions enter shared, ``set_mapsize`` exclusive.

    Shared entry is re-entrant per thread (nested snapshots never wait for a queued
    exclusive entry, which would deadlock); exclusive entries are preferred over new
    shared ones so that a resize is not starved.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._shared = 0
        self._exclusive = False
        self._exclusive_waiting = 0
        self._local = threading.local()

    def depth(self) -> int:
        """How many shared entries this thread holds."""
        return getattr(self._local, "depth", 0)

    def shared(self) -> _SharedEntry:
        """Hold the gate shared inside a ``with`` block (a plain object, not a generator:
        every read passes here)."""
        return _SharedEntry(self)

    def enter_shared(self) -> int:
        """Take a shared entry; the depth to give back to ``leave_shared``. (The
        condition's lock is taken directly: every read of the store passes here.)"""
        local = self._local
        depth = getattr(local, "depth", 0)
        if depth == 0:
            self._mutex.acquire()
            try:
                while self._exclusive or self._exclusive_waiting:
                    self._cond.wait()
                self._shared += 1
            finally:
                self._mutex.release()
        local.depth = depth + 1
        return depth

    def leave_shared(self, depth: int) -> None:
        """Give back the shared entry that ``enter_shared`` returned ``depth`` for."""
        self._local.depth = depth
        if depth == 0:
            self._mutex.acquire()
            try:
                self._shared -= 1
                assert self._shared >= 0
                if self._shared == 0 and self._exclusive_waiting:
                    self._cond.notify_all()
            finally:
                self._mutex.release()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        assert self.depth() == 0, "exclusive entry while holding the gate shared would deadlock"
        with self._cond:
            self._exclusive_waiting += 1
            while self._exclusive or self._shared:
                self._cond.wait()
            self._exclusive_waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


class _SharedEntry:
    """``with gate.shared():`` (see ``_Gate.shared``)."""

    __slots__ = ("_depth", "_gate")

    def __init__(self, gate: _Gate) -> None:
        self._gate = gate
        self._depth = 0

    def __enter__(self) -> None:
        self._depth = self._gate.enter_shared()

    def __exit__(self, *exc_info: object) -> None:
        self._gate.leave_shared(self._depth)


#: A durable group's outcome: one result per commit, and whether its transaction synced.
_GroupRun = tuple[list[int | BaseException], bool]


@dataclass(frozen=True, slots=True)
class _Pending:
    """One commit waiting for its group."""

    store: LmdbMetadataStore
    ops: Sequence[CommitOp]
    expect: Sequence[Expect]


class _Environment:
    """One open LMDB environment, shared by the store objects of this process on its folder."""

    def __init__(
        self,
        path: str,
        identity: tuple[int, int],
        map_size_bytes: int,
        durable: bool,
        readonly: bool,
        vouched: str = UNCHECKED,
    ) -> None:
        self.path = path
        self.identity = identity
        self.durable = durable
        self.readonly = readonly
        #: What the open's file check found (``lmdb_file.vouch``): whether this process
        #: may record the file's state as known good.
        self.vouched = vouched
        self.pid = _process_id
        self.references = 1
        self.closed = False
        self.gate = _Gate()
        self.write_lock = threading.Lock()  # the one writer of this process; also guards dbi opens
        try:
            self.env = lmdb.Environment(
                path,
                map_size=map_size_bytes,
                subdir=True,
                readonly=readonly,
                create=not readonly,
                sync=durable,
                # The meta page is synced by the next commit's data sync, or by _sync when
                # nobody commits behind it (GroupCommitter's shared syncs; module doc).
                metasync=False,
                max_dbs=_checks.TABLES_MAX + 8,
                max_readers=READERS_MAX,
            )
        except lmdb.Error as exc:
            raise MetadataError(f"cannot open LMDB environment {path!r}: {exc}", path=path) from exc
        self.dbs: dict[str, lmdb._Database | None] = {}
        self.page_bytes = int(self.env.stat()["psize"])
        try:
            with _translated(self):
                self.env.reader_check()  # free reader slots of dead processes (they pin pages)
                self.internal = self._open_db(INTERNAL_DB)
                self.changes = self._open_db(CHANGES_DB)
                self._check_format()
        except BaseException:
            self.env.close()
            raise
        #: A failed sync: the kernel may have dropped dirty pages, so nothing written since
        #: the last good sync can be trusted to be on disk; every later commit fails.
        self.sync_failure: MetadataError | None = None
        self.committer: GroupCommitter[_Pending, int] = GroupCommitter(
            self._run_group, sync=self.sync if durable and not readonly else None
        )
        if durable and not readonly:
            self.sync()  # what an earlier process applied but did not sync is durable from here
        if vouched != UNCHECKED and (not readonly or vouched == WALKED):  # a look records only a walk
            record_good_state(path, synced=durable and not readonly)
        #: The lock file, mapped (``lmdb_lock_file``; closed only after the environment), and
        #: as ``marker`` when its layout was vouched for: ``last_transaction`` without the
        #: gate (None: through ``info()``).
        self.lock_file = open_marker(path, self._last_transaction_from_meta)
        self.marker = self.lock_file if self.lock_file is not None and self.lock_file.usable else None

    # -- set up ----------------------------------------------------------------------------

    def _open_db(self, name: bytes) -> lmdb._Database | None:
        """A sub-database handle (None: read-only and the sub-database does not exist)."""
        try:
            return self.env.open_db(name, create=not self.readonly)
        except lmdb.NotFoundError:
            assert self.readonly
            return None

    def _check_format(self) -> None:
        """Check the layout format (and record it in a new environment)."""
        if self.internal is None:
            return
        with self.env.begin(write=not self.readonly) as txn:
            stored = txn.get(FORMAT_KEY, db=self.internal)
            if stored is None and not self.readonly:
                txn.put(FORMAT_KEY, LAYOUT_FORMAT, db=self.internal)
        if stored is not None and stored != LAYOUT_FORMAT:
            raise MetadataCorrupted(f"unknown metadata layout format {stored!r}", path=self.path)

    def open_tables(self, tables: Sequence[str]) -> None:
        """Open the sub-databases of ``tables`` not opened yet."""
        with self.write_lock, self.gate.shared():
            for table in tables:
                if table not in self.dbs:
                    with _translated(self):
                        self.dbs[table] = self._open_db(table.encode("utf-8"))

    # -- reads -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def reading(self) -> Iterator[lmdb.Transaction[bytes]]:
        """A read transaction; adopts another process's map growth if LMDB asks for it."""
        for _ in range(MAP_RESIZE_ATTEMPTS_MAX):
            with self.gate.shared():
                if self.closed:
                    raise StorageClosed("metadata store is closed", path=self.path)
                txn = None
                with _translated(self):
                    try:
                        txn = self.env.begin()
                    except lmdb.MapResizedError:
                        if self.gate.depth() > 1:
                            raise MetadataError(
                                "another process grew the LMDB map while this thread holds a "
                                "snapshot; retry outside the snapshot",
                                path=self.path,
                            ) from None
                if txn is not None:
                    with txn, _translated(self):
                        yield txn
                    return
            self.resize(adopt=True)
        raise MetadataError("LMDB map kept changing size; giving up", path=self.path)

    def read_once(self, action: Callable[[lmdb.Transaction[bytes]], _T]) -> _T:
        """``action(txn)`` in a read transaction of its own: ``reading`` without its
        generator and nested context managers, for the single reads every operation
        makes (a record, an index floor). Falls back to ``reading`` to adopt a map size
        another process grew."""
        depth = self.gate.enter_shared()
        try:
            if self.closed:
                raise StorageClosed("metadata store is closed", path=self.path)
            try:
                txn = self.env.begin()
            except lmdb.MapResizedError:
                txn = None
            except lmdb.Error as exc:
                raise _translation(self, exc) from exc
            if txn is not None:
                try:
                    return action(txn)
                except lmdb.Error as exc:
                    raise _translation(self, exc) from exc
                finally:
                    txn.abort()
        finally:
            self.gate.leave_shared(depth)
        with self.reading() as resized:
            return action(resized)

    # -- commits ---------------------------------------------------------------------------

    def _run_group(self, group: Sequence[_Pending]) -> _GroupRun | list[int | BaseException]:
        """Apply a group in one write transaction (called by the group's leader only).

        Durable: ``(results, flushed_earlier)`` for the committer's shared syncs. LMDB
        syncs a transaction that wrote anything (its data pages, and with them the meta
        page of every transaction committed before it, in this process or another)
        before it writes its own meta page, which stays unsynced (``metasync=False``)."""
        outcome = self._run_group_once(group)
        if not self.durable:
            return outcome
        flushed = any(isinstance(result, int) for result in outcome)  # it wrote: LMDB synced
        return outcome, flushed

    def sync(self) -> None:
        """Sync the environment: every transaction committed so far is durable on return
        (``MetadataError`` if the sync fails; the environment is then broken)."""
        if self.sync_failure is not None:
            raise self.sync_failure
        try:
            with self.gate.shared():
                if self.closed:
                    raise StorageClosed("metadata store is closed", path=self.path)
                self.env.sync(True)
        except lmdb.Error as exc:
            self.sync_failure = MetadataError(
                f"LMDB sync failed: {exc}; commits since the last sync may be lost, reopen the store",
                path=self.path,
            )
            raise self.sync_failure from exc

    def _run_group_once(self, group: Sequence[_Pending]) -> list[int | BaseException]:
        """The group's outcomes, one per commit (see ``_run_group``)."""
        for _ in range(MAP_RESIZE_ATTEMPTS_MAX):
            try:
                results = self._apply_group(group)
            except lmdb.MapFullError:
                self.resize(adopt=False)
            except lmdb.MapResizedError:
                self.resize(adopt=True)
            except lmdb.Error as exc:
                damaged = isinstance(exc, (lmdb.CorruptedError, lmdb.PageNotFoundError))
                error = (
                    _translation(self, exc)
                    if damaged
                    else MetadataError(f"LMDB write failed: {exc}", path=self.path)
                )
                error.__cause__ = exc
                return [error] * len(group)
            else:
                carried = {
                    id(p.store): p.store for p, r in zip(group, results, strict=True) if isinstance(r, int)
                }
                for store in carried.values():  # each store object counts the groups it was in
                    store._count(group_commits=1)  # noqa: SLF001 - same class
                self._grow_if_nearly_full()
                return results
        error = MetadataError("LMDB map still full after growing it", path=self.path)
        return [error] * len(group)

    def _apply_group(self, group: Sequence[_Pending]) -> list[int | BaseException]:
        """Check and apply each commit in order in one write transaction; its outcomes."""
        assert not self.readonly
        with self.write_lock:
            if self.closed:
                return [StorageClosed("metadata store is closed", path=self.path)] * len(group)
            if self.sync_failure is not None:
                return [self.sync_failure] * len(group)
            with self.gate.shared(), self.env.begin(write=True) as txn:
                first = sequence = _read_sequence(txn, self.internal)
                # Read in this transaction: whichever process enabled capture, it holds here.
                capture = txn.get(CAPTURE_KEY, db=self.internal) is not None
                assert not capture or self.changes is not None
                results: list[int | BaseException] = []
                for pending in group:
                    failed = self.failed_expectation(txn, pending.expect)
                    if failed is not None:
                        results.append(failed)
                        continue
                    sequence += 1
                    captured: list[list[object]] = []  # the change's [table, key, value or nil] items
                    for op in pending.ops:
                        db = self.dbs[op.table]
                        if isinstance(op, Put):
                            txn.put(op.key, _frame(sequence, op.value), db=db)
                            captured.append([op.table, op.key, op.value])
                        elif isinstance(op, Delete):
                            txn.delete(op.key, db=db)
                            captured.append([op.table, op.key, None])
                        elif isinstance(op, DeleteKeys):
                            delete = txn.delete
                            for key in op.keys:
                                delete(key, db=db)
                            captured.extend([op.table, key, None] for key in op.keys)
                        else:  # a range is recorded as the keys it removed
                            removed = _delete_range(txn, db, op.start, op.stop)
                            captured.extend([op.table, key, None] for key in removed)
                    if capture:
                        added = txn.put(
                            _VERSION.pack(sequence),
                            msgpack.packb(captured, use_bin_type=True),
                            db=self.changes,
                            overwrite=False,
                        )
                        assert added, f"change {sequence} already in the change log"
                    results.append(sequence)
                assert sequence >= first
                if sequence > first:
                    txn.put(SEQUENCE_KEY, _VERSION.pack(sequence), db=self.internal)
            return results

    def failed_expectation(
        self, txn: lmdb.Transaction[bytes], expect: Sequence[Expect]
    ) -> MetadataError | None:
        """Why this commit may not apply (a conflict, or an unreadable record), or None."""
        for condition in expect:
            raw = txn.get(condition.key, db=self.dbs[condition.table])
            try:
                actual = 0 if raw is None else _unframe(raw, condition.table, condition.key).version
            except MetadataCorrupted as exc:
                return exc  # this commit's caller learns it; the rest of the group goes on
            if actual != condition.version:
                return _checks.conflict(condition, actual)
        return None

    def write(self, action: Callable[[lmdb.Transaction[bytes]], _T]) -> _T:
        """Run ``action`` in a write transaction of its own (not a commit: for replication and
        change-log maintenance), under the writer lock, growing or adopting the map and
        retrying as a group does. An exception from ``action`` aborts the transaction (and
        propagates); LMDB errors become ``MetadataError``. The caller holds no gate."""
        assert not self.readonly
        assert self.gate.depth() == 0, "a write inside a snapshot could deadlock a resize"
        for _ in range(MAP_RESIZE_ATTEMPTS_MAX):
            try:
                with self.write_lock:
                    if self.closed:
                        raise StorageClosed("metadata store is closed", path=self.path)
                    if self.sync_failure is not None:
                        raise self.sync_failure
                    with self.gate.shared(), self.env.begin(write=True) as txn:
                        result = action(txn)
                    if self.durable:
                        self.sync()  # durable on return, as every write of this store
            except lmdb.MapFullError:
                self.resize(adopt=False)
            except lmdb.MapResizedError:
                self.resize(adopt=True)
            except (lmdb.CorruptedError, lmdb.PageNotFoundError) as exc:
                raise _translation(self, exc) from exc
            except lmdb.Error as exc:
                raise MetadataError(f"LMDB write failed: {exc}", path=self.path) from exc
            else:
                self._grow_if_nearly_full()
                return result
        raise MetadataError("LMDB map still full after growing it", path=self.path)

    def _grow_if_nearly_full(self) -> None:
        """Double the map once more than MAP_FILL_RATIO_MAX of it is used: LMDB's page
        allocation slows down sharply in a nearly full map (it searches a fragmented free
        list, and values of more than a page need contiguous pages). Best effort: the
        group's commits are already durable, so nothing here may fail them."""
        with self.gate.shared():
            if self.closed:
                return
            info = self.env.info()
        used_bytes = (info["last_pgno"] + 1) * self.page_bytes
        if used_bytes <= info["map_size"] * MAP_FILL_RATIO_MAX:
            return
        with contextlib.suppress(MetadataError):  # at its maximum: a full map fails later
            self.resize(adopt=False)

    def resize(self, adopt: bool) -> None:
        """Grow the map (double it), or adopt the size another process grew it to."""
        with self.gate.exclusive():
            if self.closed:
                return
            with _translated(self):
                if adopt:
                    self.env.set_mapsize(0)
                    return
                current = self.env.info()["map_size"]
                if current >= MAP_SIZE_BYTES_MAX:
                    raise MetadataError("LMDB map is at its maximum size", path=self.path, map_size=current)
                self.env.set_mapsize(min(current * 2, MAP_SIZE_BYTES_MAX))

    def map_size_bytes(self) -> int:
        with self.gate.shared():
            return int(self.env.info()["map_size"])

    def last_transaction(self) -> int:
        """LMDB's id of the last committed write transaction of any process: from the lock
        file's table where ``lmdb_lock_file`` vouched for its layout (no gate: that file is
        never remapped), else from the meta pages, under the gate. (Every read through
        the metadata cache asks this.)"""
        marker = self.marker
        if marker is None:
            return self._last_transaction_from_meta()
        if self.closed:
            raise StorageClosed("metadata store is closed", path=self.path)
        try:
            return marker.last_transaction()
        except ValueError:  # closed meanwhile: its mapping is gone
            raise StorageClosed("metadata store is closed", path=self.path) from None

    def _last_transaction_from_meta(self) -> int:
        """``last_transaction`` from the meta pages, without a read transaction (the
        gate's entry written out)."""
        gate = self.gate
        depth = gate.enter_shared()
        try:
            if self.closed:
                raise StorageClosed("metadata store is closed", path=self.path)
            return int(self.env.info()["last_txnid"])
        finally:
            gate.leave_shared(depth)

    def close(self) -> None:
        """Close the LMDB environment once the writer and every reader of this process left."""
        with self.write_lock, self.gate.exclusive():
            if not self.closed:
                self.closed = True
                synced = False
                if self.durable and not self.readonly and self.sync_failure is None:
                    with contextlib.suppress(lmdb.Error):  # best effort: acknowledged commits synced already
                        self.env.sync(True)
                        synced = True
                self.env.close()
                if self.lock_file is not None:  # after the environment: its locks (module doc)
                    self.lock_file.close()
                if synced and self.vouched != UNCHECKED:  # a clean restart need not walk the file
                    record_good_state(self.path, synced=True)


@contextlib.contextmanager
def _translated(env: _Environment) -> Iterator[None]:
    """The one place LMDB exceptions become SLTS errors."""
    try:
        yield
    except lmdb.Error as exc:
        raise _translation(env, exc) from exc


def _translation(env: _Environment, exc: lmdb.Error) -> SltsError:
    """The SLTS error for an LMDB error."""
    if isinstance(exc, (lmdb.CorruptedError, lmdb.PageNotFoundError)):  # a page number past the file
        return MetadataCorrupted(
            f"LMDB reports corruption: {exc}; rebuild the metadata from tier-2 with "
            "`slts restore --to NEW_FOLDER`",
            path=env.path,
        )
    if env.closed:
        return StorageClosed("metadata store is closed", path=env.path)
    return MetadataError(f"LMDB error: {exc}", path=env.path)


_registry: dict[tuple[int, int, int], _Environment] = {}  # (pid, st_dev, st_ino) -> environment
_registry_lock = threading.Lock()


def _acquire(path: str, map_size_bytes: int, durable: bool, readonly: bool, check: str) -> _Environment:
    """The environment of ``path`` in this process: the open one, or a new one, opened
    once its data file is vouched for (``lmdb_file.vouch`` with mode ``check``)."""
    try:
        if not readonly:
            os.makedirs(path, exist_ok=True)
        status = os.stat(path)
    except FileNotFoundError as exc:
        if readonly:
            raise StoreNotFound(f"no metadata store (LMDB folder) at {path!r}", path=path) from None
        raise InvalidConfig(
            f"cannot use {path!r} as a metadata folder: {exc.strerror or exc}", path=path
        ) from exc
    except OSError as exc:  # a file in the way, no permission, a read-only or virtual file system
        raise InvalidConfig(
            f"cannot use {path!r} as a metadata folder: {exc.strerror or exc}", path=path
        ) from exc
    if not stat.S_ISDIR(status.st_mode):
        raise InvalidConfig(f"cannot use {path!r} as a metadata folder: it is not a folder", path=path)
    identity = (status.st_dev, status.st_ino)
    with _registry_lock:
        env = _opened(path, identity)
        if env is not None:
            return _share(env, durable, readonly)
    # Not mapped in this process yet: a damaged file would kill it once mapped (SIGBUS).
    # The check may walk the file in a child process: outside the lock.
    vouched = vouch(path, check)
    with _registry_lock:
        env = _opened(path, identity)
        if env is None:
            env = _Environment(path, identity, map_size_bytes, durable, readonly, vouched)
            _registry[(_process_id, *identity)] = env
            return env
        return _share(env, durable, readonly)


def _opened(path: str, identity: tuple[int, int]) -> _Environment | None:
    """The open environment of ``identity`` in this process, or None; ``MetadataError``
    if another process opened it before forking this one. Under ``_registry_lock``."""
    for (pid, *other), opened in _registry.items():
        if tuple(other) == identity and pid != _process_id and not opened.closed:
            raise MetadataError(
                f"LMDB environment {path!r} was opened by process {pid} before this process "
                "forked; a forked child must not use or reopen it (open it in a process "
                "started with 'spawn', or before opening it in the parent)",
                path=path,
            )
    env = _registry.get((_process_id, *identity))
    return None if env is None or env.closed else env


def _share(env: _Environment, durable: bool, readonly: bool) -> _Environment:
    """One more reference to ``env``, if the flags agree. Under ``_registry_lock``."""
    if env.durable != durable:
        raise InvalidArgument(
            "this folder is already open in this process with another durable flag", path=env.path
        )
    if env.readonly and not readonly:
        raise InvalidArgument("this folder is already open read-only in this process", path=env.path)
    env.references += 1
    return env


def _release(env: _Environment) -> None:
    with _registry_lock:
        env.references -= 1
        assert env.references >= 0
        if env.references:
            return
        del _registry[(env.pid, *env.identity)]
    env.close()


class _LmdbView(ReadView):
    """Reads inside one LMDB read transaction."""

    def __init__(self, env: _Environment, txn: lmdb.Transaction[bytes], tables: tuple[str, ...]) -> None:
        self._env = env
        self._txn: lmdb.Transaction[bytes] | None = txn
        self._tables = tables
        self._sequence: int | None = None  # read from the transaction on first use

    @property
    def sequence(self) -> int:
        if self._txn is None:
            raise StorageClosed("snapshot used outside its with block")
        if self._sequence is None:
            with _translated(self._env):
                self._sequence = _read_sequence(self._txn, self._env.internal)
        return self._sequence

    def _db(self, table: str) -> lmdb._Database | None:
        if self._txn is None:
            raise StorageClosed("snapshot used outside its with block")
        return self._env.dbs[_checks.check_table(self._tables, table)]

    def get(self, table: str, key: bytes) -> Versioned | None:
        db = self._db(table)
        _checks.check_bound("key", key)
        if db is None or not 1 <= len(key) <= KEY_BYTES_MAX:
            return None  # no such key can be stored
        assert self._txn is not None
        with _translated(self._env):
            raw = self._txn.get(key, db=db)
        return None if raw is None else _unframe(raw, table, key)

    def floor(self, table: str, key: bytes, lowest: bytes = b"") -> tuple[bytes, Versioned] | None:
        db = self._db(table)
        _checks.check_bound("key", key)
        _checks.check_bound("lowest", lowest)
        # Every stored key k (<= KEY_BYTES_MAX bytes) has k <= key iff k <= key[:KEY_BYTES_MAX].
        key = key[:KEY_BYTES_MAX]
        if db is None or not key or lowest > key:
            return None
        assert self._txn is not None
        with _translated(self._env), self._txn.cursor(db) as cursor:
            if cursor.set_range(key):
                if cursor.key() != key and not cursor.prev():
                    return None
            elif not cursor.last():
                return None
            found_key, raw = cursor.item()
        assert found_key <= key
        if found_key < lowest:
            return None
        return found_key, _unframe(raw, table, found_key)

    def scan(
        self,
        table: str,
        start: bytes = b"",
        stop: bytes | None = None,
        limit: int = SCAN_LIMIT_DEFAULT,
        reverse: bool = False,
    ) -> list[tuple[bytes, Versioned]]:
        db = self._scanned_db(table, start, stop, limit)
        if db is None:
            return []
        assert self._txn is not None
        entries: list[tuple[bytes, bytes]] = []
        with _translated(self._env), self._txn.cursor(db) as cursor:
            if not reverse:
                positioned = _seek(cursor, start)
                while positioned and len(entries) < limit:
                    key = cursor.key()
                    if stop is not None and key >= stop:
                        break
                    entries.append((key, cursor.value()))
                    positioned = cursor.next()
            else:
                if stop is None:
                    positioned = cursor.last()
                else:
                    positioned = cursor.prev() if _seek(cursor, stop) else cursor.last()
                while positioned and len(entries) < limit:
                    key = cursor.key()
                    if key < start:
                        break
                    entries.append((key, cursor.value()))
                    positioned = cursor.prev()
        return [(key, _unframe(raw, table, key)) for key, raw in entries]

    def _scanned_db(self, table: str, start: bytes, stop: bytes | None, limit: int) -> lmdb._Database | None:
        """The checked arguments of a scan: ``table``'s sub-database, or None when the scan
        is empty (no such sub-database, or ``stop <= start``)."""
        db = self._db(table)
        _checks.check_scan(start, stop, limit)
        return None if db is None or (stop is not None and stop <= start) else db

    def scan_values(
        self, table: str, start: bytes = b"", stop: bytes | None = None, limit: int = SCAN_LIMIT_DEFAULT
    ) -> list[tuple[bytes, bytes]]:
        """``scan`` without the versions: one cursor walk yielding (key, stored value), each
        value's framing checked (``MetadataCorrupted`` as ``scan``) and its version cut off."""
        db = self._scanned_db(table, start, stop, limit)
        if db is None:
            return []
        assert self._txn is not None
        entries: list[tuple[bytes, bytes]] = []
        header = _VERSION.size
        with _translated(self._env), self._txn.cursor(db) as cursor:
            if not _seek(cursor, start):
                return []
            for key, raw in cursor.iternext():
                if stop is not None and key >= stop:
                    break
                if len(raw) < header or raw[:header] == _NO_VERSION:
                    _unframe(raw, table, key)  # raises, saying what is wrong
                entries.append((key, raw[header:]))
                if len(entries) == limit:
                    break
        return entries

    def count(self, table: str) -> int:
        """The table's sub-database's own entry count (its B-tree root record: O(1)). Each
        table is a sub-database of its own, apart from the change log and the internal one."""
        db = self._db(table)
        if db is None:
            return 0  # read-only, and the table was never created: nothing stored
        assert self._txn is not None
        with _translated(self._env):
            entries = int(self._txn.stat(db)["entries"])
        assert entries >= 0
        return entries

    def close(self) -> None:
        self._txn = None


def _delete_range(
    txn: lmdb.Transaction[bytes], db: lmdb._Database | None, start: bytes, stop: bytes
) -> list[bytes]:
    """Delete every key ``start <= k < stop`` of ``db`` with one cursor walk; the keys
    deleted, ascending (what the change log records for a ``DeleteRange``)."""
    removed: list[bytes] = []
    with txn.cursor(db) as cursor:
        positioned = _seek(cursor, start)
        while positioned:
            key = cursor.key()
            if key >= stop:
                break
            removed.append(key)
            deleted = cursor.delete()  # moves to the next entry, if any
            assert deleted
            positioned = bool(cursor.key())
    return removed


def _seek(cursor: lmdb.Cursor[bytes], bound: bytes) -> bool:
    """Position ``cursor`` at the first key >= ``bound`` (any length); False if none."""
    if not bound:
        return cursor.first()
    positioned = cursor.set_range(bound[:KEY_BYTES_MAX])
    if positioned and cursor.key() < bound:
        # Only bound[:KEY_BYTES_MAX] itself can sort between the truncated and the full bound.
        assert len(bound) > KEY_BYTES_MAX and cursor.key() == bound[:KEY_BYTES_MAX]
        positioned = cursor.next()
    return positioned


class LmdbMetadataStore(MetadataStore):
    """``MetadataStore`` on an LMDB environment in folder ``path``.

    ``durable``: every commit is synced (LMDB ``sync`` and ``metasync``) before it returns;
    otherwise a commit survives a process crash but not an OS crash. ``readonly``: commits
    raise ``InvalidArgument``; tables created after opening appear only after reopening.
    ``map_size_bytes`` is the initial map; it doubles whenever it fills up (up to
    ``MAP_SIZE_BYTES_MAX``), so a commit never fails for lack of map.

    ``check`` (``"changed"``, ``"always"`` or ``"never"``; ``lmdb_file``): before this
    process first maps the folder's data file, its meta pages are checked and, when it may
    have changed other than by LMDB since it was last known good (always, with
    ``"always"``), the whole file is walked in a child process, so that no damage to it can
    kill this process: damage raises ``MetadataCorrupted``.

    Several processes may open the same folder (LMDB serialises their writers; a commit's
    expectations are checked inside the write transaction, so conflicts are detected across
    processes). Store objects of one process on one folder share one environment and one
    group committer. Never use a store across ``fork()``: a child process gets
    ``MetadataError``; open the store in the child (started with ``spawn``) instead.
    """

    def __init__(
        self,
        path: str,
        tables: Sequence[str],
        *,
        map_size_bytes: int = MAP_SIZE_BYTES_DEFAULT,
        durable: bool = True,
        readonly: bool = False,
        check: str = "changed",
    ) -> None:
        self.tables = _checks.check_tables(tables)
        if check not in CHECK_MODES:
            raise InvalidArgument(f"check must be one of {', '.join(CHECK_MODES)}, got {check!r}")
        page_bytes = os.sysconf("SC_PAGE_SIZE")
        if not isinstance(map_size_bytes, int) or not 0 < map_size_bytes <= MAP_SIZE_BYTES_MAX:
            raise InvalidArgument(
                f"map_size_bytes must be in (0, {MAP_SIZE_BYTES_MAX}]",
                map_size_bytes=map_size_bytes,
            )
        map_size_bytes = -(-map_size_bytes // page_bytes) * page_bytes
        self.path = os.path.abspath(os.fspath(path))
        self.durable = durable
        self.readonly = readonly
        self._pid = _process_id
        self._closed = False
        self._counters_lock = threading.Lock()
        self._counters = {"commits": 0, "conflicts": 0, "reads": 0, "group_commits": 0}
        self._env = _acquire(self.path, map_size_bytes, durable, readonly, check)
        try:
            self._env.open_tables(self.tables)
        except BaseException:
            _release(self._env)
            raise

    # -- reads -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[ReadView]:
        """One LMDB read transaction, open for the ``with`` block only: keep it short."""
        self._check_usable()
        self._count(reads=1)
        with self._env.reading() as txn:
            view = _LmdbView(self._env, txn, self.tables)
            try:
                yield view
            finally:
                view.close()

    def get(self, table: str, key: bytes) -> Versioned | None:
        """``snapshot().get`` in a read transaction of its own (the lean path)."""
        self._check_usable()
        self._count(reads=1)
        return self._env.read_once(lambda txn: _LmdbView(self._env, txn, self.tables).get(table, key))

    def floor(self, table: str, key: bytes, lowest: bytes = b"") -> tuple[bytes, Versioned] | None:
        """``snapshot().floor`` in a read transaction of its own (the lean path)."""
        self._check_usable()
        self._count(reads=1)
        return self._env.read_once(
            lambda txn: _LmdbView(self._env, txn, self.tables).floor(table, key, lowest)
        )

    def count(self, table: str) -> int:
        """``snapshot().count`` in a read transaction of its own (the lean path)."""
        self._check_usable()
        self._count(reads=1)
        return self._env.read_once(lambda txn: _LmdbView(self._env, txn, self.tables).count(table))

    @property
    def last_sequence(self) -> int:
        """The sequence of the latest commit by any process (0 before the first)."""
        self._check_usable()
        return self._env.read_once(lambda txn: _read_sequence(txn, self._env.internal))

    @property
    def change_marker(self) -> object:
        """LMDB's last write transaction id (see ``MetadataStore.change_marker``): any
        process's commit, replicate or change-log maintenance moves it."""
        self._check_usable()
        return self._env.last_transaction()

    def make_durable(self) -> None:
        """Sync the environment (see ``MetadataStore.make_durable``): commits that another
        thread's group applied and has not synced yet become durable now."""
        self._check_usable()
        if self._env.durable and not self._env.readonly:
            self._env.sync()

    @property
    def map_size_bytes(self) -> int:
        """The current size of the memory map (grows on demand)."""
        self._check_usable()
        return self._env.map_size_bytes()

    # -- commits ---------------------------------------------------------------------------

    def commit(self, ops: Sequence[CommitOp], expect: Sequence[Expect] = ()) -> int:
        """Queue the commit for the next group (run at once when no group is running)."""
        _checks.check_commit(self.tables, ops, expect)
        self._check_writable("commit")
        try:
            sequence = self._env.committer.submit(_Pending(self, tuple(ops), tuple(expect)))
        except VersionConflict:
            self._count(conflicts=1)
            raise
        self._count(commits=1)
        return sequence

    def replicate(
        self, sequence: int, ops: Sequence[Operation], versions: Sequence[int] | None = None
    ) -> None:
        """Apply ``ops`` at ``sequence`` in one write transaction of its own (see
        ``MetadataStore``); the order check reads the stored sequence inside it."""
        resolved = _checks.check_replicate(self.tables, sequence, ops, versions)
        self._check_writable("replicate")
        ops = tuple(ops)

        def apply(txn: lmdb.Transaction[bytes]) -> None:
            _checks.check_replicate_order(sequence, _read_sequence(txn, self._env.internal))
            for op, version in zip(ops, resolved, strict=True):
                db = self._env.dbs[op.table]
                if isinstance(op, Put):
                    assert 1 <= version <= sequence
                    txn.put(op.key, _frame(version, op.value), db=db)
                else:
                    txn.delete(op.key, db=db)
            txn.put(SEQUENCE_KEY, _VERSION.pack(sequence), db=self._env.internal)

        self._env.write(apply)

    def replicate_rows(self, sequence: int, rows: Mapping[str, Sequence[Row]]) -> None:
        """``replicate`` of many rows in one write transaction (see ``MetadataStore``): the
        rows of each table sorted by key, those past the table's last key appended
        (``_load_rows``)."""
        checked_sequence = _checks.check_replicate_sequence(sequence)
        framed = _framed_rows(self.tables, checked_sequence, rows)
        if framed is None:  # something is unusual: the shared checks say what, or accept it
            _, checked = _checks.check_replicate_rows(self.tables, sequence, rows)
            framed = [(table, *_framed(table_rows)) for table, table_rows in checked]
        self._check_writable("replicate_rows")

        def apply(txn: lmdb.Transaction[bytes]) -> None:
            _checks.check_replicate_order(checked_sequence, _read_sequence(txn, self._env.internal))
            for table, puts, deletes in framed:
                db = self._env.dbs[table]
                assert db is not None, "a writable store opened every table"
                _load_rows(txn, db, puts, deletes)
            txn.put(SEQUENCE_KEY, _VERSION.pack(checked_sequence), db=self._env.internal)

        self._env.write(apply)

    # -- change capture --------------------------------------------------------------------

    def enable_change_capture(self) -> None:
        """Persist the ``capture`` flag (every process's next write transaction sees it)."""
        self._check_usable()
        if self._env.gate.depth():
            raise InvalidArgument("enable_change_capture inside an open snapshot() block of the same thread")
        if self.change_capture_enabled:
            return  # nothing to write (also on a read-only store)
        self._check_writable("enable_change_capture")
        self._env.write(lambda txn: txn.put(CAPTURE_KEY, b"1", db=self._env.internal))

    @property
    def change_capture_enabled(self) -> bool:
        """Whether the ``capture`` flag is set (by any process, now or before)."""
        self._check_usable()
        if self._env.internal is None:
            return False
        with self._env.reading() as txn:
            return txn.get(CAPTURE_KEY, db=self._env.internal) is not None

    def changes(self, after: int, limit: int = SCAN_LIMIT_DEFAULT) -> list[Change]:
        """Captured changes with ``sequence > after``, ascending, from one read transaction."""
        changes = [_decode_change(key, raw) for key, raw in self._change_entries(after, limit)]
        assert all(a.sequence < b.sequence for a, b in itertools.pairwise(changes))
        assert not changes or changes[0].sequence > after
        return changes

    def encoded_changes(self, after: int, limit: int = SCAN_LIMIT_DEFAULT) -> list[tuple[int, bytes]]:
        """``changes`` with each change's operations as its change-log entry holds them
        (the contract's ``encoded_changes``): only the entry's key is checked here."""
        entries = self._change_entries(after, limit)
        if any(len(key) != _VERSION.size for key, _ in entries):
            raise MetadataCorrupted("change-log key is not 8 bytes")
        return [(_VERSION.unpack(key)[0], raw) for key, raw in entries]

    def _change_entries(self, after: int, limit: int) -> list[tuple[bytes, bytes]]:
        """The change log's (key, entry) pairs with sequence > ``after``, at most
        ``limit``, from one read transaction; arguments checked (``changes``)."""
        _checks.check_sequence_bound("after", after)
        _checks.check_limit(limit, "changes")
        self._check_usable()
        db = self._env.changes
        if db is None or after >= SEQUENCE_MAX:
            return []
        found: list[tuple[bytes, bytes]] = []
        with self._env.reading() as txn, txn.cursor(db) as cursor:
            positioned = cursor.set_range(_VERSION.pack(after + 1))
            while positioned and len(found) < limit:
                found.append(cursor.item())
                positioned = cursor.next()
        return found

    def discard_changes(self, through: int, expect: Sequence[Expect] = ()) -> int:
        """Delete change-log entries ``<= through`` from the start of the log, at most
        ``DISCARD_BATCH_MAX`` per write transaction (between them commits go on), each
        transaction only if every ``expect`` holds in it (``VersionConflict`` otherwise)."""
        _checks.check_sequence_bound("through", through)
        _checks.check_commit(self.tables, (), expect)
        self._check_writable("discard_changes")
        expect = tuple(expect)
        db = self._env.changes
        assert db is not None
        bound = _VERSION.pack(min(through, SEQUENCE_MAX))
        batch_max = DISCARD_BATCH_MAX
        assert batch_max >= 1

        def discard_batch(txn: lmdb.Transaction[bytes]) -> int:
            failed = self._env.failed_expectation(txn, expect)
            if failed is not None:
                raise failed  # aborts this transaction: nothing of it removed
            removed = 0
            with txn.cursor(db) as cursor:
                positioned = cursor.first()
                while positioned and removed < batch_max and cursor.key() <= bound:
                    deleted = cursor.delete()  # moves to the next entry, if any
                    assert deleted
                    removed += 1
                    positioned = bool(cursor.key())
            return removed

        total = 0
        while True:
            try:
                removed = self._env.write(discard_batch)
            except VersionConflict:
                self._count(conflicts=1)
                raise
            total += removed
            if removed < batch_max:
                return total

    # -- life cycle ------------------------------------------------------------------------

    def statistics(self) -> StoreStatistics:
        """Counters of this store object (``group_commits``: write transactions that
        carried at least one of its commits)."""
        with self._counters_lock:
            return StoreStatistics(**self._counters)

    def close(self) -> None:
        """Release the environment (closed when the last store object of this process on
        the folder closes). Idempotent. In a forked child it only marks the object closed."""
        if self._closed:
            return
        if self._pid != _process_id:
            self._closed = True
            return
        if self._env.gate.depth():
            raise InvalidArgument("close inside an open snapshot() block of the same thread")
        self._closed = True
        _release(self._env)

    def _count(self, **increments: int) -> None:
        with self._counters_lock:
            for name, increment in increments.items():
                self._counters[name] += increment

    def _check_writable(self, call: str) -> None:
        """Checks before any write: usable, not read-only, not inside a snapshot."""
        self._check_usable()
        if self.readonly:
            raise InvalidArgument("metadata store opened read-only", path=self.path)
        if self._env.gate.depth():
            raise InvalidArgument(f"{call} inside an open snapshot() block of the same thread")

    def _check_usable(self) -> None:
        if self._closed:
            raise StorageClosed("metadata store is closed", path=self.path)
        if self._pid != _process_id:
            raise MetadataError(
                f"LMDB store {self.path!r} opened in process {self._pid} used in process "
                f"{_process_id} after fork(); open a new store in the child instead",
                path=self.path,
            )
