"""Write and read paths (DESIGN.md §5 invariants 1, 2, 3, 7) against a bytearray reference."""

from __future__ import annotations

import itertools
import random
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from slts.bindings.base import ChunkHandle
from slts.bindings.memory import MemoryChunkStorage

from slts.config import StorageConfig
from slts.errors import InvalidArgument, InvalidOffset, StorageUnavailable, VersionConflict
from slts.metadata.memory_store import MemoryMetadataStore
from slts.metadata.schema import CHUNKS, GC, OFFLOAD_LEDGERS, OFFLOAD_STREAM_SEGMENTS, SEGMENTS, TABLES
from slts.metadata.store import Delete, Expect, Put, scan_all
from slts.storage.chunked import ChunkedSegmentStorage
from tests.support.engine import PAIRS, TRANSFORM_PAIRS, Env, chunk_contents, env_fixture

env = env_fixture(PAIRS + TRANSFORM_PAIRS)

_NAMES = itertools.count()


def assert_layout(storage: ChunkedSegmentStorage, name: str, expected: bytes) -> None:
    """Invariant 1 and 2: the chunk list, in order, holds exactly the segment's bytes."""
    info = storage.info(name)
    chunks = storage.chunks(name)
    assert info.length == len(expected) and info.chunk_count == len(chunks)
    position = info.start_offset
    for start, chunk in chunks:
        assert start == position
        stored = storage.chunk_storage.get_info(chunk.name).length
        assert stored >= chunk.stored, "a referenced chunk holds fewer bytes than recorded"
        assert chunk_contents(storage, chunk) == expected[start : start + chunk.length]
        position += chunk.length
    assert position == info.length


def test_write_then_read_roundtrip(storage: ChunkedSegmentStorage) -> None:
    storage.create("s/a")
    handle = storage.open_write("s/a")
    storage.write(handle, 0, b"hello ")
    storage.write(handle, 6, b"world")
    assert storage.read(storage.open_read("s/a"), 0, 11) == b"hello world"
    assert storage.read(handle, 3, 5) == b"lo wo"
    assert storage.info("s/a").length == 11
    assert_layout(storage, "s/a", b"hello world")


def test_appends_go_to_one_chunk_when_the_binding_can_append(storage: ChunkedSegmentStorage) -> None:
    storage.create("a")
    handle = storage.open_write("a")
    for i in range(20):
        storage.write(handle, i * 3, b"abc")
    expected_chunks = 1 if storage.chunk_storage.supports_append else 20
    assert storage.info("a").chunk_count == expected_chunks
    assert_layout(storage, "a", b"abc" * 20)


def test_write_crossing_rolling_length_is_split(storage: ChunkedSegmentStorage) -> None:
    storage.create("r", max_rolling_length=10)
    handle = storage.open_write("r")
    data = bytes(range(35))
    storage.write(handle, 0, data[:4])
    storage.write(handle, 4, data[4:35])
    chunks = storage.chunks("r")
    assert all(chunk.length <= 10 for _, chunk in chunks)
    if storage.chunk_storage.supports_append:
        assert [chunk.length for _, chunk in chunks] == [10, 10, 10, 5]
    assert_layout(storage, "r", data)
    for offset in range(35):
        for length in (0, 1, 7, 35 - offset):
            if offset + length <= 35:
                assert storage.read(handle, offset, length) == data[offset : offset + length]


def test_zero_length_write_and_read_at_end(storage: ChunkedSegmentStorage) -> None:
    storage.create("z")
    handle = storage.open_write("z")
    storage.write(handle, 0, b"")
    assert storage.info("z").chunk_count == 0
    assert storage.read(handle, 0, 0) == b""
    storage.write(handle, 0, b"xy")
    assert storage.read(handle, 2, 0) == b""
    with pytest.raises(InvalidOffset):
        storage.read(handle, 3, 0)


def test_large_read_spanning_chunks_uses_parallel_path(env: Env) -> None:
    storage = env.open(read_parallel_bytes_min=64)
    storage.create("p", max_rolling_length=100)
    handle = storage.open_write("p")
    data = random.Random(1).randbytes(1000)
    storage.write(handle, 0, data)
    assert storage.info("p").chunk_count == 10
    assert storage.read(handle, 0, 1000) == data
    assert storage.read(handle, 55, 900) == data[55:955]


class FirstChunkFailsOthersWait(MemoryChunkStorage):
    """Once armed, a read of ``first`` fails and opens the gate; every other read waits
    at the gate, then counts itself finished: a parallel read whose first piece fails
    while the others are still in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.first: str | None = None
        self.gate = threading.Event()
        self.finished = 0
        self._count = threading.Lock()

    def _do_read(self, handle: ChunkHandle, offset: int, length: int) -> bytes:
        if self.first is None:
            return super()._do_read(handle, offset, length)
        if handle.name == self.first:
            self.gate.set()
            raise StorageUnavailable("the first piece fails")
        assert self.gate.wait(60), "the failing piece never ran"  # a guard against a hang, not a timing
        with self._count:
            self.finished += 1
        return super()._do_read(handle, offset, length)


def test_a_failing_parallel_read_raises_after_every_piece_finished() -> None:
    """No chunk read outlives the read that asked for it: the error comes after the
    pieces in flight and the queued ones have run, and it is the first piece's."""
    binding = FirstChunkFailsOthersWait()
    settings = StorageConfig(read_parallel_bytes_min=64, read_threads=3)
    storage = ChunkedSegmentStorage(0, None, binding, MemoryMetadataStore(TABLES), settings)
    storage.create("p", max_rolling_length=100)
    storage.write(storage.open_write("p"), 0, random.Random(2).randbytes(1000))
    chunks = storage.chunks("p")
    assert len(chunks) == 10
    binding.first = chunks[0][1].name
    with pytest.raises(StorageUnavailable, match="the first piece fails"):
        storage.read(storage.open_read("p"), 0, 1000)
    assert binding.finished == 9, "a piece was cancelled or still running when the read raised"
    storage.close()


def test_restart_takes_over_and_starts_a_new_chunk(env: Env) -> None:
    first = env.open()
    first.create("t")
    handle = first.open_write("t")
    first.write(handle, 0, b"one")
    second = env.reopen()
    assert second.epoch == first.epoch + 1
    handle = second.open_write("t")
    assert second.info("t").owner_epoch == second.epoch
    second.write(handle, 3, b"two")
    chunks = second.chunks("t")
    assert len(chunks) == 2, "invariant 3: never append to a chunk another instance created"
    assert {chunk.epoch for _, chunk in chunks} == {first.epoch, second.epoch}
    assert second.read(handle, 0, 6) == b"onetwo"


def test_bytes_beyond_recorded_length_are_never_read(env: Env) -> None:
    """A zombie's or torn write's bytes past the committed length stay invisible."""
    first = env.open()
    first.create("g")
    handle = first.open_write("g")
    first.write(handle, 0, b"committed")
    if not env.binding.supports_append:
        pytest.skip("binding has no append: chunks cannot grow after creation")
    last = first.chunks("g")[-1][1]
    env.binding.write(env.binding.open_write(last.name), last.stored, b"GARBAGE")
    second = env.reopen()
    assert second.info("g").length == 9
    handle = second.open_write("g")
    second.write(handle, 9, b"+more")
    assert second.read(handle, 0, 14) == b"committed+more"


def test_checksums_are_recorded_and_verified(env: Env) -> None:
    storage = env.open()
    storage.create("c", max_rolling_length=8)
    handle = storage.open_write("c")
    storage.write(handle, 0, b"abcdefgh12345678")
    assert all(chunk.checksum is not None for _, chunk in storage.chunks("c"))
    assert storage.read(handle, 0, 16) == b"abcdefgh12345678"


def test_large_writes_record_the_checksums_of_their_bytes(env: Env) -> None:
    """From PARALLEL_CHECKSUM_BYTES_MIN a write's checksums are computed on a helper
    thread beside its data I/O: the recorded ones are still those of the bytes written."""
    import crc32c

    from slts.storage import block_checksums
    from slts.storage.chunked import PARALLEL_CHECKSUM_BYTES_MIN

    storage = env.open(verify_checksums_on_read=True)
    storage.create("big", max_rolling_length=3 * PARALLEL_CHECKSUM_BYTES_MIN)
    handle = storage.open_write("big")
    rng = random.Random(7)
    first = rng.randbytes(PARALLEL_CHECKSUM_BYTES_MIN + 5)  # one new chunk
    second = rng.randbytes(2 * PARALLEL_CHECKSUM_BYTES_MIN)  # an append (if any) and a new chunk
    storage.write(handle, 0, first)
    storage.write(handle, len(first), second)
    data = first + second
    assert storage.read(handle, 0, len(data)) == data
    for start, chunk in storage.chunks("big"):
        part = data[start : start + chunk.length]
        if chunk.transformed:  # the checksum covers the stored frames, which check themselves
            stored = env.binding.read(env.binding.open_read(chunk.name), 0, chunk.stored)
            assert chunk.checksum == crc32c.crc32c(stored) and chunk.blocks is None
            assert chunk_contents(storage, chunk) == part
            continue
        assert chunk.checksum == crc32c.crc32c(part)
        assert chunk.blocks == block_checksums.compute(part, storage.config.checksum_block_bytes)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rolling=st.integers(1, 64),
    writes=st.lists(st.binary(min_size=0, max_size=200), min_size=1, max_size=25),
    reads=st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 400)), max_size=20),
    restart_at=st.integers(0, 30),
)
def test_random_writes_and_reads_match_a_bytearray(
    env: Env, rolling: int, writes: list[bytes], reads: list[tuple[int, int]], restart_at: int
) -> None:
    storage = env.open() if not env.instances else env.instances[-1]
    name = f"prop/{next(_NAMES)}"
    storage.create(name, max_rolling_length=rolling)
    handle = storage.open_write(name)
    reference = bytearray()
    for i, data in enumerate(writes):
        if i == restart_at:
            storage = env.reopen()
            handle = storage.open_write(name)
        storage.write(handle, len(reference), data)
        reference += data
    assert storage.info(name).length == len(reference)
    for offset, length in reads:
        offset = offset % (len(reference) + 1)
        length = min(length, len(reference) - offset)
        assert storage.read(handle, offset, length) == reference[offset : offset + length]
    assert_layout(storage, name, bytes(reference))
    assert all(chunk.length <= rolling for _, chunk in storage.chunks(name))


# -- a write and a client's records in one commit -------------------------------------------------


def test_a_write_commits_a_clients_records_with_its_bytes(env: Env) -> None:
    """``also``/``expect``: the records land in the write's own transaction; when ``expect``
    fails, the write raises VersionConflict and neither its bytes nor the records are there."""
    storage = env.open()
    storage.create("s/r")
    handle = storage.open_write("s/r")
    key = b"ml/0"
    storage.write(handle, 0, b"first", also=[Put(OFFLOAD_STREAM_SEGMENTS, key, b"one")])
    stored = env.store.get(OFFLOAD_STREAM_SEGMENTS, key)
    assert stored is not None and stored.value == b"one"
    version = stored.version
    with pytest.raises(VersionConflict):
        storage.write(
            handle,
            5,
            b"second",
            also=[Put(OFFLOAD_STREAM_SEGMENTS, key, b"two")],
            expect=[Expect(OFFLOAD_STREAM_SEGMENTS, key, version + 1)],
        )
    assert storage.info("s/r").length == 5 and storage.read(handle, 0, 5) == b"first"
    assert env.store.get(OFFLOAD_STREAM_SEGMENTS, key) == stored
    storage.write(
        handle,
        5,
        b"second",
        also=[Put(OFFLOAD_STREAM_SEGMENTS, key, b"two"), Delete(OFFLOAD_LEDGERS, b"gone")],
        expect=[Expect(OFFLOAD_STREAM_SEGMENTS, key, version), Expect(OFFLOAD_LEDGERS, b"gone", 0)],
    )
    assert storage.read(handle, 0, 11) == b"firstsecond"
    assert env.store.get(OFFLOAD_STREAM_SEGMENTS, key).value == b"two"
    storage.write(handle, 11, b"", also=[Put(OFFLOAD_STREAM_SEGMENTS, key, b"three")])  # records alone
    assert env.store.get(OFFLOAD_STREAM_SEGMENTS, key).value == b"three" and storage.info("s/r").length == 11


@pytest.mark.parametrize(
    ("also", "expect"),
    [
        ([Put(SEGMENTS, b"s/r", b"x")], []),  # the engine's own tables: never
        ([Delete(CHUNKS, b"c")], []),
        ([], [Expect(GC, b"k", 0)]),
        ([Expect(OFFLOAD_LEDGERS, b"k", 0)], []),  # an expectation among the operations
        ([], [Put(OFFLOAD_LEDGERS, b"k", b"v")]),
        ([Put(OFFLOAD_LEDGERS, "text key", b"v")], []),  # type: ignore[arg-type]
        ([Put(OFFLOAD_LEDGERS, b"k", "text value")], []),  # type: ignore[arg-type]
        ([], [Expect(OFFLOAD_LEDGERS, b"k", True)]),
        (["not an operation"], []),
    ],
)
def test_a_write_refuses_records_outside_the_clients_tables_and_changes_nothing(
    env: Env, also: list[object], expect: list[object]
) -> None:
    storage = env.open()
    storage.create("s/r")
    handle = storage.open_write("s/r")
    storage.write(handle, 0, b"kept")
    before = {table: list(scan_all(env.store, table)) for table in TABLES}
    with pytest.raises(InvalidArgument, match=r"also|clients' tables"):
        storage.write(handle, 4, b"more", also=also, expect=expect)  # type: ignore[arg-type]
    assert {table: list(scan_all(env.store, table)) for table in TABLES} == before
    assert storage.info("s/r").length == 4
