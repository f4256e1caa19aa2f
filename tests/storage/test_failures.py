"""Failed writes leave no visible trace; their chunks are collected (invariants 2, 6).

Sweeps fail call 1, 2, ... N of each chunk storage operation a write makes (as
SQLite's I/O-error tests do), and of the metadata commits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import pytest
from slts.bindings.faulty import FaultyChunkStorage
from slts.bindings.memory import MemoryChunkStorage

from slts.config import StorageConfig
from slts.errors import MetadataError, SltsError, StorageUnavailable
from slts.metadata.delegating import DelegatingStore
from slts.metadata.memory_store import MemoryMetadataStore
from slts.metadata.schema import TABLES
from slts.metadata.store import Expect, MetadataStore, Operation
from slts.storage.chunked import ChunkedSegmentStorage
from tests.support.engine import FakeClock, NoAppendMemoryChunkStorage, segment_chunks


class FailingCommitStore(DelegatingStore):
    """Delegates to ``inner``; the ``fail_at``-th commit raises (before or after applying)."""

    def __init__(self, inner: MetadataStore) -> None:
        super().__init__(inner)
        self.commits = 0
        self.fail_at = 0
        self.apply_then_fail = False

    def commit(self, ops: Sequence[Operation], expect: Sequence[Expect] = ()) -> int:
        self.commits += 1
        if self.commits == self.fail_at:
            if self.apply_then_fail:  # the commit landed but its acknowledgement was lost
                self.inner.commit(ops, expect)
            raise MetadataError(f"injected commit failure #{self.commits}")
        return self.inner.commit(ops, expect)


NO_BACKGROUND_GC = StorageConfig(gc_interval_s=0.0)


def referenced_chunks(storage: ChunkedSegmentStorage) -> set[str]:
    return {chunk.name for name in storage.list() for _, chunk in storage.chunks(name)}


def collect_all(storage: ChunkedSegmentStorage) -> None:
    """Run the collector until a run changes nothing (each run is bounded by gc_batch_max)."""
    for _ in range(100):
        if not storage.gc.run_once().progressed:
            return
    raise AssertionError("GC did not converge")


def make(inner_binding: MemoryChunkStorage) -> tuple[FaultyChunkStorage, FailingCommitStore, FakeClock]:
    return (
        FaultyChunkStorage(inner_binding, seed=7),
        FailingCommitStore(MemoryMetadataStore(TABLES)),
        FakeClock(),
    )


@pytest.mark.parametrize("binding_class", [MemoryChunkStorage, NoAppendMemoryChunkStorage])
@pytest.mark.parametrize("op", ["create", "write"])
def test_sweep_chunk_storage_failures(binding_class: type[MemoryChunkStorage], op: str) -> None:
    for n in range(1, 6):
        binding, store, clock = make(binding_class())
        storage = ChunkedSegmentStorage(0, None, binding, store, NO_BACKGROUND_GC, clock=clock)
        storage.create("s", max_rolling_length=4)
        handle = storage.open_write("s")
        storage.write(handle, 0, b"ab")
        binding.fail_nth(op, n)
        try:
            storage.write(handle, 2, b"cdefghijklmn")  # append 2 + three new chunks
            failed = False
        except StorageUnavailable:
            failed = True
        binding.clear()
        assert failed == (binding.faults_injected == 1)
        expected = b"abcdefghijklmn" if not failed else b"ab"
        assert storage.info("s").length == len(expected)
        assert storage.read(handle, 0, len(expected)) == expected
        storage.write(handle, len(expected), b"+tail")
        expected += b"+tail"
        assert storage.read(handle, 0, len(expected)) == expected
        clock.advance(120)
        collect_all(storage)
        assert set(segment_chunks(binding.inner)) == referenced_chunks(storage), (
            f"leak after failing {op} #{n}"
        )


def test_partial_append_is_never_visible_and_next_write_starts_a_new_chunk() -> None:
    binding, store, clock = make(MemoryChunkStorage())
    storage = ChunkedSegmentStorage(0, None, binding, store, NO_BACKGROUND_GC, clock=clock)
    storage.create("t")
    handle = storage.open_write("t")
    storage.write(handle, 0, b"first")
    binding.partial_write(1)
    with pytest.raises(StorageUnavailable):
        storage.write(handle, 5, b"torn-write")
    assert storage.info("t").length == 5
    storage.write(handle, 5, b"second")
    assert storage.read(handle, 0, 11) == b"firstsecond"
    assert storage.info("t").chunk_count == 2, "a chunk with torn bytes is never appended to again"


@pytest.mark.parametrize("apply_then_fail", [False, True])
def test_sweep_metadata_commit_failures(apply_then_fail: bool) -> None:
    for n in range(1, 4):
        binding, store, clock = make(MemoryChunkStorage())
        storage = ChunkedSegmentStorage(0, None, binding, store, NO_BACKGROUND_GC, clock=clock)
        storage.create("m", max_rolling_length=4)
        handle = storage.open_write("m")
        storage.write(handle, 0, b"xy")
        store.fail_at = store.commits + n
        store.apply_then_fail = apply_then_fail
        try:
            storage.write(handle, 2, b"0123456789")
            acknowledged = True
        except SltsError:
            acknowledged = False
        fired = store.commits >= store.fail_at
        store.fail_at = 0
        assert acknowledged != fired
        length = storage.info("m").length
        if acknowledged:
            assert length == 12
        else:
            # Not acknowledged: either nothing is visible, or (commit landed, reply lost) all of it.
            assert length in (2, 12)
        data = storage.read(handle, 0, length)
        assert data == b"xy0123456789"[:length]
        storage.write(handle, length, b"!")
        clock.advance(120)
        collect_all(storage)
        assert set(segment_chunks(binding.inner)) == referenced_chunks(storage)


def test_random_faults_keep_store_and_model_in_agreement() -> None:
    binding, store, clock = make(MemoryChunkStorage())
    storage = ChunkedSegmentStorage(0, None, binding, store, NO_BACKGROUND_GC, clock=clock)
    for op in ("create", "write", "read", "open_read"):
        binding.fail_probability(op, 0.15)
    models: dict[str, bytearray] = {}
    rng = binding.random
    for step in range(400):
        name = f"f/{rng.randrange(4)}"
        if name not in models:
            storage.create(name, max_rolling_length=rng.randint(1, 16))
            models[name] = bytearray()
        handle = storage.open_write(name)
        data = rng.randbytes(rng.randint(0, 40))
        with contextlib.suppress(StorageUnavailable):
            storage.write(handle, len(models[name]), data)
            models[name] += data
        assert storage.info(name).length == len(models[name]), f"step {step}, seed {binding.seed}"
        with contextlib.suppress(StorageUnavailable):
            assert storage.read(handle, 0, len(models[name])) == models[name]
    binding.clear()
    for name, model in models.items():
        assert storage.read(storage.open_read(name), 0, len(model)) == model
    clock.advance(120)
    collect_all(storage)
    assert set(segment_chunks(binding.inner)) == referenced_chunks(storage)
