"""CachedMetadataStore: bound, hits, staleness rule, and the races between fills and commits.

Races are forced deterministically: a wrapper around the inner store parks a call at a
chosen point (after the inner store answered, before the cache saw the answer) on an Event.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Callable, Sequence

import pytest

from slts.errors import InvalidArgument, StorageClosed, VersionConflict
from slts.metadata import (
    CachedMetadataStore,
    Delete,
    DeleteRange,
    Expect,
    MemoryMetadataStore,
    MetadataStore,
    Operation,
    Put,
    Versioned,
)
from slts.metadata.delegating import DelegatingStore

T = "segments"
TABLES = (T, "chunks")
WAIT_S = 30  # bounds every wait so that a bug fails the test instead of hanging it


class HookedStore(DelegatingStore):
    """Delegates to ``inner``; ``after_get``/``after_commit`` run after the inner call returned."""

    def __init__(self, inner: MetadataStore) -> None:
        super().__init__(inner)
        self.gets = 0
        self.after_get: Callable[[bytes, Versioned | None], None] | None = None
        self.after_commit: Callable[[int], None] | None = None

    def get(self, table: str, key: bytes) -> Versioned | None:
        value = self.inner.get(table, key)
        self.gets += 1
        if self.after_get is not None:
            self.after_get(key, value)
        return value

    def commit(self, ops: Sequence[Operation], expect: Sequence[Expect] = ()) -> int:
        sequence = self.inner.commit(ops, expect)
        if self.after_commit is not None:
            self.after_commit(sequence)
        return sequence


class Parking:
    """A hook that parks the first call that reaches it until ``release``."""

    def __init__(self) -> None:
        self.arrived = threading.Event()
        self.released = threading.Event()
        self._taken = False
        self._lock = threading.Lock()

    def __call__(self, *args: object) -> None:
        with self._lock:
            first, self._taken = not self._taken, True
        if first:
            self.arrived.set()
            assert self.released.wait(WAIT_S)

    def release(self) -> None:
        self.released.set()

    def __enter__(self) -> Parking:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()  # never leave a parked thread behind a failed assertion


@pytest.fixture
def hooked() -> HookedStore:
    return HookedStore(MemoryMetadataStore(TABLES))


@pytest.fixture
def cache(hooked: HookedStore) -> CachedMetadataStore:
    return CachedMetadataStore(hooked, capacity=16)


def in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(call()))
    thread.start()
    return thread, result


def served_from_cache(cache: CachedMetadataStore, hooked: HookedStore, key: bytes) -> Versioned | None:
    """``cache.get``, asserting that the inner store was not asked."""
    before = hooked.gets
    value = cache.get(T, key)
    assert hooked.gets == before, "expected a cache hit"
    return value


# -- the races -------------------------------------------------------------------------------


@pytest.mark.parametrize("write", ["put", "delete"])
def test_a_racing_fill_never_overwrites_a_newer_commit(
    cache: CachedMetadataStore, hooked: HookedStore, write: str
) -> None:
    old = cache.commit([Put(T, b"k", b"old")])
    cache.clear()
    with Parking() as parking:
        hooked.after_get = parking
        reader, result = in_thread(lambda: cache.get(T, b"k"))  # misses, reads "old", parks
        assert parking.arrived.wait(WAIT_S)
        op = Put(T, b"k", b"new") if write == "put" else Delete(T, b"k")
        new = cache.commit([op])
    reader.join(WAIT_S)
    assert result == [Versioned(old, b"old")]  # the racing read returns what it read...
    hooked.after_get = None
    expected = Versioned(new, b"new") if write == "put" else None
    assert served_from_cache(cache, hooked, b"k") == expected  # ...but did not cache it


def test_reads_during_a_commit_in_flight_are_not_stale(
    cache: CachedMetadataStore, hooked: HookedStore
) -> None:
    old = cache.commit([Put(T, b"k", b"old")])
    assert served_from_cache(cache, hooked, b"k") == Versioned(old, b"old")
    with Parking() as parking:
        hooked.after_commit = parking
        writer, result = in_thread(lambda: cache.commit([Put(T, b"k", b"new")]))
        assert parking.arrived.wait(WAIT_S)  # applied in the inner store, not landed in the cache
        during = cache.get(T, b"k")
        assert during == Versioned(old + 1, b"new")  # the old entry left when the commit began
        assert cache.cached_entries == 0  # and the read did not fill it while the commit flies
    writer.join(WAIT_S)
    assert result == [old + 1]
    assert served_from_cache(cache, hooked, b"k") == Versioned(old + 1, b"new")


def test_commits_landing_out_of_order_leave_the_newest(
    cache: CachedMetadataStore, hooked: HookedStore
) -> None:
    with Parking() as parking:
        hooked.after_commit = parking
        slow, slow_result = in_thread(lambda: cache.commit([Put(T, b"k", b"first")]))
        assert parking.arrived.wait(WAIT_S)
        newest = cache.commit([Put(T, b"k", b"second")])  # lands while the first still flies
        assert cache.get(T, b"k") == Versioned(newest, b"second")
    slow.join(WAIT_S)
    assert slow_result == [newest - 1]
    assert served_from_cache(cache, hooked, b"k") == Versioned(newest, b"second")


def test_a_commit_with_unknown_outcome_caches_nothing(
    cache: CachedMetadataStore, hooked: HookedStore
) -> None:
    cache.commit([Put(T, b"k", b"old")])

    def fail(sequence: int) -> None:
        raise RuntimeError("connection lost after the write")

    hooked.after_commit = fail
    with pytest.raises(RuntimeError):
        cache.commit([Put(T, b"k", b"new")])
    hooked.after_commit = None
    assert cache.cached_entries == 0
    assert cache.get(T, b"k").value == b"new"  # read from the inner store


def test_concurrent_gets_and_commits_agree_with_the_inner_store(hooked: HookedStore) -> None:
    cache = CachedMetadataStore(hooked, capacity=4)
    keys = [b"k%d" % i for i in range(6)]
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(400):
                key = rng.choice(keys)
                action = rng.random()
                if action < 0.5:
                    cache.get(T, key)
                elif action < 0.8:
                    cache.commit([Put(T, key, b"%d" % rng.randrange(1000))])
                elif action < 0.9:
                    cache.commit([Delete(T, key)])
                else:
                    current = cache.get(T, key)
                    with contextlib.suppress(VersionConflict):
                        cache.commit(
                            [Put(T, key, b"cas")],
                            [Expect(T, key, current.version if current else 0)],
                        )
                assert cache.cached_entries <= 4
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for key in keys:  # every write went through this cache: nothing may be stale
        assert cache.get(T, key) == hooked.inner.get(T, key)


# -- bound, hits, staleness -------------------------------------------------------------------


def test_capacity_bounds_the_cache_lru(hooked: HookedStore) -> None:
    cache = CachedMetadataStore(hooked, capacity=8)
    for index in range(100):
        cache.get(T, b"%03d" % index)
        assert cache.cached_entries <= 8
    for index in range(20):
        cache.commit([Put(T, b"w%02d" % index, b"v")])
        assert cache.cached_entries <= 8
    assert cache.cached_entries == 8
    cache.get(T, b"w12")  # recently used: survives the next insertions
    for index in range(7):
        cache.get(T, b"x%d" % index)
    assert served_from_cache(cache, hooked, b"w12") == Versioned(13, b"v")
    before = hooked.gets
    cache.get(T, b"w13")  # least recently used: evicted
    assert hooked.gets == before + 1


def test_absent_keys_are_cached_and_counted(cache: CachedMetadataStore, hooked: HookedStore) -> None:
    assert cache.get(T, b"missing") is None
    assert served_from_cache(cache, hooked, b"missing") is None
    stats = cache.statistics()
    assert (stats.cache_hits, stats.cache_misses) == (1, 1)
    assert hooked.gets == 1


def test_commit_caches_what_it_wrote(cache: CachedMetadataStore, hooked: HookedStore) -> None:
    sequence = cache.commit([Put(T, b"a", b"1"), Put(T, b"b", b"x"), Put(T, b"b", b"2"), Delete(T, b"c")])
    assert served_from_cache(cache, hooked, b"a") == Versioned(sequence, b"1")
    assert served_from_cache(cache, hooked, b"b") == Versioned(sequence, b"2")
    assert served_from_cache(cache, hooked, b"c") is None
    assert hooked.gets == 0


def test_a_commit_by_another_writer_is_seen_by_the_next_get(
    cache: CachedMetadataStore, hooked: HookedStore
) -> None:
    own = cache.commit([Put(T, b"a", b"mine"), Put(T, b"b", b"mine")])
    assert served_from_cache(cache, hooked, b"a") == Versioned(own, b"mine")  # own commits keep the cache
    foreign = hooked.inner.commit([Put(T, b"a", b"theirs")])  # e.g. a defrag driver in another process
    assert cache.get(T, b"a") == Versioned(foreign, b"theirs")
    assert cache.get(T, b"b") == Versioned(own, b"mine")
    assert cache.foreign_invalidations == 1
    assert served_from_cache(cache, hooked, b"a") == Versioned(foreign, b"theirs")  # cached again


def test_conflict_evicts_every_named_key(hooked: HookedStore) -> None:
    mine = CachedMetadataStore(hooked, capacity=16)
    other = CachedMetadataStore(hooked.inner, capacity=16)  # another writer on the same data
    first = mine.commit([Put(T, b"x", b"1"), Put(T, b"y", b"1")])
    assert mine.get(T, b"z") is None
    other_sequence = other.commit([Put(T, b"x", b"2"), Put(T, b"y", b"2"), Put(T, b"z", b"2")])
    with pytest.raises(VersionConflict):  # a commit built on what ``mine`` read before
        mine.commit([Put(T, b"y", b"3")], [Expect(T, b"x", first), Expect(T, b"z", 0)])
    before = hooked.gets
    for key in (b"x", b"y", b"z"):
        assert mine.get(T, key) == Versioned(other_sequence, b"2")
    assert hooked.gets == before + 3  # all three were evicted and read again
    done = mine.commit([Put(T, b"y", b"3")], [Expect(T, b"x", other_sequence)])
    assert served_from_cache(mine, hooked, b"y") == Versioned(done, b"3")


def test_invalidate_and_clear(cache: CachedMetadataStore, hooked: HookedStore) -> None:
    cache.commit([Put(T, b"a", b"1"), Put(T, b"b", b"1")])
    cache.invalidate(T, b"a")
    before = hooked.gets
    assert cache.get(T, b"a").value == b"1" and hooked.gets == before + 1  # read from the inner store
    assert served_from_cache(cache, hooked, b"b").value == b"1"
    cache.clear()
    assert cache.cached_entries == 0
    assert cache.get(T, b"b").value == b"1" and hooked.gets == before + 2


def test_reads_other_than_get_are_never_cached(cache: CachedMetadataStore, hooked: HookedStore) -> None:
    cache.commit([Put(T, b"a", b"1")])
    later = hooked.inner.commit([Put(T, b"a", b"2")])
    assert cache.floor(T, b"b") == (b"a", Versioned(later, b"2"))
    assert cache.scan(T) == [(b"a", Versioned(later, b"2"))]
    with cache.snapshot() as view:
        assert view.get(T, b"a") == Versioned(later, b"2")
    assert cache.last_sequence == later


def test_uncached_tables_pass_through(hooked: HookedStore) -> None:
    """Keys of an uncached table never take a cache entry: commits do not cache them,
    ``get`` always asks the inner store (and sees what it holds), and the own commit on
    them is not mistaken for another writer's."""
    cache = CachedMetadataStore(hooked, capacity=2, uncached_tables=frozenset({"chunks"}))
    own = cache.commit([Put(T, b"a", b"1"), Put("chunks", b"c1", b"x"), Delete("chunks", b"c2")])
    assert cache.cached_entries == 1  # only the segments key
    assert served_from_cache(cache, hooked, b"a") == Versioned(own, b"1")
    for _ in range(2):
        before = hooked.gets
        assert cache.get("chunks", b"c1") == Versioned(own, b"x")
        assert cache.get("chunks", b"c2") is None
        assert hooked.gets == before + 2  # asked the inner store each time
    assert cache.cached_entries == 1
    cache.commit([Put("chunks", b"c3", b"y")])  # an own commit on uncached keys only
    assert served_from_cache(cache, hooked, b"a") == Versioned(own, b"1")
    assert cache.foreign_invalidations == 0


def test_uncached_tables_must_be_the_store_s(hooked: HookedStore) -> None:
    for tables in ({"chunks"}, frozenset({"nope"}), ("chunks",)):
        with pytest.raises(InvalidArgument, match="uncached_tables"):
            CachedMetadataStore(hooked, capacity=2, uncached_tables=tables)  # type: ignore[arg-type]


def test_capacity_must_be_positive(hooked: HookedStore) -> None:
    for capacity in (0, -1, 1.5):
        with pytest.raises(InvalidArgument):
            CachedMetadataStore(hooked, capacity=capacity)


def test_close_closes_the_inner_store(cache: CachedMetadataStore, hooked: HookedStore) -> None:
    cache.close()
    cache.close()
    with pytest.raises(StorageClosed):
        hooked.inner.get(T, b"k")
    with pytest.raises(StorageClosed):
        cache.get(T, b"k")


# -- bulk deletes ------------------------------------------------------------------------------


BULK = 4  # bulk_deletes_min of the caches below


def bulk_cache(hooked: HookedStore, capacity: int = 16) -> CachedMetadataStore:
    return CachedMetadataStore(hooked, capacity=capacity, bulk_deletes_min=BULK)


def test_a_bulk_delete_evicts_its_keys_and_keeps_the_live_records(hooked: HookedStore) -> None:
    cache = bulk_cache(hooked, capacity=8)
    live = cache.commit([Put(T, b"live%d" % i, b"v") for i in range(4)])
    dropped = [b"d%02d" % i for i in range(20)]
    cache.commit([Put(T, key, b"x") for key in dropped])  # cached, pushing nothing live out yet
    cache.clear()
    for i in range(4):
        cache.get(T, b"live%d" % i)
    for key in dropped[:4]:
        cache.get(T, key)
    assert cache.cached_entries == 8
    done = cache.commit([*(Delete(T, key) for key in dropped), Put(T, b"seg", b"new")])
    assert cache.cached_entries == 5, "the deleted keys left; the put is cached; no 'absent' entry"
    for i in range(4):
        assert served_from_cache(cache, hooked, b"live%d" % i) == Versioned(live, b"v")
    assert served_from_cache(cache, hooked, b"seg") == Versioned(done, b"new")
    before = hooked.gets
    assert cache.get(T, dropped[0]) is None and hooked.gets == before + 1, "read from the inner store"
    assert served_from_cache(cache, hooked, dropped[0]) is None, "and cached by that miss"


def test_deletes_below_the_bulk_threshold_are_cached_as_absent(hooked: HookedStore) -> None:
    cache = bulk_cache(hooked)
    cache.commit([Put(T, b"k%d" % i, b"v") for i in range(BULK - 1)])
    cache.commit([Delete(T, b"k%d" % i) for i in range(BULK - 1)])
    assert cache.cached_entries == BULK - 1
    for i in range(BULK - 1):
        assert served_from_cache(cache, hooked, b"k%d" % i) is None


def test_a_racing_fill_never_caches_what_a_bulk_delete_removed(hooked: HookedStore) -> None:
    cache = bulk_cache(hooked)
    keys = [b"k%d" % i for i in range(BULK)]
    old = cache.commit([Put(T, key, b"old") for key in keys])
    cache.clear()
    with Parking() as parking:
        hooked.after_get = parking
        reader, result = in_thread(lambda: cache.get(T, keys[0]))  # misses, reads "old", parks
        assert parking.arrived.wait(WAIT_S)
        cache.commit([Delete(T, key) for key in keys])
    reader.join(WAIT_S)
    assert result == [Versioned(old, b"old")]
    hooked.after_get = None
    assert cache.cached_entries == 0
    assert cache.get(T, keys[0]) is None


def test_reads_during_a_bulk_delete_in_flight_fill_nothing(hooked: HookedStore) -> None:
    cache = bulk_cache(hooked)
    keys = [b"k%d" % i for i in range(BULK)]
    cache.commit([Put(T, key, b"old") for key in keys])
    with Parking() as parking:
        hooked.after_commit = parking
        writer, _ = in_thread(lambda: cache.commit([Delete(T, key) for key in keys]))
        assert parking.arrived.wait(WAIT_S)  # applied in the inner store, not landed in the cache
        assert cache.get(T, keys[1]) is None
        assert cache.cached_entries == 0, "no fill while the bulk delete flies"
    writer.join(WAIT_S)
    assert cache.cached_entries == 0


@pytest.mark.parametrize("first", ["bulk delete", "put"])
def test_a_put_racing_a_bulk_delete_on_its_key_is_not_cached(hooked: HookedStore, first: str) -> None:
    """Whichever of the two the store applied first, and whichever lands first in the
    cache, the key ends uncached and the next get reads what the store holds."""
    cache = bulk_cache(hooked)
    keys = [b"k%d" % i for i in range(BULK)]
    cache.commit([Put(T, key, b"old") for key in keys])
    bulk = [Delete(T, key) for key in keys]
    put = [Put(T, keys[2], b"new")]
    with Parking() as parking:
        hooked.after_commit = parking
        parked, _ = in_thread(lambda: cache.commit(bulk if first == "bulk delete" else put))
        assert parking.arrived.wait(WAIT_S)
        cache.commit(put if first == "bulk delete" else bulk)  # applied second, lands first
        assert cache.get(T, keys[2]) == hooked.inner.get(T, keys[2])
    parked.join(WAIT_S)
    before = hooked.gets
    assert cache.get(T, keys[2]) == hooked.inner.get(T, keys[2])
    assert hooked.gets == before + 1, "the raced key was not cached"


def test_a_bulk_delete_with_unknown_outcome_leaves_racing_flights_uncached(hooked: HookedStore) -> None:
    cache = bulk_cache(hooked)
    keys = [b"k%d" % i for i in range(BULK)]
    cache.commit([Put(T, key, b"old") for key in keys])
    with Parking() as parking:
        hooked.after_commit = parking
        writer, _ = in_thread(lambda: cache.commit([Put(T, keys[0], b"new")]))  # parks, applied
        assert parking.arrived.wait(WAIT_S)

        def fail(sequence: int) -> None:
            raise RuntimeError("connection lost after the write")

        hooked.after_commit = fail
        with pytest.raises(RuntimeError):
            cache.commit([Delete(T, key) for key in keys])
        hooked.after_commit = None
    writer.join(WAIT_S)
    assert cache.cached_entries == 0
    assert cache.get(T, keys[0]) is None  # what the store holds


def test_a_delete_range_with_unknown_outcome_leaves_racing_flights_uncached(hooked: HookedStore) -> None:
    cache = CachedMetadataStore(hooked, capacity=16)
    cache.commit([Put(T, b"k", b"old")])
    with Parking() as parking:
        hooked.after_commit = parking
        writer, _ = in_thread(lambda: cache.commit([Put(T, b"k", b"new")]))  # parks, applied
        assert parking.arrived.wait(WAIT_S)

        def fail(sequence: int) -> None:
            raise RuntimeError("connection lost after the write")

        hooked.after_commit = fail
        with pytest.raises(RuntimeError):
            cache.commit([DeleteRange(T, b"a", b"z")])
        hooked.after_commit = None
    writer.join(WAIT_S)
    assert cache.cached_entries == 0
    assert cache.get(T, b"k") is None  # what the store holds


def test_bulk_deletes_min_must_be_positive(hooked: HookedStore) -> None:
    for value in (0, -1, 1.5):
        with pytest.raises(InvalidArgument, match="bulk_deletes_min"):
            CachedMetadataStore(hooked, capacity=2, bulk_deletes_min=value)  # type: ignore[arg-type]
