"""The metadata store contract (``slts.metadata.store``), run against every store."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

import pytest

from slts.errors import InvalidArgument, MetadataError, StorageClosed, VersionConflict
from slts.metadata import KEY_BYTES_MAX, Delete, Expect, MetadataStore, Put, Versioned, prefix_stop
from slts.metadata.delegating import DelegatingStore
from slts.metadata.faulty_store import FaultyMetadataStore
from slts.metadata.store import SCAN_LIMIT_DEFAULT, Row, scan_all

from .conftest import TABLES, StoreFactory

T = TABLES[0]
U = TABLES[1]


def _view_count(store: MetadataStore, table: str) -> int:
    with store.snapshot() as view:
        return view.count(table)


def put_many(store: MetadataStore, table: str, keys: list[bytes]) -> int:
    return store.commit([Put(table, key, b"v:" + key) for key in keys])


# -- basic reads and writes -----------------------------------------------------------------


def test_put_get_delete(store: MetadataStore) -> None:
    assert store.get(T, b"k") is None
    sequence = store.commit([Put(T, b"k", b"one")])
    assert store.get(T, b"k") == Versioned(sequence, b"one")
    assert store.get(U, b"k") is None  # tables are separate
    replaced = store.commit([Put(T, b"k", b"two")])
    assert replaced == sequence + 1
    assert store.get(T, b"k") == Versioned(replaced, b"two")
    deleted = store.commit([Delete(T, b"k")])
    assert store.get(T, b"k") is None
    assert store.commit([Delete(T, b"never-there")]) == deleted + 1  # deleting absent is allowed
    assert store.get(T, b"x" * KEY_BYTES_MAX) is None


def test_values_may_be_empty_or_large(store: MetadataStore) -> None:
    big = bytes(range(256)) * 4096
    sequence = store.commit([Put(T, b"empty", b""), Put(T, b"big", big)])
    assert store.get(T, b"empty") == Versioned(sequence, b"")
    assert store.get(T, b"big") == Versioned(sequence, big)


def test_versions_are_the_commit_sequence(store: MetadataStore) -> None:
    assert store.last_sequence == 0
    first = store.commit([Put(T, b"a", b"1"), Put(U, b"b", b"2")])
    assert first == 1 and store.last_sequence == 1
    assert store.get(T, b"a").version == store.get(U, b"b").version == first
    second = store.commit([Put(T, b"c", b"3")])
    assert second == 2 and store.last_sequence == 2
    assert store.get(T, b"a").version == first  # untouched keys keep their version


def test_versions_never_reused_after_delete_and_put_again(store: MetadataStore) -> None:
    seen = set()
    for _ in range(5):
        put = store.commit([Put(T, b"k", b"same")])
        seen.add(store.get(T, b"k").version)
        store.commit([Delete(T, b"k")])
        assert put in seen
    assert len(seen) == 5
    assert store.commit([Put(T, b"k", b"same")]) > max(seen)


def test_empty_commit_takes_a_sequence_and_checks_expectations(store: MetadataStore) -> None:
    sequence = store.commit([Put(T, b"k", b"v")])
    assert store.commit([], [Expect(T, b"k", sequence)]) == sequence + 1
    with pytest.raises(VersionConflict):
        store.commit([], [Expect(T, b"k", 0)])
    assert store.last_sequence == sequence + 1


def test_operations_apply_in_order(store: MetadataStore) -> None:
    sequence = store.commit([Put(T, b"a", b"1"), Delete(T, b"a"), Delete(T, b"b"), Put(T, b"b", b"2")])
    assert store.get(T, b"a") is None
    assert store.get(T, b"b") == Versioned(sequence, b"2")


# -- conditional commits --------------------------------------------------------------------


def test_failing_expectation_applies_nothing(store: MetadataStore) -> None:
    base = store.commit([Put(T, b"a", b"1"), Put(U, b"b", b"2")])
    before = store.dump()
    with pytest.raises(VersionConflict) as caught:
        store.commit(
            [Put(T, b"a", b"changed"), Delete(U, b"b"), Put(T, b"new", b"x")],
            [Expect(T, b"a", base), Expect(U, b"b", base + 7)],
        )
    assert caught.value.table == U and caught.value.key == b"b"
    assert caught.value.expected == base + 7 and caught.value.actual == base
    assert store.dump() == before
    assert store.last_sequence == base  # a failed commit takes no sequence
    assert store.statistics().conflicts == 1


def test_expect_version_zero_means_absent(store: MetadataStore) -> None:
    created = store.commit([Put(T, b"k", b"v")], [Expect(T, b"k", 0)])
    with pytest.raises(VersionConflict) as caught:
        store.commit([Put(T, b"k", b"again")], [Expect(T, b"k", 0)])
    assert caught.value.actual == created
    store.commit([Delete(T, b"k")], [Expect(T, b"k", created)])
    recreated = store.commit([Put(T, b"k", b"again")], [Expect(T, b"k", 0)])
    assert store.get(T, b"k") == Versioned(recreated, b"again")


def test_expectations_on_keys_not_written(store: MetadataStore) -> None:
    guard = store.commit([Put(U, b"guard", b"g")])
    done = store.commit([Put(T, b"k", b"v")], [Expect(U, b"guard", guard), Expect(U, b"missing", 0)])
    assert store.get(T, b"k").version == done
    assert store.get(U, b"guard").version == guard


def test_two_handles_on_one_folder_conflict(store_factory: StoreFactory) -> None:
    if not store_factory.persistent:
        pytest.skip("only LMDB folders can be opened twice")
    first, second = store_factory.open(), store_factory.open()
    created = first.commit([Put(T, b"k", b"first")])
    assert second.get(T, b"k") == Versioned(created, b"first")
    updated = second.commit([Put(T, b"k", b"second")], [Expect(T, b"k", created)])
    assert first.last_sequence == updated
    with pytest.raises(VersionConflict):
        first.commit([Put(T, b"k", b"stale")], [Expect(T, b"k", created)])
    current = first.get(T, b"k")
    assert current is not None and current.version == updated  # a cache evicts on conflict
    final = first.commit([Put(T, b"k", b"fresh")], [Expect(T, b"k", current.version)])
    with second.snapshot() as view:  # snapshots are never cached: a cached get may be stale
        assert view.get(T, b"k") == Versioned(final, b"fresh")


# -- floor -----------------------------------------------------------------------------------


def test_floor(store: MetadataStore) -> None:
    assert store.floor(T, b"anything") is None  # empty table
    sequence = put_many(store, T, [b"b", b"d", b"d\x00", b"f"])
    entry = lambda key: (key, Versioned(sequence, b"v:" + key))
    assert store.floor(T, b"a") is None
    assert store.floor(T, b"b") == entry(b"b")
    assert store.floor(T, b"c") == entry(b"b")
    assert store.floor(T, b"d") == entry(b"d")
    assert store.floor(T, b"d\x00\x00") == entry(b"d\x00")
    assert store.floor(T, b"e\xff") == entry(b"d\x00")
    assert store.floor(T, b"zzz") == entry(b"f")
    assert store.floor(T, b"") is None
    assert store.floor(U, b"zzz") is None  # other table empty


def test_floor_lowest_bound(store: MetadataStore) -> None:
    sequence = put_many(store, T, [b"a/1", b"b/1", b"b/5"])
    assert store.floor(T, b"b/4", lowest=b"b/") == (b"b/1", Versioned(sequence, b"v:b/1"))
    assert store.floor(T, b"b/0", lowest=b"b/") is None  # greatest <= key is a/1, below lowest
    assert store.floor(T, b"b/1", lowest=b"b/1") == (b"b/1", Versioned(sequence, b"v:b/1"))
    assert store.floor(T, b"b/1", lowest=b"b/2") is None  # lowest above key
    assert store.floor(T, b"b/9", lowest=b"b/5") == (b"b/5", Versioned(sequence, b"v:b/5"))


def test_floor_with_bounds_longer_than_any_key(store: MetadataStore) -> None:
    longest = b"k" * KEY_BYTES_MAX
    sequence = put_many(store, T, [longest, b"k" * 10, b"l"])
    assert store.floor(T, longest + b"\x00") == (longest, Versioned(sequence, b"v:" + longest))
    assert store.floor(T, b"k" * (KEY_BYTES_MAX + 40)) == (
        longest,
        Versioned(sequence, b"v:" + longest),
    )
    assert store.floor(T, b"k" * (KEY_BYTES_MAX - 1) + b"\x00" * 9)[0] == b"k" * 10


# -- scan ------------------------------------------------------------------------------------


def test_scan_forward_reverse_limit_stop(store: MetadataStore) -> None:
    keys = [b"a", b"b", b"b\x00", b"c", b"d"]
    put_many(store, T, keys)
    put_many(store, U, [b"zz"])
    names = lambda entries: [key for key, _ in entries]
    assert names(store.scan(T)) == keys
    assert names(store.scan(T, reverse=True)) == keys[::-1]
    assert names(store.scan(T, b"b", b"d")) == [b"b", b"b\x00", b"c"]
    assert names(store.scan(T, b"b", b"d", reverse=True)) == [b"c", b"b\x00", b"b"]
    assert names(store.scan(T, b"b\x00\x00")) == [b"c", b"d"]
    assert names(store.scan(T, limit=2)) == [b"a", b"b"]
    assert names(store.scan(T, limit=2, reverse=True)) == [b"d", b"c"]
    assert names(store.scan(T, b"c", b"c")) == []
    assert names(store.scan(T, b"d", b"a")) == []
    assert names(store.scan(T, b"e")) == []
    assert names(store.scan(T, b"", b"a")) == []
    assert names(store.scan(T, b"", b"a\x00", reverse=True)) == [b"a"]
    assert names(store.scan(T, b"zz", None, reverse=True)) == []
    for _, value in store.scan(T):
        assert value.version >= 1


def test_scan_pages_forward_and_backward(store: MetadataStore) -> None:
    keys = sorted(b"%03d" % i for i in range(0, 300, 2))
    for chunk in range(0, len(keys), 50):
        put_many(store, T, keys[chunk : chunk + 50])
    forward, start = [], b""
    while True:
        page = store.scan(T, start, None, limit=7)
        forward += [key for key, _ in page]
        if len(page) < 7:
            break
        start = page[-1][0] + b"\x00"
    assert forward == keys
    backward, stop = [], None
    while True:
        page = store.scan(T, b"", stop, limit=7, reverse=True)
        backward += [key for key, _ in page]
        if len(page) < 7:
            break
        stop = page[-1][0]
    assert backward == keys[::-1]


def test_scan_paging_past_a_longest_key(store: MetadataStore) -> None:
    longest = b"m" * KEY_BYTES_MAX
    put_many(store, T, [b"a", longest, b"n"])
    page = store.scan(T, limit=2)
    assert [key for key, _ in page] == [b"a", longest]
    rest = store.scan(T, page[-1][0] + b"\x00", limit=2)  # a start longer than any key
    assert [key for key, _ in rest] == [b"n"]
    assert [key for key, _ in store.scan(T, b"", longest + b"\x00", reverse=True)] == [
        longest,
        b"a",
    ]
    assert [key for key, _ in store.scan(T, longest + b"\x00", None, reverse=True)] == [b"n"]


def test_scan_all_reads_past_the_scan_limit_in_pages(store: MetadataStore) -> None:
    keys = sorted(b"%05d" % i for i in range(SCAN_LIMIT_DEFAULT * 2 + 3))
    for chunk in range(0, len(keys), 500):
        put_many(store, T, keys[chunk : chunk + 500])
    assert len(store.scan(T)) == SCAN_LIMIT_DEFAULT  # one scan stops at its limit
    with store.snapshot() as view:
        assert [key for key, _ in scan_all(view, T)] == keys
        assert [key for key, _ in scan_all(view, T, b"00007", b"01500", page=7)] == keys[7:1500]
        assert list(scan_all(view, T, b"99999")) == []


def test_iterate_and_prefix_stop(store: MetadataStore) -> None:
    keys = [b"seg/%04d" % i for i in range(25)]
    put_many(store, T, [*keys, b"seg0", b"sef", b"seg\xff\xff"])
    prefix = b"seg/"
    assert [key for key, _ in store.iterate(T, prefix, prefix_stop(prefix), page=4)] == keys
    assert [key for key, _ in store.iterate(T, b"seg/0020", None, page=3)][:5] == keys[20:25]
    assert len(list(store.iterate(T, page=1))) == 28
    assert [key for key, _ in store.iterate(T, b"seg", prefix_stop(b"seg"))][-1] == b"seg\xff\xff"


def test_prefix_stop() -> None:
    assert prefix_stop(b"abc") == b"abd"
    assert prefix_stop(b"a\xff") == b"b"
    assert prefix_stop(b"a\xfe\xff\xff") == b"a\xff"
    assert prefix_stop(b"\xff\xff") is None
    assert prefix_stop(b"") is None


# -- snapshots -------------------------------------------------------------------------------


def test_snapshot_does_not_see_a_commit_made_while_open(store: MetadataStore) -> None:
    first = store.commit([Put(T, b"a", b"1"), Put(T, b"c", b"3")])
    with store.snapshot() as view:
        assert view.get(T, b"a") == Versioned(first, b"1")
        # Another thread commits while the view is open; it must neither block nor show.
        result: list[int] = []
        writer = threading.Thread(
            target=lambda: result.append(
                store.commit([Put(T, b"a", b"2"), Put(T, b"b", b"new"), Delete(T, b"c")])
            )
        )
        writer.start()
        writer.join()
        assert result and result[0] == first + 1
        assert view.get(T, b"a") == Versioned(first, b"1")
        assert view.get(T, b"b") is None
        assert view.floor(T, b"b") == (b"a", Versioned(first, b"1"))
        assert [key for key, _ in view.scan(T)] == [b"a", b"c"]
    assert store.get(T, b"a") == Versioned(first + 1, b"2")
    assert [key for key, _ in store.scan(T)] == [b"a", b"b"]


def test_snapshot_view_is_dead_after_its_block(store: MetadataStore) -> None:
    with store.snapshot() as view:
        assert view.get(T, b"x") is None
    with pytest.raises(StorageClosed):
        view.get(T, b"x")
    with pytest.raises(StorageClosed):
        view.count(T)


def test_commit_inside_own_snapshot_block_is_refused(store: MetadataStore) -> None:
    with store.snapshot() as view:
        assert view.get(T, b"k") is None
        with pytest.raises(InvalidArgument):
            store.commit([Put(T, b"k", b"v")])
        with store.snapshot() as nested:  # nesting reads is fine
            assert nested.get(T, b"k") is None
    assert store.commit([Put(T, b"k", b"v")]) == 1


def test_dump(store: MetadataStore) -> None:
    first = store.commit([Put(T, b"a", b"1"), Put(U, b"b", b"2")])
    assert store.dump() == {
        T: {b"a": Versioned(first, b"1")},
        U: {b"b": Versioned(first, b"2")},
        TABLES[2]: {},
    }


# -- counts ----------------------------------------------------------------------------------


def counts(store: MetadataStore) -> dict[str, int]:
    """Every table's ``count``, read in one snapshot."""
    with store.snapshot() as view:
        return {table: view.count(table) for table in TABLES}


def test_count_follows_puts_and_deletes(store: MetadataStore) -> None:
    assert counts(store) == {table: 0 for table in TABLES}
    store.commit([Put(T, b"a", b"1"), Put(T, b"b", b"2"), Put(T, b"c", b"3"), Put(U, b"a", b"4")])
    assert counts(store) == {T: 3, U: 1, TABLES[2]: 0}
    store.commit([Put(T, b"a", b"replaced"), Put(T, b"b", b"again")])  # no new keys
    assert store.count(T) == 3
    store.commit([Delete(T, b"b"), Delete(T, b"never-there"), Delete(U, b"a")])
    assert counts(store) == {T: 2, U: 0, TABLES[2]: 0}
    store.commit([Put(T, b"d", b"5"), Delete(T, b"d"), Delete(T, b"e"), Put(T, b"e", b"6")])
    assert store.count(T) == 3  # the ops of one commit apply in order: d gone, e there
    assert store.count(T) == len(store.dump()[T])


def test_count_of_a_table_larger_than_a_read_page(store: MetadataStore) -> None:
    keys = [b"k%05d" % i for i in range(2_500)]  # two and a half pages of scan
    put_many(store, T, keys)
    assert store.count(T) == 2_500
    store.commit([Delete(T, key) for key in keys[::2]])
    assert store.count(T) == 1_250 == sum(1 for _ in store.iterate(T))


def test_count_is_unchanged_by_a_failed_commit(store: MetadataStore) -> None:
    base = store.commit([Put(T, b"a", b"1")])
    with pytest.raises(VersionConflict):
        store.commit([Put(T, b"b", b"2"), Put(U, b"c", b"3"), Delete(T, b"a")], [Expect(T, b"a", base + 1)])
    with pytest.raises(InvalidArgument):
        store.commit([Put(T, b"b", b"2"), Put(T, b"", b"empty key")])
    assert counts(store) == {T: 1, U: 0, TABLES[2]: 0}


def test_count_in_commits_of_one_group_where_some_fail(store: MetadataStore) -> None:
    """Threads commit together (LMDB runs them in shared write transactions): each claims a
    key that only one thread may create; the count is exactly the successful commits' keys."""
    threads_count, rounds = 8, 20
    applied: list[int] = []
    lock = threading.Lock()

    def worker(worker_id: int) -> None:
        for round_id in range(rounds):
            try:
                store.commit(
                    [
                        Put(T, b"claim-%d" % round_id, b"%d" % worker_id),
                        Put(U, b"w%d-r%d" % (worker_id, round_id), b""),
                    ],
                    [Expect(T, b"claim-%d" % round_id, 0)],
                )
            except VersionConflict:
                continue
            with lock:
                applied.append(round_id)

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads_count)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    assert sorted(applied) == list(range(rounds))  # one winner per round
    assert counts(store) == {T: rounds, U: rounds, TABLES[2]: 0}


def test_count_after_replicate(store: MetadataStore) -> None:
    store.replicate(10, [Put(T, b"a", b"A"), Put(T, b"b", b"B"), Put(U, b"c", b"C")], [3, 10, 7])
    assert counts(store) == {T: 2, U: 1, TABLES[2]: 0}
    store.replicate(10, [Delete(T, b"a"), Delete(T, b"absent"), Put(T, b"b", b"B2")])  # same sequence
    store.replicate(12, [Put(TABLES[2], b"x", b"X")])
    assert counts(store) == {T: 1, U: 1, TABLES[2]: 1}


def test_count_counts_no_change_log_entries(store: MetadataStore) -> None:
    store.enable_change_capture()
    for i in range(30):
        store.commit([Put(T, b"k%d" % (i % 3), b"%d" % i)])  # 30 captured changes, 3 keys
    assert len(store.changes(0, limit=100)) == 30
    assert counts(store) == {T: 3, U: 0, TABLES[2]: 0}
    store.discard_changes(30)
    assert store.count(T) == 3


def test_count_in_a_snapshot_while_commits_land(store: MetadataStore) -> None:
    put_many(store, T, [b"a", b"b", b"c"])
    with store.snapshot() as view:
        assert (view.count(T), view.count(U)) == (3, 0)
        writer = threading.Thread(
            target=lambda: store.commit(
                [Delete(T, b"a"), Delete(T, b"b"), Put(U, b"x", b"1"), Put(U, b"y", b"2")]
            )
        )
        writer.start()
        writer.join()
        assert store.count(U) == 2  # landed: a read of its own sees it ...
        assert (view.count(T), view.count(U)) == (3, 0)  # ... the open view does not
    assert counts(store) == {T: 1, U: 2, TABLES[2]: 0}


def test_count_of_another_handles_commits(store_factory: StoreFactory) -> None:
    if not store_factory.persistent:
        pytest.skip("only LMDB folders can be opened twice")
    first, second = store_factory.open(), store_factory.open()
    put_many(first, T, [b"a", b"b"])
    assert second.count(T) == 2
    second.commit([Delete(T, b"a")])
    assert first.count(T) == 1
    first.close()
    reopened = store_factory.open()
    assert reopened.count(T) == 1


def test_count_passes_through_the_fault_wrapper(store: MetadataStore) -> None:
    faulty = FaultyMetadataStore(store, seed=7)
    faulty.commit([Put(T, b"a", b"1"), Put(U, b"b", b"2")])
    assert faulty.count(T) == store.count(T) == 1
    with faulty.snapshot() as view:
        assert view.count(U) == 1
    faulty.crash_at(1, landed=True)
    with pytest.raises(MetadataError):
        faulty.commit([Put(T, b"c", b"3")])
    with pytest.raises(MetadataError):
        faulty.count(T)  # a dead process reads nothing
    assert store.count(T) == 2  # the crash landed the commit


def test_replicate_rows_passes_through_the_fault_wrapper(store: MetadataStore) -> None:
    """The wrappers forward ``replicate_rows`` (the delegating store's, the fault wrapper's
    with its hooks and its death), and a store without a bulk path gets the default."""
    faulty = FaultyMetadataStore(store, seed=7)
    seen: list[int] = []
    faulty.before("replicate_rows", lambda: seen.append(store.last_sequence))
    faulty.replicate_rows(5, {T: [(b"a", 5, b"1")]})
    assert seen == [0] and faulty.calls["replicate_rows"] == 1
    assert store.get(T, b"a") == Versioned(5, b"1")
    faulty.kill()
    with pytest.raises(MetadataError):
        faulty.replicate_rows(6, {T: [(b"b", 6, b"2")]})
    assert store.get(T, b"b") is None and store.last_sequence == 5

    class Plain(DelegatingStore):  # replicate_rows is the ABC's default, over replicate
        def replicate_rows(self, sequence: int, rows: Mapping[str, Sequence[Row]]) -> None:
            MetadataStore.replicate_rows(self, sequence, rows)

    Plain(store).replicate_rows(7, {T: [(b"a", 0, None), (b"c", 7, b"3")], U: [(b"d", 2, b"4")]})
    assert store.dump()[T] == {b"c": Versioned(7, b"3")} and store.get(U, b"d") == Versioned(2, b"4")
    with pytest.raises(InvalidArgument, match="twice"):
        Plain(store).replicate_rows(8, {T: [(b"x", 8, b"1"), (b"x", 8, None)]})


# -- arguments and life cycle --------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.get("nope", b"k"),
        lambda s: s.get(T, "k"),
        lambda s: s.floor("nope", b"k"),
        lambda s: s.floor(T, "k"),
        lambda s: s.floor(T, b"k", lowest="a"),
        lambda s: s.scan("nope"),
        lambda s: s.scan(T, "a"),
        lambda s: s.scan(T, b"a", "b"),
        lambda s: s.scan(T, limit=0),
        lambda s: s.count("nope"),
        lambda s: s.count(T.encode()),
        lambda s: _view_count(s, "nope"),
        lambda s: s.commit([Put("nope", b"k", b"v")]),
        lambda s: s.commit([Put(T, "k", b"v")]),
        lambda s: s.commit([Put(T, b"k", "v")]),
        lambda s: s.commit([Put(T, bytearray(b"k"), b"v")]),
        lambda s: s.commit([Put(T, b"", b"v")]),
        lambda s: s.commit([Put(T, b"k" * (KEY_BYTES_MAX + 1), b"v")]),
        lambda s: s.commit([Delete(T, "k")]),
        lambda s: s.commit([("put", T, b"k", b"v")]),
        lambda s: s.commit(Put(T, b"k", b"v")),
        lambda s: s.commit([], [Expect(T, b"k", -1)]),
        lambda s: s.commit([], [Expect("nope", b"k", 0)]),
        lambda s: s.commit([], [Expect(T, "k", 0)]),
    ],
)
def test_invalid_arguments(store: MetadataStore, call) -> None:
    with pytest.raises(InvalidArgument):
        call(store)
    assert store.last_sequence == 0
    assert store.dump() == {table: {} for table in TABLES}


@pytest.mark.parametrize("tables", [(), ("a", "a"), ("",), ("__slts_x",), "abc", (b"a",)])
def test_invalid_tables(store_factory: StoreFactory, tables) -> None:
    with pytest.raises(InvalidArgument):
        store_factory.open(tables)


def test_closed_store_raises(store: MetadataStore) -> None:
    store.commit([Put(T, b"k", b"v")])
    store.close()
    store.close()  # idempotent
    for call in (
        lambda: store.get(T, b"k"),
        lambda: store.floor(T, b"k"),
        lambda: store.scan(T),
        lambda: store.commit([Put(T, b"k", b"v")]),
        lambda: store.last_sequence,
        lambda: store.snapshot().__enter__(),
        lambda: list(store.iterate(T)),
        lambda: store.count(T),
    ):
        with pytest.raises(StorageClosed):
            call()


def test_persistence_across_reopen(store_factory: StoreFactory) -> None:
    if not store_factory.persistent:
        pytest.skip("memory stores forget on close")
    store = store_factory.open()
    first = store.commit([Put(T, b"a", b"1"), Put(U, b"b", b"2")])
    second = store.commit([Delete(T, b"a")])
    store.close()
    reopened = store_factory.open()
    assert reopened.last_sequence == second
    assert reopened.dump()[U] == {b"b": Versioned(first, b"2")}
    assert reopened.get(T, b"a") is None
    assert reopened.commit([Put(T, b"a", b"1")]) == second + 1  # the sequence continues


def test_statistics_count(store: MetadataStore) -> None:
    base = store.statistics()
    sequence = store.commit([Put(T, b"k", b"v")])
    with pytest.raises(VersionConflict):
        store.commit([], [Expect(T, b"k", sequence + 1)])
    store.get(T, b"k")
    store.get(T, b"k")
    stats = store.statistics()
    assert stats.commits == base.commits + 1
    assert stats.conflicts == base.conflicts + 1
    assert stats.reads + stats.cache_hits >= base.reads + 2
