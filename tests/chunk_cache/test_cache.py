"""The chunk cache over a counting binding (``slts.bindings.chunk_cache``): what it serves,
what it fetches, and what it drops. The inner binding is the memory binding behind the
seeded ``FaultyChunkStorage`` with no rules, whose ``calls`` count what reaches it; fills
are awaited with ``drain`` (no sleeps)."""

from __future__ import annotations

import errno
import os
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import crc32c
import pytest
from slts.bindings import ChunkHandle
from slts.bindings.chunk_cache import CachedChunkStorage, ChunkCache, acquire, files, release
from slts.bindings.chunk_cache.filler import Filler
from slts.bindings.faulty import FaultyChunkStorage

from slts.errors import (
    ChunkCorrupted,
    ChunkInvalidOffset,
    ChunkNameInvalid,
    ChunkNotFound,
    InvalidArgument,
    InvalidConfig,
)
from tests.support.chunk_cache import RemoteMemoryChunkStorage, cached
from tests.support.conformance import pattern

KiB = 1 << 10
BLOCK = 64 * KiB
DATA = pattern(5 * BLOCK + 1234)


@pytest.fixture
def inner() -> FaultyChunkStorage:
    return FaultyChunkStorage(RemoteMemoryChunkStorage("memory://cache-test"), seed=7)


@pytest.fixture(params=[True, False], ids=["direct-fills", "buffered-fills"])
def storage(
    inner: FaultyChunkStorage, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[CachedChunkStorage]:
    """A cache whose fills are written with ``O_DIRECT`` (where the file system takes it),
    and one whose fills go through the page cache (file systems that refuse it)."""
    with cached(
        inner, tmp_path / "cache", capacity_bytes=1 << 20, block_bytes=BLOCK, direct_fills=request.param
    ) as wrapper:
        assert wrapper.cache.direct_writes == (request.param and files.direct_writes_work(wrapper.cache.root))
        yield wrapper  # type: ignore[misc]


def reads_of(inner: FaultyChunkStorage) -> int:
    return inner.calls["read"]


def test_a_read_again_is_served_from_the_cache(storage, inner) -> None:
    storage.create("c", DATA)
    handle = storage.open_read("c")
    assert storage.read(handle, 0, len(DATA)) == DATA  # a miss: from the binding, one read
    assert reads_of(inner) == 1
    storage.cache.drain()
    for offset, length in [(0, len(DATA)), (1, 10), (BLOCK - 3, 7), (4 * BLOCK, BLOCK + 1234)]:
        assert storage.read(handle, offset, length) == DATA[offset : offset + length]
        assert storage.read_view(handle, offset, length).tobytes() == DATA[offset : offset + length]
    assert reads_of(inner) == 1
    statistics = storage.chunk_cache_statistics()
    assert (statistics.hits, statistics.misses, statistics.fills) == (8, 1, 6)
    assert statistics.bytes <= statistics.capacity_bytes


def test_a_miss_sends_the_binding_exactly_the_read_it_would_get_without_the_cache(storage, inner) -> None:
    storage.create("c", DATA)
    handle = storage.open_read("c")
    assert storage.read(handle, 100, 300) == DATA[100:400]
    storage.cache.drain()
    # Held: [100, 400) only. A read beyond it, and a read clipped at the chunk's end (the
    # cache never knows a chunk's length), go to the binding, as they are.
    assert storage.read(handle, 50, 100) == DATA[50:150]
    assert storage.read(handle, len(DATA) - 5, 100) == DATA[-5:]
    assert storage.read(handle, len(DATA), 10) == b""
    assert reads_of(inner) == 4
    storage.cache.drain()
    assert storage.read(handle, 50, 350) == DATA[50:400]  # the two runs merged: [50, 400)
    assert reads_of(inner) == 4


def test_runs_that_touch_merge_and_a_sequential_reader_fills_whole_blocks(storage, inner) -> None:
    storage.create("c", DATA)
    handle = storage.open_read("c")
    for offset in range(0, len(DATA), 10 * KiB):
        storage.read(handle, offset, min(10 * KiB, len(DATA) - offset))
        storage.cache.drain()
    before = reads_of(inner)
    assert storage.read(handle, 0, len(DATA)) == DATA
    assert reads_of(inner) == before
    assert [(file.start, file.end) for file in storage.cache.index.files()] == [
        (block * BLOCK, min(len(DATA), (block + 1) * BLOCK)) for block in range(6)
    ]


def test_every_change_through_the_wrapper_drops_the_chunk(storage, inner) -> None:
    """Invariant 1 of the cache: delete, append and truncate invalidate; a deleted chunk's
    bytes are never served (its read is the binding's ChunkNotFound)."""
    storage.create("c", DATA)
    handle = storage.open_write("c")
    for change in (
        lambda: storage.write(handle, len(DATA), b"more"),
        lambda: storage.truncate(handle, len(DATA)),
        lambda: storage.delete(handle),
    ):
        storage.read(handle, 0, 1000)
        storage.cache.drain()
        assert storage.chunk_cache_statistics().files == 1
        change()
        assert storage.chunk_cache_statistics().files == 0
    with pytest.raises(ChunkNotFound):
        storage.read(handle, 0, 1000)
    assert storage.chunk_cache_statistics().invalidations == 3


def test_a_chunk_found_missing_leaves_the_cache(storage, inner) -> None:
    """Deleted by another process (GC of a newer owner): an ``exists``, ``get_info`` or a
    miss of the chunk that finds it gone drops what the cache holds of it."""
    storage.create("c", DATA)
    handle = storage.open_read("c")
    storage.read(handle, 0, 1000)
    storage.cache.drain()
    inner.inner.delete(inner.inner.open_write("c"))  # behind the cache's back
    assert storage.read(handle, 0, 1000) == DATA[:1000]  # names are never reused: still its bytes
    assert not storage.exists("c")
    assert storage.chunk_cache_statistics().files == 0


def test_a_fill_begun_before_a_change_is_refused(storage, inner) -> None:
    """Invariant 2 of the index: bytes read before a delete never land after it."""
    storage.create("c", DATA)
    cache = storage.cache
    key = cache.key_of(storage.url, "c")
    token = cache.begin()
    cache.invalidate(key)  # the delete (or truncate) lands while the read is in flight
    cache.offer(key, token, 0, DATA[:1000])
    cache.drain()
    assert cache.statistics().stale_fills == 1
    assert cache.read(key, 0, 1000) is None


def test_bytes_that_fail_their_checksum_are_never_served(storage, inner) -> None:
    storage.create("c", DATA)
    handle = storage.open_read("c")
    storage.read(handle, 0, len(DATA))
    storage.cache.drain()
    victim = storage.cache.index.files()[2]
    with open(victim.path, "r+b") as file:
        file.seek(10)
        byte = file.read(1)
        file.seek(10)
        file.write(bytes([byte[0] ^ 0x40]))
    reads = reads_of(inner)
    assert storage.read(handle, 0, len(DATA)) == DATA  # from the binding
    assert reads_of(inner) == reads + 1
    statistics = storage.chunk_cache_statistics()
    assert statistics.corruptions == 1 and not os.path.exists(victim.path)


def test_the_size_limit_holds_and_the_least_recently_used_go_first(inner, tmp_path) -> None:
    capacity = 4 * (BLOCK + files.trailer_bytes(BLOCK))
    with cached(inner, tmp_path / "small", capacity_bytes=capacity, block_bytes=BLOCK) as storage:
        for name in "abcde":
            storage.create(name, DATA[:BLOCK])
        handles = {name: storage.open_read(name) for name in "abcde"}
        for name in "abcd":
            storage.read(handles[name], 0, BLOCK)
            storage.cache.drain()
        storage.read(handles["a"], 0, BLOCK)  # a hit: "a" is now the most recent
        storage.read(handles["e"], 0, BLOCK)
        storage.cache.drain()
        statistics = storage.chunk_cache_statistics()
        assert statistics.bytes <= capacity and statistics.evictions == 1
        reads = reads_of(inner)
        for name in "acde":
            storage.read(handles[name], 0, BLOCK)
        assert reads_of(inner) == reads  # "b" went
        on_disk = sum(
            entry.stat().st_size
            for folder in os.scandir(tmp_path / "small" / files.BLOCKS_FOLDER)
            for entry in os.scandir(folder.path)
        )
        assert on_disk == storage.chunk_cache_statistics().bytes <= capacity


def test_a_scan_through_the_cache_leaves_the_re_read_chunks_in_it(inner, tmp_path) -> None:
    """Index invariant 4 through the binding: two chunks read again are kept while a
    scan of twenty one-block chunks (each fetched whole, as read-ahead fetches, then read
    in four pieces in order) passes through a cache of six blocks; under plain LRU the
    scan's last six chunks would be all it held."""
    size = BLOCK + files.trailer_bytes(BLOCK)
    with cached(inner, tmp_path / "small", capacity_bytes=6 * size, block_bytes=BLOCK) as storage:
        for name in ("w0", "w1"):
            storage.create(name, DATA[:BLOCK])
        working = [storage.open_read(name) for name in ("w0", "w1")]
        for _ in range(3):  # fetched and filled, served, served again: re-used
            for handle in working:
                assert storage.read(handle, 0, BLOCK) == DATA[:BLOCK]
                storage.cache.drain()
        assert storage.chunk_cache_statistics().protected_bytes == 2 * size
        for n in range(20):
            data = pattern(BLOCK, seed=n)
            storage.create(f"scan{n}", data)
            scan = storage.open_read(f"scan{n}")
            storage.read(scan, 0, BLOCK)
            storage.cache.drain()
            for piece in range(4):
                start = piece * BLOCK // 4
                assert storage.read(scan, start, BLOCK // 4) == data[start : start + BLOCK // 4]
        statistics = storage.chunk_cache_statistics()
        assert statistics.fills == 22 and statistics.evictions == 16 and statistics.hits == 4 + 80
        assert statistics.protected_bytes == 2 * size
        reads = reads_of(inner)
        for handle in working:
            assert storage.read(handle, 0, BLOCK) == DATA[:BLOCK]
        assert reads_of(inner) == reads  # both served from the cache


def test_a_clean_restart_keeps_the_protected_files_protected(inner, tmp_path) -> None:
    """The protected files' names are saved at close and taken at the next open (index
    invariant 4): a re-used chunk stays protected across a clean restart; the list is
    used once, and a list that cannot be read is ignored."""
    folder = tmp_path / "cache"
    with cached(inner, folder, block_bytes=BLOCK) as storage:
        storage.create("hot", DATA[:BLOCK])
        storage.create("cold", DATA[:BLOCK])
        for _ in range(3):
            storage.read(storage.open_read("hot"), 0, BLOCK)
            storage.cache.drain()
        storage.read(storage.open_read("cold"), 0, BLOCK)
        storage.cache.drain()
        hot = storage.cache.index.protected()
        assert len(hot) == 1 and hot[0].key == storage.cache.key_of(storage.url, "hot")
    assert (folder / files.PROTECTED_FILE).exists()
    with cached(inner, folder, block_bytes=BLOCK) as storage:
        assert storage.cache.index.protected() == hot and len(storage.cache.index) == 2
        assert not (folder / files.PROTECTED_FILE).exists()  # taken once
    (folder / files.PROTECTED_FILE).write_bytes(b"\xff\xfe not ascii")
    with cached(inner, folder, block_bytes=BLOCK) as storage:
        assert storage.cache.index.protected() == [] and len(storage.cache.index) == 2


def test_a_chunk_larger_than_the_cache_is_not_cached(inner, tmp_path) -> None:
    capacity = 2 * (BLOCK + files.trailer_bytes(BLOCK))
    with cached(inner, tmp_path / "small", capacity_bytes=capacity, block_bytes=BLOCK) as storage:
        storage.create("big", DATA)
        storage.read(storage.open_read("big"), 0, len(DATA))
        storage.cache.drain()
        assert all(file.end <= capacity for file in storage.cache.index.files())


def test_a_restart_serves_what_was_cached_and_drops_what_is_damaged(inner, tmp_path) -> None:
    folder = tmp_path / "cache"
    with cached(inner, folder, block_bytes=BLOCK) as storage:
        storage.create("c", DATA)
        storage.read(storage.open_read("c"), 0, len(DATA))
        storage.cache.drain()
        held = storage.cache.index.files()
    first_block = next(file for file in held if file.start == 0)  # (fills end in any order)
    os.truncate(first_block.path, 10)  # torn: dropped at the restart
    (folder / files.TMP_FOLDER / "99.tmp").write_bytes(b"a fill the kill cut short")
    with cached(inner, folder, block_bytes=BLOCK) as storage:
        assert storage.chunk_cache_statistics().files == len(held) - 1
        assert os.listdir(folder / files.TMP_FOLDER) == []
        reads = reads_of(inner)
        assert storage.read(storage.open_read("c"), BLOCK, len(DATA) - BLOCK) == DATA[BLOCK:]
        assert reads_of(inner) == reads


def test_a_restart_with_less_room_keeps_the_most_recently_used(inner, tmp_path) -> None:
    """The restart's LRU order comes from the files' modification times."""
    folder = tmp_path / "cache"
    with cached(inner, folder, block_bytes=BLOCK) as storage:
        for name in "abc":
            storage.create(name, DATA[:BLOCK])
            storage.read(storage.open_read(name), 0, BLOCK)
            storage.cache.drain()
        paths = {file.path: file for file in storage.cache.index.files()}
    for age, path in enumerate(sorted(paths, key=lambda p: "bca".index(_name_of(paths[p], storage)))):
        os.utime(path, (1_000_000 + age, 1_000_000 + age))  # b oldest, then c, a most recent
    size = BLOCK + files.trailer_bytes(BLOCK)
    with cached(inner, folder, capacity_bytes=2 * size, block_bytes=BLOCK) as storage:
        keys = {file.key for file in storage.cache.index.files()}
        assert keys == {storage.cache.key_of(storage.url, name) for name in "ca"}


def _name_of(file: files.CacheFile, storage: CachedChunkStorage) -> str:
    return next(name for name in "abc" if storage.cache.key_of(storage.url, name) == file.key)


def test_one_process_per_folder_and_one_cache_per_folder_in_a_process(tmp_path) -> None:
    folder = str(tmp_path / "cache")
    first = acquire(folder, 1 << 20, BLOCK, 1, 1 << 20)
    try:
        assert acquire(folder, 1 << 20, BLOCK, 1, 1 << 20) is first
        release(first)
        with pytest.raises(InvalidConfig, match="open in this process with capacity"):
            acquire(folder, 2 << 20, BLOCK, 1, 1 << 20)
        # Another process: flock locks are per open file, so a second ChunkCache on the
        # folder in this process meets the lock as another process would.
        with pytest.raises(InvalidConfig, match="in use by another process"):
            ChunkCache(folder, 1 << 20, BLOCK)
    finally:
        release(first)
    ChunkCache(folder, 1 << 20, BLOCK).close()  # released with the last reference


def test_a_folder_that_cannot_be_used_is_refused(tmp_path) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(InvalidConfig, match="cannot be used"):
        ChunkCache(str(tmp_path / "file" / "cache"), 1 << 20, BLOCK)


def test_a_disk_error_while_filling_is_counted_and_the_read_unharmed(storage, inner, monkeypatch) -> None:
    def full(*args: object, **kwargs: object) -> files.CacheFile:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "write", full)
    storage.create("c", DATA)
    assert storage.read(storage.open_read("c"), 0, 3 * BLOCK) == DATA[: 3 * BLOCK]
    storage.cache.drain()
    statistics = storage.chunk_cache_statistics()
    assert (statistics.fill_errors, statistics.files, statistics.bytes) == (3, 0, 0)
    assert storage.cache.index.claimed == 0


def test_fills_beyond_the_bytes_in_flight_are_dropped_not_waited_for() -> None:
    """The filler's invariants 1 and 2."""
    filler = Filler(1, 100)
    gate = threading.Event()
    done: list[int] = []
    assert filler.submit(60, gate.wait, lambda: done.append(1))
    assert not filler.submit(50, lambda: None, lambda: done.append(2))  # 110 > 100: dropped
    assert filler.submit(40, lambda: None, lambda: done.append(3))
    assert not filler.submit(1, lambda: None, lambda: done.append(4))
    gate.set()
    filler.drain()
    assert sorted(done) == [1, 3] and filler.pending_bytes == 0
    filler.close()
    assert not filler.submit(1, lambda: None, lambda: done.append(5))


@pytest.mark.parametrize(
    ("offset", "length"), [(0, 5 * BLOCK), (100, BLOCK), (BLOCK - 5, 2 * BLOCK + 9), (3, 10)]
)
def test_read_into_serves_the_cached_bytes_straight_into_the_view(storage, inner, offset, length) -> None:
    storage.create("c", DATA)
    storage.read(storage.open_read("c"), 0, len(DATA))
    storage.cache.drain()
    reads = reads_of(inner)
    assert storage.holds("c", offset, length) and not storage.holds("c", 0, len(DATA) + 1)
    buffer = bytearray(length)
    assert storage.read_into(storage.open_read("c"), offset, memoryview(buffer)) == length
    assert bytes(buffer) == DATA[offset : offset + length]
    assert reads_of(inner) == reads, "served from the cache"


def test_read_into_of_a_damaged_file_reads_the_storage_and_drops_the_file(storage, inner) -> None:
    storage.create("c", DATA)
    storage.read(storage.open_read("c"), 0, len(DATA))
    storage.cache.drain()
    damaged = next(file for file in storage.cache.index.files() if file.start == BLOCK)
    with open(damaged.path, "r+b") as file:
        file.seek(100)
        file.write(b"\x00\xff\x00")
    reads = reads_of(inner)
    buffer = bytearray(2 * BLOCK)
    assert storage.read_into(storage.open_read("c"), BLOCK - 7, memoryview(buffer)) == 2 * BLOCK
    assert bytes(buffer) == DATA[BLOCK - 7 : 3 * BLOCK - 7]
    assert reads_of(inner) == reads + 1, "the damaged file was not served"
    assert not storage.holds("c", BLOCK, 10)


def test_a_read_verified_by_its_caller_is_served_unchecked_until_distrusted(storage, inner) -> None:
    """``verified_by_caller``: a hit skips the cache's CRC32C (the caller's checksums are
    the check), so a damaged file's bytes reach the caller, who ``distrust``s them: the
    files go (counted as corruptions) and the read again gets the binding's bytes."""
    storage.create("c", DATA)
    storage.read(storage.open_read("c"), 0, len(DATA))
    storage.cache.drain()
    damaged = next(file for file in storage.cache.index.files() if file.start == BLOCK)
    with open(damaged.path, "r+b") as file:
        file.seek(100)
        file.write(b"\x00\xff\x00")
    reads = reads_of(inner)
    buffer = bytearray(2 * BLOCK)
    handle = storage.open_read("c")
    assert storage.read_into(handle, BLOCK - 7, memoryview(buffer), verified_by_caller=True) == 2 * BLOCK
    assert bytes(buffer) != DATA[BLOCK - 7 : 3 * BLOCK - 7], "served without the cache's check"
    assert reads_of(inner) == reads
    statistics = storage.chunk_cache_statistics()
    assert statistics.caller_checked_hits == 1 and statistics.corruptions == 0
    assert storage.distrust("c", BLOCK - 7, 2 * BLOCK)
    assert not storage.holds("c", BLOCK, 10) and not os.path.exists(damaged.path)
    assert storage.chunk_cache_statistics().corruptions >= 1
    assert storage.read_into(handle, BLOCK - 7, memoryview(buffer), verified_by_caller=True) == 2 * BLOCK
    assert bytes(buffer) == DATA[BLOCK - 7 : 3 * BLOCK - 7]
    assert reads_of(inner) == reads + 1, "read again from the binding"
    assert not storage.distrust("never-cached", 0, 10), "nothing held: nothing to drop"


def _blocks(data: bytes, length: int, bad: int = -1) -> bytes:
    """``read_into_checked``'s list for ``data[:length]`` in blocks of 1,000 bytes."""
    pairs = []
    for index, at in enumerate(range(0, length, 1000)):
        crc = crc32c.crc32c(data[at : min(at + 1000, length)])
        pairs.append(struct.pack(">II", min(1000, length - at), crc ^ 1 if index == bad else crc))
    return b"".join(pairs)


def _cached_whole(storage: CachedChunkStorage) -> ChunkHandle:
    """Chunk ``c`` holding ``DATA``, read once and cached whole; a read handle to it."""
    storage.create("c", DATA)
    handle = storage.open_read("c")
    storage.read(handle, 0, len(DATA))
    storage.cache.drain()
    return handle


def _read_checked_exactly(
    storage: CachedChunkStorage, handle: ChunkHandle, offset: int, length: int
) -> bytearray:
    """``read_into_checked`` of ``[offset, offset + length)`` against ``DATA``'s blocks: the
    whole range, the bytes of ``DATA``; the buffer read into."""
    buffer = bytearray(length)
    assert (
        storage.read_into_checked(handle, offset, memoryview(buffer), _blocks(DATA[offset:], length))
        == length
    )
    assert bytes(buffer) == DATA[offset : offset + length]
    return buffer


@pytest.mark.parametrize(
    ("offset", "length"), [(100, BLOCK - 200), (BLOCK - 7, 2 * BLOCK)], ids=["one-file", "three-files"]
)
def test_read_into_checked_serves_a_hit_checked_against_the_caller_s_blocks(
    storage, inner, offset, length
) -> None:
    """A hit held by one file is read and checked in one pass (``checked_reads``), one held
    by several is read and then checked; either way the caller's blocks are the check."""
    handle = _cached_whole(storage)
    reads = reads_of(inner)
    _read_checked_exactly(storage, handle, offset, length)
    assert reads_of(inner) == reads, "served from the cache"
    assert storage.chunk_cache_statistics().caller_checked_hits == 1


@pytest.mark.parametrize(
    ("offset", "length"), [(100, BLOCK - 200), (BLOCK - 7, 2 * BLOCK)], ids=["one-file", "three-files"]
)
def test_read_into_checked_drops_a_copy_that_fails_and_reads_the_binding(
    storage, inner, offset, length
) -> None:
    handle = _cached_whole(storage)
    damaged = next(file for file in storage.cache.index.files() if file.start <= offset + 2000 < file.end)
    with open(damaged.path, "r+b") as file:
        file.seek(offset + 2000 - damaged.start)
        file.write(b"\x00\xff\x00")
    reads = reads_of(inner)
    buffer = _read_checked_exactly(storage, handle, offset, length)
    assert reads_of(inner) == reads + 1, "read again from the binding"
    assert not os.path.exists(damaged.path) and storage.chunk_cache_statistics().corruptions >= 1
    # Bytes from the binding are checked too: a list that does not match them is an error.
    with pytest.raises(ChunkCorrupted) as caught:
        storage.read_into_checked(handle, offset, memoryview(buffer), _blocks(DATA[offset:], length, bad=2))
    assert caught.value.offset == offset + 2000


def test_verified_by_caller_and_distrust_check_their_arguments(storage) -> None:
    storage.create("c", DATA)
    with pytest.raises(InvalidArgument):
        storage.read_into(storage.open_read("c"), 0, memoryview(bytearray(4)), verified_by_caller=1)  # type: ignore[arg-type]
    with pytest.raises(ChunkNameInvalid):
        storage.distrust("", 0, 1)
    with pytest.raises(ChunkInvalidOffset):
        storage.distrust("c", -1, 1)
    # Bindings without a local copy take the flag and have nothing to drop.
    plain = RemoteMemoryChunkStorage("memory://plain")
    plain.create("c", DATA)
    buffer = bytearray(10)
    assert plain.read_into(plain.open_read("c"), 5, memoryview(buffer), verified_by_caller=True) == 10
    assert bytes(buffer) == DATA[5:15] and not plain.distrust("c", 0, 10)


def test_a_filler_without_threads_fills_in_the_callers_thread() -> None:
    """``Filler(0, ...)``: the fill runs before ``submit`` returns, in the caller's thread;
    ``done`` runs once whether it ran or raised; nothing stays pending."""
    import threading

    from slts.bindings.chunk_cache.filler import Filler

    filler = Filler(0, 100)
    ran: list[str] = []
    assert filler.submit(10, lambda: ran.append(threading.current_thread().name), lambda: ran.append("done"))
    assert ran == [threading.current_thread().name, "done"] and filler.pending_bytes == 0

    def failing() -> None:
        raise OSError("disk full")

    assert filler.submit(10, failing, lambda: ran.append("done after an error"))
    assert ran[-1] == "done after an error" and filler.pending_bytes == 0
    assert not filler.submit(101, lambda: None, lambda: None), "bytes_max still bounds a fill"
    filler.close()
    assert not filler.submit(10, lambda: None, lambda: None)
