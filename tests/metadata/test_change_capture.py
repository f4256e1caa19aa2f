"""Change capture (the metadata log's source), ``ReadView.sequence`` and ``replicate``,
run against every store; LMDB specifics (other handles, other processes, kill -9, batched
discard) at the end."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slts.errors import InvalidArgument, StorageClosed, VersionConflict
from slts.metadata import (
    Change,
    Delete,
    DeleteKeys,
    DeleteRange,
    Expect,
    LmdbMetadataStore,
    MemoryMetadataStore,
    MetadataStore,
    Operation,
    Put,
    Versioned,
    lmdb_store,
)
from slts.metadata.store import encode_operations

from .conftest import TABLES, StoreFactory

T = TABLES[0]
U = TABLES[1]
WAIT_S = 60  # bounds every wait so that a bug fails the test instead of hanging it


def all_changes(store: MetadataStore, after: int = 0, page: int = 7) -> list[Change]:
    """Every captured change after ``after``, read in pages of ``page``."""
    found: list[Change] = []
    while True:
        batch = store.changes(after, limit=page)
        assert len(batch) <= page
        found.extend(batch)
        if len(batch) < page:
            return found
        after = batch[-1].sequence


def replay(target: MetadataStore, changes: Sequence[Change]) -> None:
    """Apply captured changes to ``target`` as a restore does."""
    for change in changes:
        target.replicate(change.sequence, change.ops)


# -- capture ---------------------------------------------------------------------------------


def test_capture_is_off_by_default(store: MetadataStore) -> None:
    store.commit([Put(T, b"a", b"1")])
    store.commit([Delete(T, b"a")])
    assert not store.change_capture_enabled
    assert store.changes(0) == []


def test_each_commit_is_captured_once_with_its_sequence_and_ops(store: MetadataStore) -> None:
    store.commit([Put(T, b"before", b"not captured")])
    store.enable_change_capture()
    store.enable_change_capture()  # idempotent
    assert store.change_capture_enabled
    commits: list[list[Operation]] = [
        [Put(T, b"a", b"1"), Put(U, b"b", b"")],
        [Delete(T, b"a"), Put(T, b"a", b"2"), Delete(U, b"never-there")],
        [],  # a pure check takes a sequence, so it is captured too
        [Put(T, b"k" * 511, bytes(range(256)) * 64)],
    ]
    expected: list[Change] = []
    for ops in commits:
        expected.append(Change(store.commit(ops), tuple(ops)))
    with pytest.raises(VersionConflict):
        store.commit([Put(T, b"lost", b"x")], [Expect(T, b"a", 0)])
    expected.append(Change(store.commit([Delete(U, b"b")]), (Delete(U, b"b"),)))
    assert [change.sequence for change in expected] == list(range(2, 7))
    assert all_changes(store, page=2) == expected
    assert store.changes(0, limit=1) == expected[:1]
    assert store.changes(3) == expected[2:]
    assert store.changes(6) == [] and store.changes(10**30) == []
    assert store.last_sequence == 6  # the conflict took no sequence
    # The same changes encoded: each one's operations as one msgpack array, in order.
    encoded = [(c.sequence, encode_operations(c.ops)) for c in expected]
    assert store.encoded_changes(0) == encoded
    assert store.encoded_changes(3, limit=2) == encoded[2:4]
    assert store.encoded_changes(6) == [] and store.encoded_changes(10**30) == []
    assert msgpack.unpackb(store.encoded_changes(1, limit=1)[0][1]) == [[T, b"a", b"1"], [U, b"b", b""]]


def test_encoded_changes_carry_what_delete_range_and_delete_keys_removed(store: MetadataStore) -> None:
    store.enable_change_capture()
    store.commit([Put(T, b"a", b"1"), Put(T, b"b", b"2"), Put(T, b"c", b"3")])
    sequence = store.commit([DeleteRange(T, b"a", b"c"), DeleteKeys(T, (b"c", b"never-there"))])
    (change,) = store.changes(sequence - 1)
    assert store.encoded_changes(sequence - 1) == [(sequence, encode_operations(change.ops))]
    assert msgpack.unpackb(store.encoded_changes(sequence - 1)[0][1]) == [
        [T, b"a", None],
        [T, b"b", None],
        [T, b"c", None],
        [T, b"never-there", None],
    ]


def test_change_arguments_are_checked(store: MetadataStore) -> None:
    store.enable_change_capture()
    for after, limit in [(-1, 10), ("0", 10), (True, 10), (1.0, 10), (0, 0), (0, -3), (0, "5")]:
        with pytest.raises(InvalidArgument):
            store.changes(after, limit)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            store.encoded_changes(after, limit)  # type: ignore[arg-type]
    for through in [-1, "3", None, False, 2.5]:
        with pytest.raises(InvalidArgument):
            store.discard_changes(through)  # type: ignore[arg-type]


def test_concurrent_commits_are_captured_contiguously(store: MetadataStore) -> None:
    """Blind inserts and a contended counter from many threads (LMDB: group commits):
    every successful commit is captured exactly once, conflicts never."""
    store.enable_change_capture()
    base = store.commit([Put("index", b"counter", b"0")])
    threads_count, per_thread = 8, 40
    errors: list[BaseException] = []
    inserted: dict[bytes, int] = {}
    start = threading.Barrier(threads_count)

    def worker(thread: int) -> None:
        try:
            start.wait(WAIT_S)
            for index in range(per_thread):
                key = b"%d/%03d" % (thread, index)
                inserted[key] = store.commit([Put(T, key, b"x" * index)])
                while True:
                    with store.snapshot() as view:  # snapshots are never stale, unlike a cached get
                        current = view.get("index", b"counter")
                    assert current is not None
                    try:
                        store.commit(
                            [Put("index", b"counter", b"%d" % (int(current.value) + 1))],
                            [Expect("index", b"counter", current.version)],
                        )
                        break
                    except VersionConflict:
                        pass
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(thread,)) for thread in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
        assert not thread.is_alive()
    assert not errors
    total = threads_count * per_thread
    captured = all_changes(store, page=100)
    assert [change.sequence for change in captured] == list(range(base, base + 2 * total + 1))
    assert store.last_sequence == base + 2 * total
    counters = []
    for change in captured:
        assert len(change.ops) == 1
        (op,) = change.ops
        assert isinstance(op, Put)
        if op.table == "index":
            counters.append(int(op.value))
        else:
            assert inserted[op.key] == change.sequence
            assert op.value == b"x" * int(op.key.split(b"/")[1])
    assert counters == list(range(total + 1))  # every increment once, in commit order


# -- discard ---------------------------------------------------------------------------------


def test_discard_changes(store: MetadataStore) -> None:
    store.enable_change_capture()
    assert store.discard_changes(5) == 0  # empty log
    sequences = [store.commit([Put(T, b"%d" % index, b"v")]) for index in range(10)]
    assert sequences == list(range(1, 11))
    statistics = store.statistics()
    assert store.discard_changes(4) == 4
    assert [change.sequence for change in all_changes(store)] == list(range(5, 11))
    assert store.last_sequence == 10  # maintenance, not a commit
    assert store.statistics().commits == statistics.commits
    assert store.discard_changes(4) == 0
    assert store.discard_changes(0) == 0
    assert store.commit([Put(T, b"after", b"v")]) == 11
    assert store.discard_changes(10) == 6
    assert all_changes(store) == [Change(11, (Put(T, b"after", b"v"),))]
    assert store.discard_changes(10**30) == 1
    assert store.changes(0) == [] and store.last_sequence == 11
    assert store.commit([Delete(T, b"after")]) == 12  # capture goes on after emptying the log
    assert [change.sequence for change in store.changes(0)] == [12]


def test_discard_changes_only_while_its_expectations_hold(store: MetadataStore) -> None:
    """An owner trims its change log only while it owns the store: with ``expect``,
    ``discard_changes`` checks the versions as ``commit`` does, and removes nothing if
    one does not hold."""
    store.enable_change_capture()
    owner = store.commit([Put(U, b"owner", b"e1")])
    for index in range(5):
        store.commit([Put(T, b"%d" % index, b"v")])
    assert store.discard_changes(2, [Expect(U, b"owner", owner)]) == 2
    store.commit([Put(U, b"owner", b"e2")])  # a newer owner
    kept = all_changes(store)
    with pytest.raises(VersionConflict):
        store.discard_changes(10, [Expect(U, b"owner", owner)])
    assert all_changes(store) == kept
    with pytest.raises(VersionConflict):
        store.discard_changes(10, [Expect(U, b"nobody", 0), Expect(T, b"0", 0)])  # the 2nd fails
    assert all_changes(store) == kept
    for bad in [[Expect("nope", b"k", 0)], [Expect(T, b"", 0)], [Expect(T, b"k", -1)], Expect(T, b"k", 0)]:
        with pytest.raises(InvalidArgument):
            store.discard_changes(10, bad)  # type: ignore[arg-type]
    assert all_changes(store) == kept


def test_discard_a_backlog_of_several_batches(store: MetadataStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lmdb_store, "DISCARD_BATCH_MAX", 7)
    store.enable_change_capture()
    for index in range(50):
        store.commit([Put(T, b"%03d" % index, b"v")])
    assert store.discard_changes(35) == 35  # five full batches, then one that finds nothing
    assert [change.sequence for change in all_changes(store)] == list(range(36, 51))
    assert store.discard_changes(50) == 15
    assert store.changes(0) == []
    assert store.last_sequence == 50


def test_discard_concurrently_with_commits(store: MetadataStore) -> None:
    store.enable_change_capture()
    for index in range(200):
        store.commit([Put(T, b"%03d" % index, b"v")])
    stop = threading.Event()
    errors: list[BaseException] = []

    def committer() -> None:
        try:
            index = 0
            while not stop.is_set() or index < 50:
                store.commit([Put(U, b"%05d" % index, b"w")])
                index += 1
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=committer)
    thread.start()
    removed = 0
    for through in range(20, 201, 20):
        removed += store.discard_changes(through)
    stop.set()
    thread.join(WAIT_S)
    assert not thread.is_alive() and not errors
    assert removed == 200
    remaining = all_changes(store, page=1000)
    assert [change.sequence for change in remaining] == list(range(201, store.last_sequence + 1))


# -- ReadView.sequence -----------------------------------------------------------------------


def test_view_sequence_is_the_last_sequence_at_view_time(store: MetadataStore) -> None:
    with store.snapshot() as view:
        assert view.sequence == 0
    store.commit([Put(T, b"a", b"1")])
    store.commit([Put(T, b"b", b"2")])
    with pytest.raises(VersionConflict):
        store.commit([], [Expect(T, b"a", 0)])
    with store.snapshot() as view:
        assert view.sequence == store.last_sequence == 2
    with pytest.raises(StorageClosed):
        _ = view.sequence  # outside its with block


def test_view_sequence_stays_fixed_while_another_thread_commits(store: MetadataStore) -> None:
    store.commit([Put(T, b"a", b"1")])
    with store.snapshot() as view:
        before = view.sequence
        outcome: list[int] = []
        thread = threading.Thread(target=lambda: outcome.append(store.commit([Put(T, b"a", b"2")])))
        thread.start()
        thread.join(WAIT_S)
        assert not thread.is_alive() and outcome == [before + 1]
        assert store.last_sequence == before + 1
        assert view.sequence == before  # and the view's data agrees with its sequence
        assert view.get(T, b"a") == Versioned(before, b"1")
    with store.snapshot() as view:
        assert view.sequence == before + 1


# -- replicate -------------------------------------------------------------------------------


def test_replicate_into_a_fresh_store(store: MetadataStore) -> None:
    store.enable_change_capture()
    # A snapshot taken at sequence 40, loaded in two pages, then the log after it.
    store.replicate(40, [Put(T, b"a", b"A"), Put(T, b"b", b"B")], [3, 40])
    assert store.last_sequence == 40
    store.replicate(40, [Put(U, b"c", b"C"), Delete(T, b"absent")], [17, 0])
    assert store.last_sequence == 40
    store.replicate(41, [Put(T, b"a", b"A2"), Delete(T, b"b")])  # versions default to 41
    store.replicate(45, [])  # a gap, and no ops: only the sequence moves
    assert store.last_sequence == 45
    assert store.dump() == {
        T: {b"a": Versioned(41, b"A2")},
        U: {b"c": Versioned(17, b"C")},
        "index": {},
    }
    assert store.get(U, b"c") == Versioned(17, b"C")
    with store.snapshot() as view:
        assert view.sequence == 45
    assert store.changes(0) == []  # replicated ops are not captured
    assert store.commit([Put(T, b"b", b"new")], [Expect(T, b"a", 41)]) == 46  # sequence goes on
    assert store.changes(0) == [Change(46, (Put(T, b"b", b"new"),))]


def test_replicate_overwrites_what_the_cache_read(store: MetadataStore) -> None:
    sequence = store.commit([Put(T, b"k", b"old"), Put(T, b"gone", b"x")])
    assert store.get(T, b"k") == Versioned(sequence, b"old")  # cached, for the cached kinds
    assert store.get(T, b"gone") is not None
    store.replicate(sequence + 5, [Put(T, b"k", b"new"), Delete(T, b"gone")], [sequence + 2, 0])
    assert store.get(T, b"k") == Versioned(sequence + 2, b"new")
    assert store.get(T, b"gone") is None
    assert store.get(T, b"k") == Versioned(sequence + 2, b"new")  # and again, from the cache


@pytest.mark.parametrize(
    ("sequence", "ops", "versions", "why"),
    [
        (9, [Put(T, b"k", b"v")], None, "lower"),
        (0, [], None, "sequence"),
        (-1, [Put(T, b"k", b"v")], None, "sequence"),
        (True, [Put(T, b"k", b"v")], None, "sequence"),
        (1 << 64, [Put(T, b"k", b"v")], None, "sequence"),
        (20, [Put(T, b"k", b"v")], [0], "versions[0]"),
        (20, [Put(T, b"k", b"v"), Put(T, b"j", b"v")], [5, 21], "versions[1]"),
        (20, [Put(T, b"k", b"v"), Put(T, b"j", b"v")], [5], "entries"),
        (20, [Put(T, b"k", b"v")], [5, 5], "entries"),
        (20, [Delete(T, b"k")], [], "entries"),
        (20, [Put(T, b"k", b"v")], ["5"], "int"),
        (20, [Delete(T, b"k")], [None], "int"),
        (20, [Put("nope", b"k", b"v")], None, "unknown table"),
        (20, [Put(T, b"", b"v")], None, "key"),
        (20, [Put(T, b"k", "v")], None, "value"),
        (20, Put(T, b"k", b"v"), None, "sequences"),
    ],
)
def test_replicate_refuses_bad_input_and_changes_nothing(
    store: MetadataStore, sequence: object, ops: object, versions: object, why: str
) -> None:
    store.enable_change_capture()
    store.replicate(10, [Put(T, b"k", b"before"), Put(U, b"u", b"u")], [4, 10])
    store.commit([Put(T, b"j", b"j")])  # sequence 11, captured
    before, changes = store.dump(), store.changes(0)
    with pytest.raises(InvalidArgument) as caught:
        store.replicate(sequence, ops, versions)  # type: ignore[arg-type]
    assert why in str(caught.value)
    assert store.dump() == before
    assert store.last_sequence == 11
    assert store.changes(0) == changes


# -- replicate_rows: replicate in bulk -------------------------------------------------------


def test_replicate_rows_into_a_fresh_store(store: MetadataStore) -> None:
    store.enable_change_capture()
    # A snapshot at 40 loaded in two calls (keys in any order), then a log window at 45.
    store.replicate_rows(40, {T: [(b"b", 40, b"B"), (b"a", 3, b"A")]})
    assert store.last_sequence == 40
    store.replicate_rows(40, {U: [[b"c", 17, b"C"]], T: [(b"absent", 0, None)]})
    store.replicate_rows(45, {T: [(b"b", 0, None), (b"a", 41, b"A2"), (b"z", 44, b"Z")], U: []})
    assert store.last_sequence == 45
    assert store.dump() == {
        T: {b"a": Versioned(41, b"A2"), b"z": Versioned(44, b"Z")},
        U: {b"c": Versioned(17, b"C")},
        "index": {},
    }
    assert store.count(T) == 2 and store.get(U, b"c") == Versioned(17, b"C")
    store.replicate_rows(46, {})  # no rows: only the sequence moves
    with store.snapshot() as view:
        assert view.sequence == 46
    assert store.changes(0) == []  # replicated rows are not captured
    assert store.commit([Put(T, b"b", b"new")], [Expect(T, b"a", 41)]) == 47  # sequence goes on


def test_replicate_rows_before_between_and_after_the_keys_there(store: MetadataStore) -> None:
    """Rows past a table's last key are appended (LMDB), the others put where they go:
    the same store either way."""
    store.replicate_rows(10, {T: [(b"k%03d" % i, 5, b"old") for i in range(0, 200, 2)]})
    rows = [(b"k%03d" % i, 11, b"new%d" % i) for i in range(150, 300)] + [(b"a", 12, b"first")]
    rows += [(b"k%03d" % i, 0, None) for i in range(0, 20)]  # deletes, some of absent keys
    store.replicate_rows(20, {T: rows})
    expected = {b"k%03d" % i: Versioned(5, b"old") for i in range(20, 150, 2)}
    expected.update({b"k%03d" % i: Versioned(11, b"new%d" % i) for i in range(150, 300)})
    expected[b"a"] = Versioned(12, b"first")
    assert store.dump()[T] == expected


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(
            st.sampled_from([T, U]),
            st.dictionaries(
                st.binary(min_size=1, max_size=3),
                st.tuples(st.integers(1, 30), st.none() | st.binary(max_size=4)),
                max_size=12,
            ),
        ),
        max_size=5,
    )
)
def test_replicate_rows_is_replicate_of_the_same_operations(
    store_factory: StoreFactory, batches: list[tuple[str, dict[bytes, tuple[int, bytes | None]]]]
) -> None:
    """The bulk path and ``replicate`` of the same operations leave the same store."""
    bulk, one_by_one = store_factory.open(), MemoryMetadataStore(TABLES)
    base = max(30, bulk.last_sequence)  # the store outlives an example: its sequence only grows
    try:
        for index, (table, rows) in enumerate(batches):
            sequence = base + index
            bulk.replicate_rows(sequence, {table: [(key, v, value) for key, (v, value) in rows.items()]})
            ops: list[Operation] = [
                Put(table, key, value) if value is not None else Delete(table, key)
                for key, (_, value) in rows.items()
            ]
            one_by_one.replicate(sequence, ops, [v for v, _ in rows.values()])
            assert bulk.dump() == one_by_one.dump()
            assert bulk.last_sequence == one_by_one.last_sequence
    finally:
        one_by_one.close()
        for key in list(bulk.dump()[T]):  # the next example starts from an empty store
            bulk.replicate_rows(bulk.last_sequence, {T: [(key, 0, None)]})
        for key in list(bulk.dump()[U]):
            bulk.replicate_rows(bulk.last_sequence, {U: [(key, 0, None)]})


@pytest.mark.parametrize(
    ("sequence", "rows", "why"),
    [
        (9, {T: [(b"k", 9, b"v")]}, "lower"),
        (0, {}, "sequence"),
        (True, {T: [(b"k", 1, b"v")]}, "sequence"),
        (1 << 64, {T: [(b"k", 1, b"v")]}, "sequence"),
        (20, {T: [(b"k", 0, b"v")]}, "outside [1, sequence=20]"),
        (20, {T: [(b"k", 21, b"v")]}, "outside [1, sequence=20]"),
        (20, {T: [(b"k", "5", b"v")]}, "not an int"),
        (20, {T: [(b"k", None, None)]}, "not an int"),
        (20, {T: [(b"k", True, b"v")]}, "not an int"),
        (20, {"nope": [(b"k", 5, b"v")]}, "unknown table"),
        (20, {T: [(b"", 5, b"v")]}, "key"),
        (20, {T: [(b"x" * 512, 5, b"v")]}, "key"),
        (20, {T: [("k", 5, b"v")]}, "key must be bytes"),
        (20, {T: [(b"k", 5, "v")]}, "value"),
        (20, {T: [(b"k", 5, b"v"), (b"j", 5, b"v"), (b"k", 6, None)]}, "twice"),
        (20, {T: [(b"k", 5)]}, "(key, version, value)"),
        (20, {T: [b"kv5"]}, "(key, version, value)"),
        (20, {T: b"rows"}, "sequence of"),
        (20, [(T, b"k", 5, b"v")], "map table names"),
        (20, {T: [(b"k%d" % i, 5, b"v") for i in range(100_001)]}, "at most"),
    ],
)
def test_replicate_rows_refuses_bad_input_and_changes_nothing(
    store: MetadataStore, sequence: object, rows: object, why: str
) -> None:
    store.enable_change_capture()
    store.replicate_rows(10, {T: [(b"k", 4, b"before")], U: [(b"u", 10, b"u")]})
    store.commit([Put(T, b"j", b"j")])  # sequence 11, captured
    before, changes = store.dump(), store.changes(0)
    with pytest.raises(InvalidArgument) as caught:
        store.replicate_rows(sequence, rows)  # type: ignore[arg-type]
    assert why in str(caught.value)
    assert store.dump() == before
    assert store.last_sequence == 11
    assert store.changes(0) == changes


def test_replicate_rows_overwrites_what_the_cache_read(store: MetadataStore) -> None:
    sequence = store.commit([Put(T, b"k", b"old"), Put(T, b"gone", b"x")])
    assert store.get(T, b"k") == Versioned(sequence, b"old")  # cached, for the cached kinds
    assert store.get(T, b"gone") is not None
    store.replicate_rows(sequence + 5, {T: [(b"k", sequence + 2, b"new"), (b"gone", 0, None)]})
    assert store.get(T, b"k") == Versioned(sequence + 2, b"new")
    assert store.get(T, b"gone") is None


def test_writes_inside_a_snapshot_and_after_close(store: MetadataStore) -> None:
    store.enable_change_capture()
    store.commit([Put(T, b"k", b"v")])
    with store.snapshot():
        for call in (
            lambda: store.replicate(5, [Put(T, b"k", b"w")]),
            lambda: store.replicate_rows(5, {T: [(b"k", 5, b"w")]}),
            lambda: store.discard_changes(1),
            lambda: store.enable_change_capture(),  # even though it is already enabled
        ):
            with pytest.raises(InvalidArgument):
                call()
        assert len(store.changes(0)) == 1  # reading the log is fine
    assert store.last_sequence == 1 and len(store.changes(0)) == 1
    store.close()
    for call in (
        lambda: store.replicate(1, [Put(T, b"k", b"v")]),
        lambda: store.replicate_rows(1, {T: [(b"k", 1, b"v")]}),
        lambda: store.changes(0),
        lambda: store.encoded_changes(0),
        lambda: store.discard_changes(1),
        lambda: store.enable_change_capture(),
        lambda: store.change_capture_enabled,
    ):
        with pytest.raises(StorageClosed):
            call()


def test_restore_from_a_snapshot_and_the_log(store_factory: StoreFactory) -> None:
    """The restore flow: a snapshot's entries replicated at its sequence (with their
    versions), then the captured changes after it, rebuild exactly the source."""
    source = MemoryMetadataStore(TABLES)
    source.enable_change_capture()
    for index in range(30):
        source.commit([Put(T, b"%02d" % (index % 7), b"v%d" % index), Delete(U, b"%d" % (index % 3))])
        if index % 4 == 0:
            source.commit([Put(U, b"%d" % (index % 3), b"u%d" % index)])
    with source.snapshot() as view:
        at = view.sequence
        entries = {table: view.scan(table) for table in TABLES}
    for index in range(10):  # after the snapshot
        source.commit([Put("index", b"%d" % index, b"i"), Delete(T, b"%02d" % index)])
    target = store_factory.open()
    for table, page in entries.items():
        for first in range(0, len(page), 3):
            chunk = page[first : first + 3]
            target.replicate(
                at,
                [Put(table, key, stored.value) for key, stored in chunk],
                [stored.version for _, stored in chunk],
            )
    replay(target, all_changes(source, after=at))
    assert target.dump() == source.dump()
    assert target.last_sequence == source.last_sequence


# -- LMDB: other handles, other processes, reopen, kill -9, readonly ---------------------------


def test_another_handle_captures_once_one_enabled(store_factory: StoreFactory) -> None:
    if not store_factory.persistent:
        pytest.skip("only LMDB folders can be opened twice")
    first, second = store_factory.open(), store_factory.open()
    second.commit([Put(T, b"early", b"1")])
    first.enable_change_capture()
    assert second.change_capture_enabled
    sequence = second.commit([Put(T, b"k", b"from second")])
    assert first.changes(0) == [Change(sequence, (Put(T, b"k", b"from second"),))]
    first.close()
    second.close()
    reopened = store_factory.open()
    assert reopened.change_capture_enabled  # the flag is persistent
    later = reopened.commit([Delete(T, b"k")])
    assert [change.sequence for change in reopened.changes(0)] == [sequence, later]


def _child_commits(path: str, prefix: bytes, count: int, ready: object, go: object, results: object) -> None:
    """In a spawned process: open the store (never enabling capture), wait, commit."""
    with LmdbMetadataStore(path, TABLES) as store:
        ready.set()  # type: ignore[attr-defined]
        assert go.wait(WAIT_S)  # type: ignore[attr-defined]
        sequences = [store.commit([Put(T, prefix + b"%03d" % index, b"c")]) for index in range(count)]
        results.put((store.change_capture_enabled, sequences))  # type: ignore[attr-defined]


def test_another_process_captures_once_the_flag_is_set(lmdb_path: str) -> None:
    """The child opens the folder before the parent enables capture: it reads the flag in
    each write transaction, so its commits are captured anyway."""
    context = multiprocessing.get_context("spawn")
    ready, go, results = context.Event(), context.Event(), context.Queue()
    with LmdbMetadataStore(lmdb_path, TABLES) as store:
        store.commit([Put(T, b"parent", b"p")])
        child = context.Process(target=_child_commits, args=(lmdb_path, b"child/", 20, ready, go, results))
        child.start()
        try:
            assert ready.wait(WAIT_S)
            store.enable_change_capture()
            go.set()
            enabled, sequences = results.get(timeout=WAIT_S)
            child.join(WAIT_S)
        finally:
            if child.is_alive():
                child.kill()
        assert child.exitcode == 0 and enabled
        captured = store.changes(0)
        assert [change.sequence for change in captured] == sequences == list(range(2, 22))
        for index, change in enumerate(captured):
            assert change.ops == (Put(T, b"child/%03d" % index, b"c"),)


def _child_commits_forever(path: str, prefix: bytes) -> None:
    """In a spawned process: commit until killed."""
    with LmdbMetadataStore(path, TABLES) as store:
        index = 0
        while True:
            store.commit([Put(T, prefix + b"%06d" % index, b"%d" % index), Delete(U, b"%d" % index)])
            index += 1


def test_capture_survives_kill_9(lmdb_path: str) -> None:
    """Commits and their captured changes land in one transaction: after SIGKILL at a
    random point, the log holds exactly the commits that are in the data."""
    with LmdbMetadataStore(lmdb_path, TABLES) as store:
        store.enable_change_capture()
    context = multiprocessing.get_context("spawn")
    for round_number, wanted in enumerate((50, 173)):
        child = context.Process(target=_child_commits_forever, args=(lmdb_path, b"r%d/" % round_number))
        child.start()
        try:
            with LmdbMetadataStore(lmdb_path, TABLES) as store:
                deadline = time.monotonic() + WAIT_S
                while store.last_sequence < wanted * (round_number + 1):
                    assert time.monotonic() < deadline and child.is_alive()
                    time.sleep(0.005)
        finally:
            child.kill()
            child.join(WAIT_S)
        assert child.exitcode == -9
    with LmdbMetadataStore(lmdb_path, TABLES) as store:
        last = store.last_sequence
        captured = all_changes(store, page=1000)
        assert [change.sequence for change in captured] == list(range(1, last + 1))
        for change in captured:
            put = change.ops[0]
            assert isinstance(put, Put)
            assert store.get(T, put.key) == Versioned(change.sequence, put.value)
        restored = MemoryMetadataStore(TABLES)
        replay(restored, captured)
        assert restored.dump() == store.dump()


def test_discard_more_than_one_real_batch(tmp_path: Path) -> None:
    count = lmdb_store.DISCARD_BATCH_MAX + 1234
    with LmdbMetadataStore(os.fspath(tmp_path / "big"), TABLES, durable=False) as store:
        store.enable_change_capture()
        for index in range(count):
            store.commit([Put(T, b"%06d" % (index % 100), b"v")])
        assert store.discard_changes(count - 10) == count - 10
        assert [change.sequence for change in store.changes(0)] == list(range(count - 9, count + 1))
        assert store.last_sequence == count


def test_readonly_store(lmdb_path: str) -> None:
    with LmdbMetadataStore(lmdb_path, TABLES) as writer:
        writer.commit([Put(T, b"k", b"v")])
        with LmdbMetadataStore(lmdb_path, TABLES, readonly=True) as reader:
            assert not reader.change_capture_enabled
            with pytest.raises(InvalidArgument):
                reader.enable_change_capture()
            writer.enable_change_capture()
            reader.enable_change_capture()  # already enabled: nothing to write
            assert reader.change_capture_enabled
            sequence = writer.commit([Delete(T, b"k")])
            assert reader.changes(0) == [Change(sequence, (Delete(T, b"k"),))]
            for call in (
                lambda: reader.discard_changes(sequence),
                lambda: reader.replicate(sequence + 1, [Put(T, b"k", b"v")]),
            ):
                with pytest.raises(InvalidArgument):
                    call()
            assert writer.last_sequence == sequence and len(writer.changes(0)) == 1


def test_layout_of_the_change_log(lmdb_path: str) -> None:
    import lmdb
    import msgpack

    with LmdbMetadataStore(lmdb_path, TABLES) as store:
        store.enable_change_capture()
        sequence = store.commit([Put(T, b"k", b"v"), Delete(U, b"d")])
    with lmdb.open(lmdb_path, max_dbs=16, readonly=True) as env:
        changes = env.open_db(lmdb_store.CHANGES_DB, create=False)
        internal = env.open_db(lmdb_store.INTERNAL_DB, create=False)
        with env.begin() as txn:
            assert txn.get(lmdb_store.CAPTURE_KEY, db=internal) is not None
            entries = list(txn.cursor(db=changes))
    assert entries == [
        (
            sequence.to_bytes(8, "big"),
            msgpack.packb([[T, b"k", b"v"], [U, b"d", None]], use_bin_type=True),
        )
    ]
