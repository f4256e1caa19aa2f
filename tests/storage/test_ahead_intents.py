"""Intents registered one write ahead on bindings without append (``slts.storage.ahead_intents``):
one metadata commit per write, nothing leaked, stale or unused intents collected."""

from __future__ import annotations

from slts.tools.simulation.seam import FakeClock

from slts.admin.verify import verify_container
from slts.config import StorageConfig
from slts.metadata.memory_store import MemoryMetadataStore
from slts.metadata.schema import GC, TABLES
from slts.storage.chunked import ChunkedSegmentStorage
from tests.support.engine import NoAppendMemoryChunkStorage, segment_chunks

CONFIG = StorageConfig(
    gc_delay_s=10.0, gc_interval_s=0.0, metadata_log_flush_interval_s=0.0, usage_flush_interval_s=0.0
)


def _open(
    binding: NoAppendMemoryChunkStorage, store: MemoryMetadataStore, clock: FakeClock
) -> ChunkedSegmentStorage:
    return ChunkedSegmentStorage(0, None, binding, store, CONFIG, clock=clock)


def _commits(store: MemoryMetadataStore) -> int:
    return store.statistics().commits


def test_each_write_after_the_first_costs_one_commit() -> None:
    binding, store, clock = NoAppendMemoryChunkStorage(), MemoryMetadataStore(TABLES), FakeClock()
    with _open(binding, store, clock) as storage:
        storage.create("s")
        handle = storage.open_write("s")
        before = _commits(store)
        data = b""
        for i in range(10):
            piece = bytes([i]) * (100 + i)
            storage.write(handle, len(data), piece)
            data += piece
        assert _commits(store) - before == 2 + 9  # the first write registers its own intent
        assert storage.read(storage.open_read("s"), 0, len(data)) == data
        assert storage.info("s").chunk_count == 10
        assert verify_container(storage).problems == []
        assert len(store.scan(GC)) == 1  # the intent ahead, for the eleventh chunk


def test_an_intent_too_old_to_use_is_replaced_and_the_unused_one_collected() -> None:
    binding, store, clock = NoAppendMemoryChunkStorage(), MemoryMetadataStore(TABLES), FakeClock()
    with _open(binding, store, clock) as storage:
        storage.create("s")
        handle = storage.open_write("s")
        storage.write(handle, 0, b"first")
        clock.advance(6.0)  # more than half of gc_delay_s: GC may be about to claim it
        before = _commits(store)
        storage.write(handle, 5, b"second")
        assert _commits(store) - before == 2  # its own intent, then the layout
        clock.advance(20.0)
        storage.seal(handle)
        storage.gc.run_once()  # the stale intent (and the last one ahead) name chunks that never existed
        assert storage.read(storage.open_read("s"), 0, 11) == b"firstsecond"
        assert verify_container(storage).problems == []
        assert store.scan(GC) == []
        assert len(segment_chunks(binding)) == 2


def test_an_intent_ahead_is_not_used_after_the_length_moved_otherwise() -> None:
    binding, store, clock = NoAppendMemoryChunkStorage(), MemoryMetadataStore(TABLES), FakeClock()
    with _open(binding, store, clock) as storage:
        storage.create("s")
        storage.create("donor")
        handle = storage.open_write("s")
        storage.write(handle, 0, b"abc")
        donor = storage.open_write("donor")
        storage.write(donor, 0, b"xyz")
        storage.seal(donor)
        storage.concat(handle, 3, "donor")  # the intent ahead was for a chunk at 3
        storage.write(handle, 6, b"after")
        assert storage.read(storage.open_read("s"), 0, 11) == b"abcxyzafter"
        assert verify_container(storage).problems == []
