"""Read-ahead for sequential readers (``slts.storage.read_ahead``; issue 17).

Against the filesystem binding and LMDB with read-ahead forced on
(``read_ahead_low_latency``) and small sizes, so that every read crosses parts and
chunks. Each test cites the module's invariant it checks:

1. never stale: sequential reads return exactly the model's bytes while appends grow the
   last chunk, and while truncate, concat, defrag, GC and re-creating the segment change
   the layout under a reader;
2. verified: a flipped byte is reported to the reader whose read covers it (block
   checksums, and the whole-chunk CRC32C of chunks kept without blocks);
3. bounded: the bytes held never pass ``read_ahead_bytes``, with several streams;
4. errors stay with their reader: a failed read-ahead never reaches a read, and a read
   that needs the bytes reports its own error;
5. no thread outlives ``close``, also with parts queued and in flight.

And ``read``'s retry: a read whose chunks vanish under it (defrag and GC between its
resolve and its fetch) gets ``ChunkNotFound`` from the fetch itself and reads again on
the new layout, on the filesystem and on S3.

The S3 side (no HEAD on the read path, ranged GETs within a chunk) is in
``tests/s3/test_read_ahead_s3.py``.
"""

from __future__ import annotations

import mmap
import random
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import wait
from pathlib import Path

import pytest
from slts.bindings.base import ChunkHandle, ChunkStorage
from slts.bindings.faulty import FaultyChunkStorage
from slts.bindings.filesystem import FileSystemChunkStorage
from slts.bindings.memory import MemoryChunkStorage

from slts.admin.verify import verify_segment
from slts.config import StorageConfig
from slts.errors import ChunkCorrupted, InvalidConfig, SegmentTruncated, StorageUnavailable
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.memory_store import MemoryMetadataStore
from slts.metadata.schema import CHUNKS, TABLES, name_key
from slts.metadata.store import MetadataStore, Put
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.read_ahead import STREAMS_MAX, ReadAhead, split
from tests.support.engine import Env, env_fixture

KiB = 1 << 10
BUDGET = 64 * KiB
PART = 8 * KiB
#: Read-ahead on for the filesystem, small enough that reads cross parts, blocks, chunks.
AHEAD = {
    "read_ahead_low_latency": True,
    "read_ahead_bytes": BUDGET,
    "read_ahead_part_bytes": PART,
    "checksum_block_bytes": 1 * KiB,
    "defrag_small_chunk_bytes": 6 * KiB,
}
ROLLING = 16 * KiB

env = env_fixture([("filesystem", "lmdb")])


def pattern(length: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(length)


def segment(storage: ChunkedSegmentStorage, name: str, data: bytes, write_bytes: int = 5 * KiB) -> None:
    """Segment ``name`` holding ``data``, written in pieces of ``write_bytes`` (appends
    fill chunks of ``ROLLING`` bytes)."""
    storage.create(name, max_rolling_length=ROLLING)
    handle = storage.open_write(name)
    for offset in range(0, len(data), write_bytes):
        storage.write(handle, offset, data[offset : offset + write_bytes])


def read_in_order(
    storage: ChunkedSegmentStorage, name: str, start: int, end: int, size: int
) -> Iterator[bytes]:
    handle = storage.open_read(name)
    for offset in range(start, end, size):
        yield storage.read(handle, offset, min(size, end - offset))


def flip(binding: ChunkStorage, chunk: str, offset: int) -> None:
    """Flip one bit of a chunk's stored bytes behind the binding's back (bit rot)."""
    assert isinstance(binding, FileSystemChunkStorage)
    path = Path(binding._path(chunk))
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def read_ahead_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("slts-read-ahead")]


class ReadHook(FaultyChunkStorage):
    """``inner`` with ``hook(chunk, offset, length)`` called before every read (it may
    raise, or block)."""

    def __init__(self, inner: ChunkStorage, hook: Callable[[str, int, int], None]) -> None:
        super().__init__(inner)
        self.hook = hook

    def _do_read(self, handle: ChunkHandle, offset: int, length: int) -> bytes:
        self.hook(handle.name, offset, length)
        return super()._do_read(handle, offset, length)


def in_read_ahead_thread() -> bool:
    return threading.current_thread().name.startswith("slts-read-ahead")


def env_store(tmp_path: Path) -> MetadataStore:
    """The LMDB store the ``env`` fixture would make (for tests that wrap the binding)."""
    return LmdbMetadataStore(str(tmp_path / "metadata"), TABLES)


# -- the configuration -----------------------------------------------------------------------------


def test_read_ahead_is_on_by_default_only_for_high_latency_bindings() -> None:
    class RemoteMemory(MemoryChunkStorage):
        high_latency_reads = True

    quiet = {"gc_interval_s": 0.0, "metadata_log_flush_interval_s": 0.0, "usage_flush_interval_s": 0.0}
    cases = [
        (MemoryChunkStorage(), {}, False),
        (RemoteMemory(), {}, True),
        (MemoryChunkStorage(), {"read_ahead_low_latency": True}, True),
        (RemoteMemory(), {"read_ahead_bytes": 0, "read_ahead_low_latency": True}, False),  # 0: off
    ]
    for binding, config, on in cases:
        settings = StorageConfig(**quiet, **config)  # type: ignore[arg-type]
        with ChunkedSegmentStorage(0, None, binding, MemoryMetadataStore(TABLES), settings) as storage:
            assert (storage.read_ahead_statistics() is not None) == on, (binding, config)
    with pytest.raises(InvalidConfig, match="read_ahead_part_bytes"):
        StorageConfig(read_ahead_bytes=KiB, read_ahead_part_bytes=2 * KiB)


# -- the module on its own ------------------------------------------------------------------------


def test_split_cuts_at_the_multiples_of_the_part_size() -> None:
    assert split(0, 20, 8) == [(0, 8), (8, 8), (16, 4)]
    assert split(5, 12, 8) == [(5, 3), (8, 8), (16, 1)]
    assert split(8, 8, 8) == [(8, 8)]
    assert split(3, 0, 8) == []


class _Piece:
    def __init__(self, chunk: str, chunk_offset: int, length: int) -> None:
        self.chunk, self.chunk_offset, self.length = chunk, chunk_offset, length


def _bytes_of(chunk: str, offset: int, length: int) -> bytes:
    return bytes((hash(chunk) + offset + i) % 251 for i in range(length))


def test_streams_share_the_budget_and_parts_are_found_by_chunk_and_range() -> None:
    """Invariants 1 and 3 on the module alone: one chunk per segment, a fake fetch."""
    ahead = ReadAhead(bytes_max=32, part_bytes=8, threads=2)

    def fetch(piece: _Piece, offset: int, length: int) -> bytes:
        return _bytes_of(piece.chunk, offset, length)

    try:
        assert ahead.follow("a", 0, 4, 1000) is None  # a first read: no stream yet
        plan = ahead.follow("a", 4, 4, 1000)
        assert plan is not None and (plan.start, plan.end) == (8, 8 + 32)
        ahead.prefetch(plan, [_Piece("a-chunk", plan.start, plan.end - plan.start)], fetch)
        assert ahead.statistics().held_bytes == 32
        # A range across two parts is joined; one nobody fetched is not there.
        assert ahead.take("a-chunk", 12, 8) == _bytes_of("a-chunk", 12, 8)
        assert ahead.take("a-chunk", 36, 8) is None  # past what was read ahead
        assert ahead.take("other", 12, 8) is None  # another chunk, same range
        # The part read to its end was released: [8, 16) is gone, [16, 24) stays.
        assert ahead.statistics().held_bytes == 24
        assert ahead.take("a-chunk", 8, 4) is None
        # A part a thread is fetching counts until its fetch ends: let them end, so that
        # what is taken back below is free at once (white box: the parts' futures).
        wait([part.future for parts in ahead._by_chunk.values() for part in parts if part.future])
        # A second stream gets at most an equal share: half of the budget, taken back
        # from the first stream's farthest part.
        ahead.follow("b", 0, 4, 1000)
        second = ahead.follow("b", 4, 4, 1000)
        assert second is not None and second.end - second.start == 16
        ahead.prefetch(second, [_Piece("b-chunk", second.start, 16)], fetch)
        held = ahead.statistics()
        assert held.held_bytes == 32 and held.held_bytes_peak == 32 and held.unused_bytes == 8
        assert ahead.take("b-chunk", 8, 16) == _bytes_of("b-chunk", 8, 16)
        assert ahead.take("a-chunk", 32, 8) is None  # the part taken back
        assert ahead.take("a-chunk", 16, 16) == _bytes_of("a-chunk", 16, 16)
    finally:
        ahead.close()
    assert ahead.statistics().held_bytes == 0 and not read_ahead_threads()


def test_overlapping_parts_of_one_chunk_give_each_byte_once() -> None:
    """Invariant 1 on the module alone: two streams (here two segments sharing a chunk, as
    after a concat) cut the same chunk at different ends, so their parts overlap; a take
    across them returns exactly the bytes asked for, each once (it once joined the overlap
    twice: a longer, wrong result)."""
    ahead = ReadAhead(bytes_max=64, part_bytes=8, threads=2)

    def fetch(piece: _Piece, offset: int, length: int) -> bytes:
        return _bytes_of(piece.chunk, offset, length)

    try:
        ahead.follow("a", 0, 4, 20)
        first = ahead.follow("a", 4, 4, 20)  # the segment ends at 20: parts [8, 16), [16, 20)
        assert first is not None and (first.start, first.end) == (8, 20)
        ahead.prefetch(first, [_Piece("c", 8, 12)], fetch)
        ahead.follow("b", 0, 4, 100)
        second = ahead.follow("b", 4, 4, 100)  # parts [8, 16), [16, 24), ... of the same chunk
        assert second is not None and second.start == 8 and second.end > 24
        ahead.prefetch(second, [_Piece("c", 8, second.end - 8)], fetch)
        # The chunk's parts, in the order they are looked up: "a"'s [8, 16) and [16, 20),
        # then "b"'s [8, 16), [16, 24), ...: [12, 24) is [12, 16) + [16, 20) of "a" and
        # [20, 24) of "b"'s [16, 24), which overlaps "a"'s last part.
        assert ahead.take("c", 12, 12) == _bytes_of("c", 12, 12)
        assert ahead.take("c", 24, 8) == _bytes_of("c", 24, 8)  # "b" alone goes on
    finally:
        ahead.close()


def _stream_of_zeros(ahead: ReadAhead, read_bytes: int) -> None:
    """Two sequential reads of ``read_bytes`` of segment "s" (one chunk, "c", of zeros),
    and what they planned read ahead."""
    ahead.follow("s", 0, read_bytes, 1000)
    plan = ahead.follow("s", read_bytes, read_bytes, 1000)
    assert plan is not None
    ahead.prefetch(plan, [_Piece("c", plan.start, plan.end - plan.start)], lambda p, o, n: bytes(n))


def test_a_forgotten_stream_releases_its_parts() -> None:
    """Invariant 3: a stream pushed out of the table by ``STREAMS_MAX`` others drops its
    parts; a part a thread is fetching counts until its fetch ends (at most one here:
    one thread)."""
    ahead = ReadAhead(bytes_max=64, part_bytes=8, threads=1)
    try:
        _stream_of_zeros(ahead, 8)
        assert ahead.statistics().part_bytes == 64
        for i in range(STREAMS_MAX):  # random reads elsewhere push the stream out
            ahead.follow(f"other-{i}", 0, 1, 10)
        stats = ahead.statistics()
        assert stats.unused_bytes == 64 and stats.held_bytes <= 8 and stats.streams == STREAMS_MAX
        assert ahead.take("c", 16, 8) is None
    finally:
        ahead.close()
    assert ahead.statistics().held_bytes == 0


def test_a_stream_reading_through_held_bytes_keeps_its_place() -> None:
    """``passed``: reads served from a binding's local copy move the stream along and drop
    the parts they passed, so the first read past them plans at once; without it that
    read would start a new stream (nothing planned until the read after)."""
    ahead = ReadAhead(bytes_max=32, part_bytes=8, threads=1)
    try:
        _stream_of_zeros(ahead, 4)
        wait([part.future for parts in ahead._by_chunk.values() for part in parts if part.future])
        ahead.passed("s", 8, 16)  # [8, 24) read from the local copy: its parts are dropped
        assert ahead.take("c", 8, 8) is None and ahead.statistics().held_bytes == 16
        after = ahead.follow("s", 24, 4, 1000)
        assert after is not None and after.start == 40, "the first read past them plans at once"
        ahead.passed("t", 0, 4)  # no stream there: nothing happens
        assert ahead.follow("t", 4, 4, 1000) is None
    finally:
        ahead.close()
    assert ahead.statistics().held_bytes == 0


# -- the engine: bytes, layout changes -------------------------------------------------------------


@pytest.mark.parametrize("size", [1000, 4 * KiB, 8 * KiB, 3 * ROLLING + 7])
def test_sequential_reads_return_exactly_the_bytes_written(env: Env, size: int) -> None:
    """Invariant 1 (and 2: every part was checked): reads of any size, across parts,
    blocks and chunks, by a fresh instance (cold: nothing cached, nothing read ahead)."""
    data = pattern(300 * KiB + 123, seed=size)
    segment(env.open(**AHEAD), "s", data)
    reader = env.reopen(**AHEAD)
    assert b"".join(read_in_order(reader, "s", 0, len(data), size)) == data
    stats = reader.read_ahead_statistics()
    assert stats is not None
    # Some bytes came from read-ahead; how many depends on the threads' schedule (a part
    # still held when the budget is needed delays the next), so no share is asserted.
    assert stats.hits > 0 and stats.hit_bytes > 0
    assert stats.failures == 0 and stats.held_bytes_peak <= BUDGET


def test_a_reader_following_appends_never_sees_stale_bytes(env: Env) -> None:
    """Invariant 1: the last chunk grows between reads (filesystem append); parts read
    below its earlier length never stand for bytes past it."""
    storage = env.open(**AHEAD)
    storage.create("s", max_rolling_length=1 << 20)  # one chunk, appended to
    writer, reader = storage.open_write("s"), storage.open_read("s")
    model = bytearray()
    position = 0
    rng = random.Random(7)
    for step in range(300):
        data = rng.randbytes(rng.randint(1, 3 * KiB))
        storage.write(writer, len(model), data)
        model += data
        while position < len(model) and rng.random() < 0.7:
            size = min(rng.randint(1, 6 * KiB), len(model) - position)
            assert storage.read(reader, position, size) == model[position : position + size], step
            position += size
    assert len(storage.chunks("s")) == 1
    stats = storage.read_ahead_statistics()
    assert stats is not None and stats.hits > 0


@pytest.mark.parametrize("seed", range(4))
def test_reads_stay_exact_while_the_layout_changes(env: Env, seed: int) -> None:
    """Invariant 1: a read-only reader follows a segment while its owner appends,
    truncates, concatenates, defragments, collects the old chunks and re-creates the
    segment with other bytes under the same name; every read equals the model."""
    rng = random.Random(seed)
    owner = env.open(**AHEAD, gc_delay_s=0.0)
    model = bytearray(pattern(80 * KiB, seed))
    segment(owner, "s", bytes(model))
    start = 0
    reader = ChunkedSegmentStorage(0, None, env.binding, env.store, StorageConfig(**AHEAD), read_only=True)
    env.instances.append(reader)
    handle = reader.open_read("s")
    position = 0
    sources = 0
    for step in range(120):
        action = rng.choice(["read"] * 6 + ["append", "truncate", "concat", "defrag", "gc", "recreate"])
        where = f"seed {seed}, step {step}, {action}"
        if action == "read" and position < len(model):
            size = min(rng.choice([700, 4 * KiB, 9 * KiB]), len(model) - position)
            assert reader.read(handle, position, size) == model[position : position + size], where
            position += size
        elif action == "append":
            data = rng.randbytes(rng.randint(1, 10 * KiB))
            owner.write(owner.open_write("s"), len(model), data)
            model += data
        elif action == "truncate" and len(model) > start:
            start = rng.randint(start, len(model))
            owner.truncate(owner.open_write("s"), start)
            if position < start:
                with pytest.raises(SegmentTruncated):
                    reader.read(handle, position, 1)
                position = start
        elif action == "concat":
            sources += 1
            source, data = f"source-{sources}", rng.randbytes(rng.randint(1, 12 * KiB))
            owner.create(source, max_rolling_length=rng.choice([2 * KiB, ROLLING]))
            owner.write(owner.open_write(source), 0, data)
            owner.seal(owner.open_write(source))
            owner.concat(owner.open_write("s"), len(model), source)
            model += data
        elif action == "defrag":
            owner.defrag("s")
        elif action == "gc":
            env.clock.advance(1.0)
            owner.gc.run_once()  # old chunks go: parts of them still hold their right bytes
        elif action == "recreate":
            owner.delete(owner.open_write("s"))
            model = bytearray(pattern(len(model), seed + 1000 + step))  # same length, other bytes
            segment(owner, "s", bytes(model))
            start = 0
        info = reader.info("s")
        assert (info.start_offset, info.length) == (start, len(model)), where
    stats = reader.read_ahead_statistics()
    assert stats is not None and stats.held_bytes_peak <= BUDGET


@pytest.mark.parametrize("call", ["read", "read_view"])
@pytest.mark.parametrize("seed", range(3))
def test_concurrent_readers_get_exact_bytes_while_the_owner_changes_the_layout(
    env: Env, seed: int, call: str
) -> None:
    """Invariant 1 with threads: two readers (one on the owner, one on a read-only
    instance) read a segment in order, jumping to another place now and then (each jump
    starts a stream whose parts overlap the older streams' parts of the same chunks),
    while the owner appends, concatenates, truncates, defragments and collects. Every
    read returns exactly the model's bytes, or ``SegmentTruncated`` below the start (it
    once returned a piece longer than asked for: an ``AssertionError``, and under ``-O``
    wrong bytes). With ``read_view`` (views of the chunk files' mappings on the
    filesystem), the views kept meanwhile still hold their bytes after GC deleted the
    chunks they were cut from."""
    owner = env.open(**AHEAD, gc_delay_s=0.0)
    observer = ChunkedSegmentStorage(0, None, env.binding, env.store, StorageConfig(**AHEAD), read_only=True)
    env.instances.append(observer)
    model = bytearray(pattern(64 * KiB, seed))
    segment(owner, "s", bytes(model))
    stop = threading.Event()
    failures: list[BaseException] = []
    reads = [0, 0]
    kept: list[tuple[memoryview | bytes, bytes]] = []

    def read_along(storage: ChunkedSegmentStorage, index: int) -> None:
        rng = random.Random(seed * 10 + index)
        handle = storage.open_read("s")
        position = 0
        try:
            while not stop.is_set():
                info = storage.info("s")
                if position < info.start_offset or position >= info.length or rng.random() < 0.05:
                    position = rng.randint(info.start_offset, max(info.start_offset, info.length - 1))
                size = min(rng.choice([3 * KiB, 6 * KiB, 11 * KiB]), info.length - position)
                if size <= 0:
                    continue
                try:
                    data = getattr(storage, call)(handle, position, size)
                except SegmentTruncated:
                    continue
                # The model only grows and is extended before the owner commits: the bytes
                # below any committed length are final.
                assert data == model[position : position + size], (index, position, size, len(data))
                if reads[index] % 4 == 0:
                    kept.append((data, bytes(model[position : position + size])))
                position += size
                reads[index] += 1
        except BaseException as exc:
            failures.append(exc)
            stop.set()

    readers = [threading.Thread(target=read_along, args=(s, i)) for i, s in enumerate((owner, observer))]
    for reader in readers:
        reader.start()
    rng = random.Random(seed)
    writer = owner.open_write("s")
    try:
        for step in range(200):
            if stop.is_set():
                break
            action = rng.choice(["append"] * 3 + ["concat", "truncate", "defrag", "gc"])
            if action == "append":
                data = rng.randbytes(rng.randint(1, 12 * KiB))
                model += data
                owner.write(writer, len(model) - len(data), data)
            elif action == "concat":
                source, data = f"source-{step}", rng.randbytes(rng.randint(1, 12 * KiB))
                owner.create(source, max_rolling_length=rng.choice([2 * KiB, ROLLING]))
                owner.write(owner.open_write(source), 0, data)
                owner.seal(owner.open_write(source))
                model += data
                owner.concat(writer, len(model) - len(data), source)
            elif action == "truncate":
                owner.truncate(writer, max(owner.info("s").start_offset, len(model) - 40 * KiB))
            elif action == "defrag":
                owner.defrag("s")
            else:
                env.clock.advance(1.0)
                owner.gc.run_once()
    finally:
        stop.set()
        for reader in readers:
            reader.join()
    if failures:
        raise failures[0]
    assert all(count > 0 for count in reads), reads
    assert verify_segment(owner, "s", checksums=True) == []
    env.clock.advance(1.0)
    owner.gc.run_once()  # the chunks of the kept views' ranges go, if they left the layout
    assert kept and all(data == expected for data, expected in kept)
    mapped = [data for data, _ in kept if isinstance(data, memoryview) and isinstance(data.obj, mmap.mmap)]
    assert (call == "read_view") == bool(mapped), (call, len(mapped), len(kept))


retry_env = env_fixture([("filesystem", "lmdb"), ("s3", "lmdb")])


def test_a_read_whose_chunks_vanish_under_it_retries_on_the_new_layout(retry_env: Env) -> None:
    """``read``'s retry: the layout a read resolved is defragmented and its chunks
    collected before its fetch reaches the chunk storage; the fetch gets ``ChunkNotFound``
    (on S3 from the GET itself, no HEAD before it), and the read, resolved again, returns
    the right bytes. Read-ahead is on (forced on the filesystem, the default on S3)."""
    armed = threading.Event()

    def change_layout_first(chunk: str, offset: int, length: int) -> None:
        if armed.is_set() and not in_read_ahead_thread():
            armed.clear()
            owner.defrag("s")
            environment.clock.advance(1.0)
            owner.gc.run_once()
            assert not retry_env.binding.exists(chunk)  # the read goes on with a vanished chunk

    environment = Env(ReadHook(retry_env.binding, change_layout_first), retry_env.store, retry_env.clock)
    owner = environment.open(**AHEAD, gc_delay_s=0.0, concat_merge_seam=False)
    try:
        owner.create("s", max_rolling_length=ROLLING)
        data = b""
        for index in range(4):  # four chunks of 2 KiB: defrag merges them
            piece = pattern(2 * KiB, seed=20 + index)
            owner.create(f"part{index}")
            owner.write(owner.open_write(f"part{index}"), 0, piece)
            owner.seal(owner.open_write(f"part{index}"))
            owner.concat(owner.open_write("s"), len(data), f"part{index}")
            data += piece
        before = [chunk.name for _, chunk in owner.chunks("s")]
        assert len(before) == 4
        handle = owner.open_read("s")
        assert owner.read(handle, 0, 2 * KiB) == data[: 2 * KiB]  # the layout is cached now
        armed.set()
        assert owner.read(handle, 2 * KiB, 2 * KiB) == data[2 * KiB : 4 * KiB]
        assert not armed.is_set()  # the layout did change under the read
        vanished = set(before) - {chunk.name for _, chunk in owner.chunks("s")}
        assert vanished and not any(retry_env.binding.exists(name) for name in vanished)
        assert owner.read(handle, 4 * KiB, 4 * KiB) == data[4 * KiB :]
    finally:
        owner.close()


# -- checksums and errors -----------------------------------------------------------------------


def test_a_flipped_byte_is_reported_to_the_reader_that_covers_it(env: Env) -> None:
    """Invariants 2 and 4: the part holding the flipped byte fails its block checksum in
    the background, which no read sees; the read that covers the byte reports it
    itself; reads before and after it return their bytes."""
    data = pattern(160 * KiB, seed=3)
    segment(env.open(**AHEAD), "s", data)
    storage = env.reopen(**AHEAD)
    chunks = storage.chunks("s")
    start, chunk = chunks[3]
    flip(env.binding, chunk.name, 100)
    bad = start + 100
    handle = storage.open_read("s")
    for offset in range(0, len(data), 2 * KiB):
        size = min(2 * KiB, len(data) - offset)
        if offset <= bad < offset + size:
            with pytest.raises(ChunkCorrupted) as caught:
                storage.read(handle, offset, size)
            assert caught.value.chunk == chunk.name
        else:
            assert storage.read(handle, offset, size) == data[offset : offset + size]
    stats = storage.read_ahead_statistics()
    assert stats is not None and stats.failures >= 1  # the part was read ahead, and failed
    assert stats.hits > 0


def test_a_whole_chunk_kept_without_blocks_is_checked_when_read_ahead(env: Env) -> None:
    """Invariant 2: a chunk written before block checksums is verified by a read of the
    whole chunk, also when read-ahead assembled it from parts."""
    data = pattern(6 * ROLLING, seed=4)
    owner = env.open(**AHEAD)
    segment(owner, "s", data, write_bytes=ROLLING)
    for _, chunk in owner.chunks("s"):  # as if written before block checksums
        owner._store.commit([Put(CHUNKS, name_key(chunk.name), chunk.replace(blocks=None).encode())])
    _, chunk = owner.chunks("s")[4]
    flip(env.binding, chunk.name, ROLLING - 1)
    storage = env.reopen(**AHEAD)
    reads = read_in_order(storage, "s", 0, len(data), ROLLING)  # one whole chunk per read
    for index in range(4):
        assert next(reads) == data[index * ROLLING : (index + 1) * ROLLING]
    with pytest.raises(ChunkCorrupted):
        next(reads)
    stats = storage.read_ahead_statistics()
    assert stats is not None and stats.hits >= 2  # the reads before came from parts


def test_a_failed_read_ahead_never_reaches_a_read(tmp_path: Path) -> None:
    """Invariant 4: every read-ahead of one chunk fails; all reads still return their
    bytes (the reader fetched that chunk itself), and the failures were counted."""
    poisoned: set[str] = set()

    def fail_ahead(chunk: str, offset: int, length: int) -> None:
        if chunk in poisoned and in_read_ahead_thread():
            raise StorageUnavailable(f"read-ahead of {chunk} refused by the test")

    binding = ReadHook(FileSystemChunkStorage(str(tmp_path / "chunks")), fail_ahead)
    environment = Env(binding, env_store(tmp_path))
    try:
        data = pattern(120 * KiB, seed=5)
        segment(environment.open(**AHEAD), "s", data)
        storage = environment.reopen(**AHEAD)
        poisoned.add(storage.chunks("s")[2][1].name)
        assert b"".join(read_in_order(storage, "s", 0, len(data), 3 * KiB)) == data
        stats = storage.read_ahead_statistics()
        assert stats is not None and stats.failures >= 1 and stats.hits > 0
        # A chunk whose every read fails: the reads that need it report the error;
        # reads of other chunks, read ahead past it, do not.
        storage = environment.reopen(**AHEAD)
        broken_start, broken = storage.chunks("s")[2]
        poisoned.clear()

        def fail_all(chunk: str, offset: int, length: int) -> None:
            if chunk == broken.name:
                raise StorageUnavailable("chunk unreachable (test)")

        binding.hook = fail_all
        handle = storage.open_read("s")
        for offset in range(0, len(data), 3 * KiB):
            size = min(3 * KiB, len(data) - offset)
            if offset < broken_start + broken.length and broken_start < offset + size:
                with pytest.raises(StorageUnavailable):
                    storage.read(handle, offset, size)
            else:
                assert storage.read(handle, offset, size) == data[offset : offset + size]
    finally:
        for instance in environment.instances:
            instance.close()
        environment.store.close()


# -- memory and threads ---------------------------------------------------------------------------


def test_the_bytes_held_never_pass_the_budget_with_several_readers(env: Env) -> None:
    """Invariant 3: four threads read four segments in order at once; the bytes held
    (buffered or in flight) stay within ``read_ahead_bytes`` at every read."""
    budget = 32 * KiB
    config = {**AHEAD, "read_ahead_bytes": budget}
    owner = env.open(**config)
    datas = {f"s{i}": pattern(96 * KiB, seed=10 + i) for i in range(4)}
    for name, data in datas.items():
        segment(owner, name, data)
    storage = env.reopen(**config)
    over: list[int] = []
    wrong: list[str] = []

    def read(name: str) -> None:
        data = datas[name]
        handle = storage.open_read(name)
        for offset in range(0, len(data), 2 * KiB):
            if storage.read(handle, offset, 2 * KiB) != data[offset : offset + 2 * KiB]:
                wrong.append(f"{name}@{offset}")
            stats = storage.read_ahead_statistics()
            assert stats is not None
            if stats.held_bytes > budget:
                over.append(stats.held_bytes)

    threads = [threading.Thread(target=read, args=(name,)) for name in datas]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = storage.read_ahead_statistics()
    assert stats is not None
    assert not wrong and not over
    assert stats.parts > 0 and 0 < stats.held_bytes_peak <= budget


def test_no_read_ahead_thread_outlives_close(tmp_path: Path) -> None:
    """Invariant 5: one read-ahead thread is stuck in a read, more parts are queued
    behind it, and the instance closes: the queued parts are dropped, the stuck one
    finishes, and then no read-ahead thread is left and nothing is held."""
    entered, release = threading.Event(), threading.Event()

    def block_ahead(chunk: str, offset: int, length: int) -> None:
        if in_read_ahead_thread():
            entered.set()
            release.wait()

    binding = ReadHook(FileSystemChunkStorage(str(tmp_path / "chunks")), block_ahead)
    environment = Env(binding, env_store(tmp_path))
    config = {**AHEAD, "read_threads": 1}
    try:
        data = pattern(96 * KiB, seed=6)
        segment(environment.open(**config), "s", data)
        storage = environment.reopen(**config)
        handle = storage.open_read("s")
        assert storage.read(handle, 0, KiB) == data[:KiB]
        assert storage.read(handle, KiB, KiB) == data[KiB : 2 * KiB]  # in order: parts submitted
        assert entered.wait(timeout=60)
        stats = storage.read_ahead_statistics()
        assert stats is not None and stats.parts >= 2 and len(read_ahead_threads()) == 1
        closer = threading.Thread(target=storage.close)
        closer.start()
        release.set()
        closer.join()
        assert not read_ahead_threads()
        stats = storage.read_ahead_statistics()
        assert stats is not None and stats.held_bytes == 0 and stats.streams == 0
    finally:
        release.set()
        for instance in environment.instances:
            instance.close()
        environment.store.close()
    assert not read_ahead_threads()


def test_a_read_of_the_wrong_length_raises_even_under_python_O(tmp_path: Path) -> None:
    """A read's length never rests on an ``assert``: with a bug planted in read-ahead (its
    ``take`` hands back one byte too many), a read under ``python -O`` (asserts off)
    raises ``InvariantViolated`` naming the chunk, instead of returning the wrong bytes."""
    script = f"""
import sys
from slts.bindings.filesystem import FileSystemChunkStorage
from slts.config import StorageConfig
from slts.errors import InvariantViolated
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.schema import TABLES
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.read_ahead import ReadAhead

assert not __debug__, "run with -O"
take = ReadAhead.take
ReadAhead.take = lambda self, *args: (lambda data: None if data is None else data + b"!")(take(self, *args))
config = StorageConfig(**{AHEAD!r}, gc_interval_s=0.0, metadata_log_flush_interval_s=0.0)
store = LmdbMetadataStore({str(tmp_path / "metadata")!r}, TABLES)
storage = ChunkedSegmentStorage(0, None, FileSystemChunkStorage({str(tmp_path / "chunks")!r}), store, config)
storage.create("s")
handle = storage.open_write("s")
storage.write(handle, 0, bytes(range(256)) * 256)
for offset in range(0, 64 * 1024, 1024):
    try:
        data = storage.read(handle, offset, 1024)
    except InvariantViolated as error:
        print("raised", error.chunk)
        sys.exit(0)
    assert len(data) == 1024, len(data)  # not reached with asserts off: checked by the exit code
print("no error")
sys.exit(1)
"""
    done = subprocess.run([sys.executable, "-O", "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("raised ")


def test_parts_held_locally_are_passed_over_once() -> None:
    """Parts the binding holds (``held``) are never fetched nor counted in the budget; the
    stream's frontier moves past them, so the next reads plan only what follows them, and
    a part not held after them is fetched as usual."""
    ahead = ReadAhead(bytes_max=32, part_bytes=8, threads=2)
    fetched: list[tuple[int, int]] = []

    def fetch(piece: _Piece, offset: int, length: int) -> bytes:
        fetched.append((offset, length))
        return _bytes_of(piece.chunk, offset, length)

    def held(chunk: str, offset: int, length: int) -> bool:
        return offset + length <= 48  # the binding holds the chunk's first 48 bytes

    try:
        assert ahead.follow("s", 0, 4, 1000) is None
        plan = ahead.follow("s", 4, 4, 1000)
        assert plan is not None and (plan.start, plan.end) == (8, 40)
        ahead.prefetch(plan, [_Piece("c", 8, 32)], fetch, held)
        stats = ahead.statistics()
        assert stats.local_parts == 4 and stats.parts == 0 and stats.held_bytes == 0 and not fetched
        # The next read adds 4 bytes to the window: less than a part, nothing to plan
        # (the held parts are not planned again).
        assert ahead.follow("s", 8, 4, 1000) is None
        plan = ahead.follow("s", 12, 8, 1000)
        assert plan is not None and (plan.start, plan.end) == (40, 20 + 32)
        ahead.prefetch(plan, [_Piece("c", 40, 12)], fetch, held)
        assert ahead.statistics().local_parts == 5  # [40, 48) held; [48, 52) fetched
        assert ahead.take("c", 48, 4) == _bytes_of("c", 48, 4)
        assert fetched == [(48, 4)]
    finally:
        ahead.close()
