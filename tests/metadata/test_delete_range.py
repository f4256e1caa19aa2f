"""``DeleteRange``: one operation that removes every key of a range, on every store.

Contract (``slts.metadata.store``): the keys ``start <= k < stop`` of one table go, in
the commit's order among its other operations; bad input raises ``InvalidArgument`` and
changes nothing; the change log records the keys it removed as per-key ``Delete``s, so
replaying a captured change gives exactly the committed state; a cache never serves a
value a range removed.
"""

from __future__ import annotations

import threading

import pytest

from slts.errors import InvalidArgument, VersionConflict
from slts.metadata import (
    KEY_BYTES_MAX,
    CachedMetadataStore,
    Delete,
    DeleteRange,
    Expect,
    MemoryMetadataStore,
    MetadataStore,
    Put,
    Versioned,
)

from .conftest import TABLES

T = TABLES[0]
U = TABLES[1]


def _fill(store: MetadataStore, table: str, keys: list[bytes]) -> int:
    return store.commit([Put(table, key, b"v:" + key) for key in keys])


def test_removes_exactly_the_range(store: MetadataStore) -> None:
    keys = [b"a", b"b", b"ba", b"b\xff", b"c", b"d"]
    first = _fill(store, T, keys)
    _fill(store, U, keys)
    sequence = store.commit([DeleteRange(T, b"b", b"c")])
    assert sequence == first + 2
    assert sorted(store.dump()[T]) == [b"a", b"c", b"d"]
    assert sorted(store.dump()[U]) == sorted(keys)  # other tables untouched
    assert store.get(T, b"ba") is None and store.get(T, b"c") == Versioned(first, b"v:c")
    # A range that holds no key takes a sequence and changes nothing.
    assert store.commit([DeleteRange(T, b"x", b"y")]) == sequence + 1
    assert sorted(store.dump()[T]) == [b"a", b"c", b"d"]


def test_bounds_of_any_length(store: MetadataStore) -> None:
    longest = b"k" * KEY_BYTES_MAX
    _fill(store, T, [b"k", longest, b"l"])
    store.commit([DeleteRange(T, b"k\x00", longest + b"\x00")])  # the stop is longer than any key
    assert sorted(store.dump()[T]) == [b"k", b"l"]
    store.commit([DeleteRange(T, b"", b"\xff" * (KEY_BYTES_MAX + 5))])
    assert store.dump()[T] == {}


def test_operations_apply_in_order(store: MetadataStore) -> None:
    _fill(store, T, [b"a", b"b", b"c"])
    sequence = store.commit(
        [Put(T, b"b2", b"before"), DeleteRange(T, b"b", b"c"), Put(T, b"b3", b"after"), Put(T, b"e", b"")]
    )
    assert store.dump()[T] == {
        b"a": Versioned(1, b"v:a"),
        b"b3": Versioned(sequence, b"after"),
        b"c": Versioned(1, b"v:c"),
        b"e": Versioned(sequence, b""),
    }
    assert store.get(T, b"b2") is None  # the cache saw the put, then the range


def test_expectations_guard_a_range(store: MetadataStore) -> None:
    sequence = _fill(store, T, [b"a", b"b"])
    with pytest.raises(VersionConflict):
        store.commit([DeleteRange(T, b"a", b"z")], [Expect(T, b"a", sequence + 7)])
    assert sorted(store.dump()[T]) == [b"a", b"b"]
    store.commit([DeleteRange(T, b"a", b"z")], [Expect(T, b"a", sequence)])
    assert store.dump()[T] == {}


@pytest.mark.parametrize(
    "bad",
    [
        DeleteRange(T, b"b", b"b"),  # empty by its bounds
        DeleteRange(T, b"c", b"b"),  # reversed
        DeleteRange("nope", b"a", b"b"),
        DeleteRange(T, "a", b"b"),  # type: ignore[arg-type]
        DeleteRange(T, b"a", None),  # type: ignore[arg-type]
    ],
)
def test_bad_input_raises_and_changes_nothing(store: MetadataStore, bad: DeleteRange) -> None:
    sequence = _fill(store, T, [b"a", b"b"])
    with pytest.raises(InvalidArgument):
        store.commit([Put(T, b"x", b"x"), bad])
    assert store.last_sequence == sequence
    assert sorted(store.dump()[T]) == [b"a", b"b"]


def test_replicate_takes_per_key_operations_only(store: MetadataStore) -> None:
    with pytest.raises(InvalidArgument):
        store.replicate(5, [DeleteRange(T, b"a", b"b")])  # type: ignore[list-item]
    assert store.last_sequence == 0


def test_captured_as_the_keys_it_removed_and_replayed_exactly(store: MetadataStore) -> None:
    store.enable_change_capture()
    _fill(store, T, [b"a", b"b", b"c", b"d"])
    sequence = store.commit([Put(T, b"a1", b"x"), DeleteRange(T, b"a\x00", b"c\x00"), Delete(U, b"q")])
    [change] = store.changes(sequence - 1)
    assert change.sequence == sequence
    assert change.ops == (
        Put(T, b"a1", b"x"),
        Delete(T, b"a1"),
        Delete(T, b"b"),
        Delete(T, b"c"),
        Delete(U, b"q"),
    )
    replica = MemoryMetadataStore(TABLES)
    for captured in store.changes(0):
        replica.replicate(captured.sequence, captured.ops)
    assert replica.dump() == store.dump()


def test_cache_never_serves_a_value_a_range_removed() -> None:
    inner = MemoryMetadataStore(TABLES)
    store = CachedMetadataStore(inner, capacity=8)
    _fill(store, T, [b"a", b"b", b"c"])
    assert store.get(T, b"b") is not None  # cached
    store.commit([DeleteRange(T, b"a", b"c")])
    assert store.get(T, b"a") is None and store.get(T, b"b") is None
    assert store.get(T, b"c") is not None


def test_cache_with_ranges_and_writes_racing() -> None:
    """Writers put and range-delete the same keys while readers fill the cache: once they
    stop, every cached value is the store's."""
    inner = MemoryMetadataStore(TABLES)
    store = CachedMetadataStore(inner, capacity=16)
    keys = [bytes([97 + i]) for i in range(8)]
    stop = threading.Event()

    def write(seed: int) -> None:
        for round_ in range(150):
            if (round_ + seed) % 3:
                store.commit([Put(T, keys[(round_ * 7 + seed) % 8], b"%d" % round_)])
            else:
                low = keys[(round_ + seed) % 6]
                store.commit([DeleteRange(T, low, low + b"\x01\x00")])

    def read() -> None:
        while not stop.is_set():
            for key in keys:
                store.get(T, key)

    readers = [threading.Thread(target=read) for _ in range(2)]
    writers = [threading.Thread(target=write, args=(seed,)) for seed in range(2)]
    for thread in readers + writers:
        thread.start()
    for thread in writers:
        thread.join()
    stop.set()
    for thread in readers:
        thread.join()
    for key in keys:
        assert store.get(T, key) == inner.get(T, key), key
