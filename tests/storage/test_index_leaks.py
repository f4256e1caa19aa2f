"""Regression tests: clearing a range of a segment's index leaves no key behind.

Concat links a target's namespace to the (gone) source's namespace; when a segment that
was itself a concat target is concatenated again, an intermediate namespace holds only a
link. A defrag run, a seam merge, a truncate or the collection of a deleted segment that
removes the range such a namespace serves must remove its keys too (``index.clear_ops``
follows links into the mapped ranges; ``index.namespace_tree_keys`` walks a deleted
segment's namespaces deepest first). Each test fails on the code before that fix.
"""

from __future__ import annotations

import pytest
from slts.bindings.memory import MemoryChunkStorage

from slts.config import StorageConfig
from slts.metadata.memory_store import MemoryMetadataStore
from slts.metadata.schema import INDEX, TABLES
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.leaks import find_leaks
from tests.support.engine import FakeClock


def make(**config: object) -> tuple[ChunkedSegmentStorage, FakeClock]:
    clock = FakeClock()
    settings = StorageConfig.from_mapping({"defrag_small_chunk_bytes": 16, "gc_delay_s": 1.0, **config})
    storage = ChunkedSegmentStorage(
        0, 1, MemoryChunkStorage(), MemoryMetadataStore(TABLES), settings, clock=clock
    )
    return storage, clock


def sealed_segment(storage: ChunkedSegmentStorage, name: str, data: bytes, rolling: int = 48) -> None:
    storage.create(name, max_rolling_length=rolling)
    handle = storage.open_write(name)
    if data:
        storage.write(handle, 0, data)
    storage.seal(handle)


def concat(storage: ChunkedSegmentStorage, target: str, source: str) -> None:
    handle = storage.open_write(target)
    storage.concat(handle, storage.info(target).length, source)


def collect_all(storage: ChunkedSegmentStorage, clock: FakeClock) -> None:
    """GC past the delay until a pass changes nothing."""
    clock.advance(10)
    for _ in range(1000):
        if not storage.gc.run_once().progressed:
            return
    raise AssertionError("GC did not finish")


def assert_no_leak(storage: ChunkedSegmentStorage, clock: FakeClock) -> None:
    report = find_leaks(storage._store, now_ms=int(clock() * 1000), gc_delay_s=1.0)
    assert report.total == 0, report.problems()


def chain(storage: ChunkedSegmentStorage) -> None:
    """a := (b := (t1)) + t2 : ``b`` was a concat target, then concatenated into ``a``."""
    storage.create("b", max_rolling_length=1)
    sealed_segment(storage, "t1", b"x")
    concat(storage, "b", "t1")
    storage.create("a", max_rolling_length=48)
    storage.seal(storage.open_write("b"))
    concat(storage, "a", "b")
    sealed_segment(storage, "t2", b"y")


def test_seam_merge_over_a_concat_target_leaves_no_link_behind() -> None:
    """The minimal program the stateful model test found (issue 7's closing note)."""
    storage, clock = make(concat_merge_seam=True)
    chain(storage)
    concat(storage, "a", "t2")  # the seam merge joins t1's and t2's chunks
    assert storage.info("a").chunk_count == 1
    collect_all(storage, clock)
    assert storage.read(storage.open_read("a"), 0, 2) == b"xy"
    assert_no_leak(storage, clock)


def test_defrag_over_a_concat_target_leaves_no_link_behind() -> None:
    storage, clock = make(concat_merge_seam=False)
    chain(storage)
    concat(storage, "a", "t2")
    assert storage.info("a").chunk_count == 2
    storage.seal(storage.open_write("a"))  # an open segment's last chunk is not merged
    storage.defrag("a")
    assert storage.info("a").chunk_count == 1
    collect_all(storage, clock)
    assert storage.read(storage.open_read("a"), 0, 2) == b"xy"
    assert_no_leak(storage, clock)


def test_defrag_of_part_of_a_linked_range_keeps_the_rest_readable() -> None:
    """A run that covers the head of a linked namespace: the namespace is split at the
    run's end (at every level) so the rest still resolves, and the head's keys go."""
    storage, clock = make(concat_merge_seam=False, defrag_small_chunk_bytes=4)
    storage.create("b", max_rolling_length=1)
    sealed_segment(storage, "t1", b"abc", rolling=1)  # three 1-byte chunks
    concat(storage, "b", "t1")
    sealed_segment(storage, "t3", b"0123456789", rolling=10)  # one large chunk: stops the run
    concat(storage, "b", "t3")
    storage.seal(storage.open_write("b"))
    storage.create("a", max_rolling_length=3)
    concat(storage, "a", "b")
    storage.defrag("a")
    assert storage.info("a").chunk_count == 2
    collect_all(storage, clock)
    assert storage.read(storage.open_read("a"), 0, 13) == b"abc0123456789"
    assert storage.read(storage.open_read("a"), 5, 3) == b"234"
    assert_no_leak(storage, clock)


@pytest.mark.parametrize("offset", [1, 2])
def test_truncate_over_a_concat_target_leaves_no_link_behind(offset: int) -> None:
    storage, clock = make(concat_merge_seam=False)
    chain(storage)
    concat(storage, "a", "t2")
    storage.truncate(storage.open_write("a"), offset)
    collect_all(storage, clock)
    assert storage.read(storage.open_read("a"), offset, 2 - offset) == b"xy"[offset:]
    assert_no_leak(storage, clock)


@pytest.mark.parametrize("batch", [1, 2, 3, 100])
def test_gc_of_a_deleted_chain_visits_every_namespace(batch: int) -> None:
    """GC walks a deleted segment's namespaces in batches of ``gc_batch_max`` keys; a
    batch must never delete a link to a namespace it has not emptied yet."""
    storage, clock = make(concat_merge_seam=False, gc_batch_max=batch)
    for depth in range(4):  # s3 := (s2 := (s1 := (s0 := t0) + u0) ...)
        name = f"s{depth}"
        storage.create(name, max_rolling_length=8)
        if depth:
            concat(storage, name, f"s{depth - 1}")
        sealed_segment(storage, f"u{depth}", b"u" * (depth + 1))
        concat(storage, name, f"u{depth}")
        storage.seal(storage.open_write(name))
    assert storage.info("s3").length == 10
    storage.delete(storage.open_write("s3"))
    collect_all(storage, clock)
    assert storage._store.dump()[INDEX] == {}
    assert_no_leak(storage, clock)
