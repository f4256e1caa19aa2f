"""``DeleteKeys`` (a batch of keys removed by one operation) and ``ReadView.scan_values``
(a scan without versions), on every store.

Contract (``slts.metadata.store``): the named keys of one table go, in the commit's order
among its other operations, absent ones doing nothing; bad input (a key ``Delete`` would
refuse, keys not in a tuple, more keys than a commit's bound) raises ``InvalidArgument``
and changes nothing; the change log records one ``Delete`` per named key, so replaying a
captured change gives exactly the committed state; a cache never serves a value a batch
removed, below and above its bulk threshold. ``scan_values`` is ``scan`` without the
versions, and refuses a damaged stored value as ``scan`` does.
"""

from __future__ import annotations

import os

import pytest

from slts.errors import InvalidArgument, MetadataCorrupted, VersionConflict
from slts.metadata import (
    KEY_BYTES_MAX,
    CachedMetadataStore,
    Delete,
    DeleteKeys,
    Expect,
    LmdbMetadataStore,
    MemoryMetadataStore,
    MetadataStore,
    Put,
    Versioned,
)
from slts.metadata._checks import COMMIT_ITEMS_MAX

from .conftest import TABLES

T = TABLES[0]
U = TABLES[1]


def _fill(store: MetadataStore, table: str, keys: list[bytes]) -> int:
    return store.commit([Put(table, key, b"v:" + key) for key in keys])


def test_removes_exactly_the_named_keys(store: MetadataStore) -> None:
    keys = [b"a", b"b", b"c", b"d"]
    first = _fill(store, T, keys)
    _fill(store, U, keys)
    sequence = store.commit([DeleteKeys(T, (b"b", b"d", b"zz"))])  # b"zz" is absent: nothing
    assert sequence == first + 2
    assert store.dump()[T] == {b"a": Versioned(first, b"v:a"), b"c": Versioned(first, b"v:c")}
    assert sorted(store.dump()[U]) == keys  # other tables untouched
    assert store.commit([DeleteKeys(T, ())]) == sequence + 1  # no key: a sequence, no change
    assert sorted(store.dump()[T]) == [b"a", b"c"]


def test_operations_apply_in_order(store: MetadataStore) -> None:
    _fill(store, T, [b"a", b"b", b"c"])
    sequence = store.commit(
        [Put(T, b"x", b"before"), DeleteKeys(T, (b"a", b"x", b"a")), Put(T, b"a", b"after")]
    )
    assert store.dump()[T] == {
        b"a": Versioned(sequence, b"after"),
        b"b": Versioned(1, b"v:b"),
        b"c": Versioned(1, b"v:c"),
    }
    assert store.get(T, b"x") is None


def test_expectations_guard_a_batch(store: MetadataStore) -> None:
    sequence = _fill(store, T, [b"a", b"b"])
    with pytest.raises(VersionConflict):
        store.commit([DeleteKeys(T, (b"a", b"b"))], [Expect(T, b"a", sequence + 3)])
    assert sorted(store.dump()[T]) == [b"a", b"b"]
    store.commit([DeleteKeys(T, (b"a", b"b"))], [Expect(T, b"a", sequence)])
    assert store.dump()[T] == {}


@pytest.mark.parametrize(
    "bad",
    [
        DeleteKeys("nope", (b"a",)),
        DeleteKeys(T, [b"a"]),  # type: ignore[arg-type]  # a list, not a tuple
        DeleteKeys(T, (b"a", b"")),  # an empty key
        DeleteKeys(T, (b"a", "b")),  # type: ignore[arg-type]
        DeleteKeys(T, (b"k" * (KEY_BYTES_MAX + 1),)),
        DeleteKeys(T, (b"a",) * COMMIT_ITEMS_MAX),  # with the put: one item past the bound
    ],
    ids=["table", "list", "empty-key", "str-key", "long-key", "too-many"],
)
def test_bad_input_raises_and_changes_nothing(store: MetadataStore, bad: DeleteKeys) -> None:
    sequence = _fill(store, T, [b"a", b"b"])
    with pytest.raises(InvalidArgument):
        store.commit([Put(T, b"x", b"x"), bad])
    assert store.last_sequence == sequence
    assert sorted(store.dump()[T]) == [b"a", b"b"]


def test_replicate_takes_per_key_operations_only(store: MetadataStore) -> None:
    with pytest.raises(InvalidArgument):
        store.replicate(5, [DeleteKeys(T, (b"a",))])  # type: ignore[list-item]
    assert store.last_sequence == 0


def test_captured_as_its_keys_and_replayed_exactly(store: MetadataStore) -> None:
    store.enable_change_capture()
    _fill(store, T, [b"a", b"b", b"c"])
    sequence = store.commit([Put(T, b"a1", b"x"), DeleteKeys(T, (b"c", b"a1", b"q")), Delete(U, b"q")])
    [change] = store.changes(sequence - 1)
    assert change.ops == (
        Put(T, b"a1", b"x"),
        Delete(T, b"c"),
        Delete(T, b"a1"),
        Delete(T, b"q"),  # named, absent: captured as a Delete is
        Delete(U, b"q"),
    )
    replica = MemoryMetadataStore(TABLES)
    for captured in store.changes(0):
        replica.replicate(captured.sequence, captured.ops)
    assert replica.dump() == store.dump()


@pytest.mark.parametrize("bulk_deletes_min", [1, 64])
def test_cache_never_serves_a_value_a_batch_removed(bulk_deletes_min: int) -> None:
    """Above the bulk threshold (1) the keys are evicted, below it (64) cached as absent;
    either way a read sees the store's state, and a put after the batch is served."""
    inner = MemoryMetadataStore(TABLES)
    store = CachedMetadataStore(inner, capacity=8, bulk_deletes_min=bulk_deletes_min)
    _fill(store, T, [b"a", b"b", b"c"])
    assert store.get(T, b"b") is not None  # cached
    sequence = store.commit([Put(T, b"c", b"new"), DeleteKeys(T, (b"a", b"b", b"c")), Put(T, b"b", b"again")])
    for key in (b"a", b"b", b"c"):
        assert store.get(T, key) == inner.get(T, key), key
    assert store.get(T, b"b") == Versioned(sequence, b"again")


def test_scan_values_is_scan_without_versions(store: MetadataStore) -> None:
    keys = [b"a", b"b", b"ba", b"c", b"d"]
    _fill(store, T, keys)
    with store.snapshot() as view:
        for start, stop, limit in [(b"", None, 10), (b"b", b"c", 10), (b"a\x00", None, 2), (b"x", None, 3)]:
            expected = [(key, stored.value) for key, stored in view.scan(T, start, stop, limit)]
            assert view.scan_values(T, start, stop, limit) == expected
        assert view.scan_values(T, b"c", b"b") == []
        with pytest.raises(InvalidArgument):
            view.scan_values(T, b"a", b"b", 0)
        with pytest.raises(InvalidArgument):
            view.scan_values("nope")


def test_scan_values_refuses_a_damaged_value(tmp_path: object) -> None:
    """A stored value without its version header is corruption for ``scan_values`` as
    for ``scan`` (written under the store, through LMDB itself)."""
    import lmdb

    folder = os.fspath(tmp_path)  # type: ignore[call-overload]
    store = LmdbMetadataStore(folder, TABLES, durable=False)
    _fill(store, T, [b"a"])
    store.close()
    env = lmdb.open(folder, max_dbs=16)
    with env.begin(write=True) as txn:
        txn.put(b"b", b"\x00" * 3, db=env.open_db(T.encode(), txn=txn))
        txn.put(b"c", b"\x00" * 8 + b"v", db=env.open_db(T.encode(), txn=txn))
    env.close()
    store = LmdbMetadataStore(folder, TABLES, durable=False, check="never")
    try:
        with store.snapshot() as view:
            assert view.scan_values(T, b"a", b"b") == [(b"a", b"v:a")]
            for start in (b"b", b"c"):
                with pytest.raises(MetadataCorrupted):
                    view.scan_values(T, start)
                with pytest.raises(MetadataCorrupted):
                    view.scan(T, start)
    finally:
        store.close()
