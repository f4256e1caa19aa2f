"""Per-segment locks (``slts.storage.segment_locks``): unrelated segments never wait for
each other, a read never waits for a write's data I/O, and the lock table holds only the
segments in use."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from slts.bindings.base import ChunkHandle
from slts.bindings.memory import MemoryChunkStorage

from slts.config import StorageConfig
from slts.metadata.memory_store import MemoryMetadataStore
from slts.metadata.schema import TABLES
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.segment_locks import SegmentLocks

WAIT_S = 30.0  # a bound on waiting for another thread: only reached when the code is wrong


class HeldWrites(MemoryChunkStorage):
    """A memory binding whose data writes to chunks of ``held`` segments wait for
    ``release`` (a write stuck in its data I/O, e.g. an ``fdatasync``)."""

    def __init__(self) -> None:
        super().__init__()
        self.held: set[str] = set()
        self.entered = threading.Event()
        self.release = threading.Event()

    def _hold(self, chunk: str) -> None:
        if chunk.rsplit("/", 1)[0].split("/", 1)[1] in self.held:  # "<container>/<segment>/<leaf>"
            self.entered.set()
            assert self.release.wait(WAIT_S), "the held write was never released"

    def _do_create(self, name: str, data: bytes) -> ChunkHandle:
        self._hold(name)
        return super()._do_create(name, data)

    def _do_write(self, handle: ChunkHandle, offset: int, data: bytes) -> int:
        self._hold(handle.name)
        return super()._do_write(handle, offset, data)


@pytest.fixture
def held() -> Iterator[tuple[HeldWrites, ChunkedSegmentStorage]]:
    binding = HeldWrites()
    config = StorageConfig(gc_interval_s=0.0, metadata_log_flush_interval_s=0.0, usage_flush_interval_s=0.0)
    storage = ChunkedSegmentStorage(0, None, binding, MemoryMetadataStore(TABLES), config)
    try:
        yield binding, storage
    finally:
        binding.release.set()
        storage.close()


def _stuck_write(
    binding: HeldWrites, storage: ChunkedSegmentStorage, name: str, offset: int
) -> threading.Thread:
    """A thread writing to ``name`` that is inside its data I/O when this returns."""
    handle = storage.open_write(name)
    binding.held.add(name)
    writer = threading.Thread(target=storage.write, args=(handle, offset, b"late"))
    writer.start()
    assert binding.entered.wait(WAIT_S), "the write never reached its data I/O"
    return writer


def test_other_segments_write_while_one_write_is_in_its_data_io(
    held: tuple[HeldWrites, ChunkedSegmentStorage],
) -> None:
    binding, storage = held
    names = [f"segment-{i}" for i in range(200)]  # more than any number of stripes
    for name in names:
        storage.create(name)
    writer = _stuck_write(binding, storage, names[0], 0)
    for name in names[1:]:  # each would have to wait for the stuck one if they shared a lock
        storage.write(storage.open_write(name), 0, b"flush")
    assert all(storage.info(name).length == 5 for name in names[1:])
    assert storage.info(names[0]).length == 0 and writer.is_alive()
    binding.release.set()
    writer.join(WAIT_S)
    assert storage.info(names[0]).length == 4


def test_a_read_of_the_segment_does_not_wait_for_its_write(
    held: tuple[HeldWrites, ChunkedSegmentStorage],
) -> None:
    binding, storage = held
    storage.create("tail")
    storage.write(storage.open_write("tail"), 0, b"committed")
    writer = _stuck_write(binding, storage, "tail", 9)
    reader = storage.open_read("tail")
    assert storage.read(reader, 0, 9) == b"committed"  # the layout as committed so far
    assert storage.info("tail").length == 9
    binding.release.set()
    writer.join(WAIT_S)
    assert storage.read(reader, 0, 13) == b"committedlate"


def test_a_second_changer_of_the_segment_waits_for_the_write(
    held: tuple[HeldWrites, ChunkedSegmentStorage],
) -> None:
    binding, storage = held
    storage.create("tail")
    writer = _stuck_write(binding, storage, "tail", 0)
    sealed = threading.Event()

    def seal() -> None:
        storage.seal(storage.open_write("tail"))
        sealed.set()

    sealer = threading.Thread(target=seal)
    sealer.start()
    assert not sealed.wait(0.2)  # not a timing assertion: it must not happen at all before release
    binding.release.set()
    writer.join(WAIT_S)
    sealer.join(WAIT_S)
    assert sealed.is_set()
    info = storage.info("tail")
    assert (info.length, info.sealed) == (4, True)  # the write went first, whole


def test_the_lock_table_holds_only_segments_in_use() -> None:
    locks = SegmentLocks()
    with locks.exclusive("b", "a", "a"):
        assert len(locks) == 2
        with locks.layout("c"):
            assert len(locks) == 3
    assert len(locks) == 0
    with locks.changing("a"), locks.layout("a"):  # a writer's commit inside its operation
        assert len(locks) == 1
    assert len(locks) == 0


def test_a_reader_waits_for_a_commit_of_its_segment() -> None:
    locks = SegmentLocks()
    committing = threading.Event()
    done = threading.Event()
    order: list[str] = []

    def read() -> None:
        assert committing.wait(WAIT_S)
        with locks.layout("s"):
            order.append("read")
        done.set()

    reader = threading.Thread(target=read)
    with locks.changing("s"):
        with locks.layout("s"):
            reader.start()
            committing.set()
            assert not done.wait(0.2)  # it must not get in while the commit holds the layout
            order.append("commit")
        assert done.wait(WAIT_S)  # the data I/O part: the reader is not held
    reader.join(WAIT_S)
    assert order == ["commit", "read"]


def test_a_combined_commit_holds_the_layouts_of_all_its_segments() -> None:
    """``layout`` of several segments (a group of combined writes commits them at once):
    each one's lock is held (a reader of it waits) and entered once, whatever the order
    and repeats given; another segment's is free."""
    locks = SegmentLocks()
    with locks.layout("c", "a", "b", "a"):
        assert len(locks) == 3
        for name in "abc":
            assert not locks._entries[name].layout.acquire(blocking=False)
        with locks.layout("d"):
            assert len(locks) == 4
    assert len(locks) == 0
