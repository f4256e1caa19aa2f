"""The read handles of offloaded ledgers (``slts.offload.reading``), PIP-17's and PIP-76's,
on the filesystem binding and on S3 (SeaweedFS): entries handed out as views, a bounded
cache that is never read twice, read-ahead that reads every stored byte once, reads at
and across range boundaries (Pulsar's ``BlobStoreBackedInputStreamTest`` facts), several
threads on one handle, close (Pulsar's handles refuse reads after it), an object deleted
under an open handle (``testReadNotExistLedger``), invalid entry ids
(``testInvalidEntryIds``), random ranges across two segments (``testRandomRead``), and
the frame parser's checks (``slts.offload.framing``)."""

from __future__ import annotations

import random
import struct
import sys
import threading
import uuid
from collections.abc import Callable, Iterator

import pytest

from slts.errors import (
    EntryOutOfRange,
    InvalidOffloadObject,
    OffloadHandleClosed,
    OffloadNotFound,
    StorageClosed,
)
from slts.offload import formats, framing
from slts.offload.framing import COPY_BYTES_MAX, Runs, parse_frames
from slts.offload.ledgers import Entry, MemoryLedger
from slts.offload.names import data_name, segment_name
from slts.offload.offloader import LedgerOffloader
from slts.offload.reading import OffloadedLedger, StreamingLedgerHandle
from slts.offload.streaming import OfferResult, StreamingOffloader
from slts.storage.chunked import ChunkedSegmentStorage
from tests.support.engine import Env, env_fixture

env = env_fixture([("filesystem", "lmdb"), ("s3", "lmdb")])
ML = "public/default/orders"
KINDS = ["ledger", "stream"]

Handle = OffloadedLedger | StreamingLedgerHandle


def random_entries(count: int, seed: int, largest: int = 300) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.randrange(largest)) for _ in range(count)]


def offloaded(storage: ChunkedSegmentStorage, payloads: list[bytes], **options: int) -> OffloadedLedger:
    """A PIP-17 handle of ledger 1 holding ``payloads`` (blocks of 64 KiB, 4 KiB read-ahead
    unless ``options`` say otherwise)."""
    settings = {"max_block_bytes": 64 << 10, "read_ahead_bytes": 4096, **options}
    offloader = LedgerOffloader(storage, **settings)
    uid = uuid.uuid4()
    offloader.offload(MemoryLedger(1, payloads), uid)
    return offloader.read_offloaded(1, uid)


def streamed(
    storage: ChunkedSegmentStorage,
    payloads: list[bytes],
    *,
    block_bytes: int = 4096,
    segment_bytes: int = 1 << 30,
) -> StreamingOffloader:
    """``payloads`` offered as ledger 0 of ``ML``, a new segment whenever one closes."""
    offloader = StreamingOffloader(storage, ML, block_bytes=block_bytes, max_segment_bytes=segment_bytes)
    handle = offloader.streaming_offload(uuid.uuid4(), {}, 0, 0)
    for entry_id, data in enumerate(payloads):
        while (outcome := handle.offer_entry(0, entry_id, data)) != OfferResult.OK:
            if outcome == OfferResult.FAIL_BUFFER_FULL:
                handle.flush()
            else:
                handle.result()
                handle = offloader.streaming_offload(uuid.uuid4(), {}, 0, entry_id)
    handle.close()
    return offloader


def open_handle(kind: str, storage: ChunkedSegmentStorage, payloads: list[bytes]) -> Handle:
    if kind == "ledger":
        return offloaded(storage, payloads)
    return streamed(storage, payloads).read_ledger(0)


def stored_bytes(kind: str, storage: ChunkedSegmentStorage) -> int:
    """The bytes of the objects' data a reader of the whole ledger must read once."""
    names = [n for n in storage.list("offload/") if not n.endswith("-index")]
    assert names and (kind == "stream" or len(names) == 1), names
    return sum(storage.info(name).length for name in names)


def bytes_read(storage: ChunkedSegmentStorage) -> int:
    return storage.statistics().bytes_read


def as_bytes(entries: list[Entry]) -> list[bytes]:
    return [bytes(entry) for entry in entries]


# -- views ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_entries_are_views_equal_to_the_payloads(env: Env, kind: str, framer: str) -> None:
    """Payloads over COPY_BYTES_MAX are read-only views, no copy: Payloads of the compiled
    framer, memoryview slices of the pure-Python one."""
    payloads = [payload + bytes(COPY_BYTES_MAX) for payload in random_entries(100, seed=1)]
    assert min(map(len, payloads)) > COPY_BYTES_MAX
    handle = open_handle(kind, env.open(), payloads)
    entries = handle.read(0, 99)
    view_type = framing.NATIVE.Payload if framer == "native" else memoryview
    assert all(type(entry) is view_type and memoryview(entry).readonly for entry in entries)
    assert entries == payloads, "a view compares equal to the bytes of its payload"
    assert as_bytes(entries) == payloads


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("size", [1, 1000, COPY_BYTES_MAX])
def test_small_payloads_are_payload_views_or_bytes_copies(
    env: Env, kind: str, size: int, framer: str
) -> None:
    """Payloads up to COPY_BYTES_MAX leave as Payload views (the compiled framer) or as bytes
    (the pure-Python one: a run of one size copied in C, the odd ones one by one), each
    equal to its payload."""
    rng = random.Random(size)
    payloads = [rng.randbytes(size) for _ in range(300)]
    payloads += [rng.randbytes(rng.randint(0, size)) for _ in range(20)]
    handle = open_handle(kind, env.open(), payloads)
    entries = handle.read(0, len(payloads) - 1)
    want = framing.NATIVE.Payload if framer == "native" else bytes
    assert all(type(entry) is want for entry in entries), {type(entry) for entry in entries}
    assert entries == payloads
    assert handle.read(5, 5) == [payloads[5]] and handle.read(299, 301) == payloads[299:302]


@pytest.mark.parametrize("mapped", [True, False])
def test_ranges_grow_past_2_mib_only_where_they_are_views_of_mapped_files(env: Env, mapped: bool) -> None:
    """Ranges of mapped chunk files cost no memory to hold, so a sequential reader's grow
    to 8 MiB; copies (S3, HDFS, ``read_mapped`` off) stop at 2 MiB: the cache of 4 ranges
    holds at most about 8 MiB of them."""
    storage = env.open(read_mapped=mapped)
    expect_mapped = mapped and storage.chunk_storage.maps_reads
    assert storage.read_views_mapped == expect_mapped
    payloads = [bytes([i % 251]) * (64 << 10) for i in range(400)]  # 25 MiB
    handle = offloaded(storage, payloads, max_block_bytes=64 << 20, read_ahead_bytes=1 << 20)
    largest = 0
    for first in range(0, 400, 16):
        assert handle.read(first, first + 15) == payloads[first : first + 16]
        largest = max(largest, handle.cached_bytes)
    slack = 4 * 2 * storage.config.checksum_block_bytes  # each range ends on the checksum grid
    if expect_mapped:
        assert largest > 4 * (2 << 20) + slack, largest
    else:
        assert largest <= 4 * (2 << 20) + slack, largest


# -- close -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_closed_handle_refuses_reads_and_releases_its_cache(env: Env, kind: str) -> None:
    payloads = random_entries(300, seed=2)
    handle = open_handle(kind, env.open(), payloads)
    kept = handle.read(0, 99)
    assert handle.cached_bytes > 0
    handle.close()
    assert handle.cached_bytes == 0
    with pytest.raises(OffloadHandleClosed, match="closed") as caught:
        handle.read(0, 0)
    assert isinstance(caught.value, StorageClosed)
    handle.close()  # idempotent
    with pytest.raises(OffloadHandleClosed):
        handle.read(100, 299)
    assert kept == payloads[:100], "entries read before the close stay valid"


@pytest.mark.parametrize("kind", KINDS)
def test_a_handle_is_a_context_manager(env: Env, kind: str) -> None:
    payloads = random_entries(50, seed=3)
    with open_handle(kind, env.open(), payloads) as handle:
        assert handle.read(0, 49) == payloads
    assert handle.cached_bytes == 0
    with pytest.raises(OffloadHandleClosed):
        handle.read(0, 49)


# -- Pulsar's cases ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_read_of_an_object_deleted_under_the_handle_is_offload_not_found(env: Env, kind: str) -> None:
    """testReadNotExistLedger: ten entries of 100 bytes, the data object deleted after the
    handle opened and before anything was read; the read fails typed (Pulsar:
    NoSuchLedgerExistsException), and again on a second try."""
    storage = env.open()
    payloads = random_entries(10, seed=4, largest=101)
    handle = open_handle(kind, storage, payloads)
    (name,) = [n for n in storage.list("offload/") if not n.endswith("-index")]
    storage.delete(storage.open_write(name))
    for _ in range(2):
        with pytest.raises(OffloadNotFound, match="deleted") as caught:
            handle.read(0, 9)
        assert caught.value.object == name


@pytest.mark.parametrize("kind", KINDS)
def test_invalid_entry_ids_are_refused(env: Env, kind: str) -> None:
    """testInvalidEntryIds: read(-1, -1) and a read past the last entry are refused; the
    handle reads on afterwards."""
    payloads = random_entries(10, seed=5, largest=101)
    handle = open_handle(kind, env.open(), payloads)
    for first, last in [(-1, -1), (0, 20), (10, 10), (5, 4)]:
        with pytest.raises(EntryOutOfRange):
            handle.read(first, last)
    assert handle.read(0, 9) == payloads


def test_random_ranges_across_two_segments_read_exact_bytes_and_each_block_once(env: Env) -> None:
    """testRandomRead: segments of 1,000 bytes, 20 entries of 100 bytes: two segments, as
    in Pulsar; random ranges read the exact bytes, and the handle reads each block once
    (its cache holds them all)."""
    storage = env.open()
    rng = random.Random(6)
    payloads = [rng.randbytes(100) for _ in range(20)]
    offloader = streamed(storage, payloads, segment_bytes=1000)
    assert len(offloader.segments()) == 2
    handle = offloader.read_ledger(0)
    before = bytes_read(storage)
    for _ in range(200):
        first, last = sorted((rng.randrange(20), rng.randrange(20)))
        assert handle.read(first, last) == payloads[first : last + 1], (first, last)
    assert bytes_read(storage) - before == stored_bytes("stream", storage)


# -- read-ahead and cache ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_sequential_reader_reads_every_stored_byte_once(env: Env, kind: str, framer: str) -> None:
    storage = env.open()
    payloads = random_entries(3000, seed=7)
    handle = open_handle(kind, storage, payloads)
    before = bytes_read(storage)
    for first in range(0, 3000, 7):
        last = min(first + 6, 2999)
        assert handle.read(first, last) == payloads[first : last + 1], first
    assert bytes_read(storage) - before == stored_bytes(kind, storage)


def boundary_payloads() -> list[bytes]:
    """Payloads whose frames, in blocks of 131,008 bytes read in 64 KiB ranges, end
    exactly at a range's end, cut a frame header, cut a payload, and put a block header
    across a range's end (block 2 starts 64 bytes before 131,072)."""
    rng = random.Random(8)
    grid = 64 << 10
    sizes = [grid - formats.HEADER_SIZE - 12]  # entry 0's frame ends at 65,536 exactly
    sizes += [4096 - 12] * 15  # then 15 frames of 4 KiB: the last ends at 131,072 ... in block 2
    sizes += [5000, grid - 12 - 6, 3000, 1, 0, 77]  # a header cut 6 bytes in, payloads cut
    sizes += [rng.randrange(9000) for _ in range(60)]
    return [rng.randbytes(size) for size in sizes]


def test_reads_at_range_boundaries_forwards_backwards_and_jumping(env: Env, framer: str) -> None:
    """BlobStoreBackedInputStreamTest's facts for a cached ranged reader: reading exactly
    at range boundaries, seeking backwards and forwards, reading past the end."""
    storage = env.open()
    payloads = boundary_payloads()
    handle = offloaded(storage, payloads, max_block_bytes=131_008, read_ahead_bytes=64 << 10)
    count = len(payloads)
    before = bytes_read(storage)
    for entry in range(count):  # forwards, one entry per read
        assert handle.read(entry, entry) == [payloads[entry]], entry
    assert bytes_read(storage) - before == stored_bytes("ledger", storage), "every byte once"
    held = bytes_read(storage)
    for entry in range(count - 1, count - 4, -1):  # backwards within what the cache holds
        assert handle.read(entry, entry) == [payloads[entry]], entry
    assert bytes_read(storage) == held, "a cached range is not read again"
    for entry in [*range(count - 1, -1, -1), *range(0, count, 5), 17, 3, 40]:  # seek back, jump on
        assert handle.read(entry, entry) == [payloads[entry]], entry
        last = min(entry + 9, count - 1)
        assert handle.read(entry, last) == payloads[entry : last + 1], entry
    with pytest.raises(EntryOutOfRange):
        handle.read(count - 1, count)


# -- threads -----------------------------------------------------------------------------------------


@pytest.fixture
def busy_switching() -> Iterator[None]:
    """The interpreter switches threads as often as it can (so races show, not sleeps)."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


def run_threads(count: int, work: Callable[[int], None]) -> None:
    errors: list[BaseException] = []

    def guarded(seed: int) -> None:
        try:
            work(seed)
        except BaseException as error:  # reported to the test below
            errors.append(error)

    threads = [threading.Thread(target=guarded, args=(seed,)) for seed in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


@pytest.mark.parametrize("kind", KINDS)
def test_threads_reading_one_handle_get_their_exact_entries(
    env: Env, kind: str, busy_switching: None
) -> None:
    storage = env.open(checksum_block_bytes=512)  # small ranges: the reader's buffers change often
    payloads = random_entries(4000, seed=9, largest=200)
    if kind == "ledger":
        handle: Handle = offloaded(storage, payloads, max_block_bytes=16 << 10, read_ahead_bytes=1)
    else:
        handle = streamed(storage, payloads, block_bytes=16 << 10).read_ledger(0)  # 25 blocks, 4 cached

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        lane = 4000 // 8 * seed  # each thread its own stretch, then anywhere
        for turn in range(200):
            first = lane + rng.randrange(500) if turn % 2 else rng.randrange(4000)
            last = min(first + rng.randrange(30), 3999)
            got = handle.read(first, last)
            assert as_bytes(got) == payloads[first : last + 1], (seed, first, last)

    run_threads(8, reader)


# -- damage --------------------------------------------------------------------------------------------


def test_a_damaged_frame_inside_a_run_of_one_size_is_refused_where_it_is(env: Env, framer: str) -> None:
    """Frames of one length are checked as a run: one entry id changed in the middle of a
    run is InvalidOffloadObject naming its offset; the entries before it read fine."""
    storage = env.open(checksums=False, verify_checksums_on_read=False)  # SLTS's own check would come first
    payloads = [bytes([i % 251]) * 100 for i in range(300)]
    offloader = LedgerOffloader(storage, max_block_bytes=1 << 20)
    uid = uuid.uuid4()
    offloader.offload(MemoryLedger(1, payloads), uid)
    position = formats.HEADER_SIZE + 150 * (12 + 100)
    ((start, chunk),) = [(s, c) for s, c in storage.chunks(data_name(1, uid)) if s <= position < s + c.length]
    binding = storage.chunk_storage
    data = bytearray(binding.read(binding.open_read(chunk.name), 0, chunk.length))
    struct.pack_into(">q", data, position - start + 4, 151)  # entry 150 says it is 151
    binding.delete(binding.open_write(chunk.name))
    binding.create(chunk.name, bytes(data))
    handle = offloader.read_offloaded(1, uid)
    assert handle.read(0, 149) == payloads[:150]
    with pytest.raises(InvalidOffloadObject, match="entry 151 of 100 bytes where entry 150") as caught:
        handle.read(0, 299)
    assert caught.value.offset == position


def test_a_streaming_block_with_a_frame_past_its_end_is_refused(env: Env, framer: str) -> None:
    storage = env.open(checksums=False, verify_checksums_on_read=False)
    payloads = [b"z" * 100] * 30
    offloader = streamed(storage, payloads, block_bytes=1 << 20)
    (segment,) = offloader.segments()
    name = segment_name(ML, segment.id)
    ((start, chunk),) = list(storage.chunks(name))
    binding = storage.chunk_storage
    data = bytearray(binding.read(binding.open_read(chunk.name), 0, chunk.length))
    position = formats.HEADER_SIZE + 29 * 112  # the last frame says it runs far past the block
    struct.pack_into(">i", data, position - start, 1 << 30)
    binding.delete(binding.open_write(chunk.name))
    binding.create(chunk.name, bytes(data))
    with pytest.raises(InvalidOffloadObject, match="entry 29") as caught:
        offloader.read_ledger(0).read(0, 0)
    assert caught.value.object == name and caught.value.offset == position


# -- the frame parser ------------------------------------------------------------------------------------


def frames(sizes: list[int], first: int, rng: random.Random) -> tuple[bytes, list[bytes]]:
    payloads = [rng.randbytes(size) for size in sizes]
    body = b"".join(struct.pack(">iq", len(p), first + i) + p for i, p in enumerate(payloads))
    return bytes(formats.HEADER_SIZE) + body + formats.PADDING * 2, payloads


def parsed(block: bytes, first: int, count: int | None, limit: int | None = None) -> tuple[int, list[bytes]]:
    runs = Runs()
    found = parse_frames(
        memoryview(block),
        formats.HEADER_SIZE,
        limit or len(block),
        len(block),
        first,
        count,
        runs,
        name="o",
        base=0,
    ).checked()
    out: list[Entry] = []
    if len(runs):
        assert runs.payloads(memoryview(block), first, first + len(runs) - 1, out) == first + len(runs)
    return found.found, as_bytes(out)


@pytest.mark.parametrize("shape", ["one size", "sizes", "runs and strays", "odd stride"])
def test_the_frame_parser_finds_every_payload_and_refuses_damage(shape: str, framer: str) -> None:
    rng = random.Random(shape)
    for _ in range(60):
        count = rng.randrange(1, 400)
        if shape == "one size":
            sizes = [100] * count
        elif shape == "sizes":
            sizes = [rng.randrange(50) for _ in range(count)]
        elif shape == "runs and strays":
            sizes = [rng.choice([64, 64, 64, 64, 65]) for _ in range(count)]
        else:
            sizes = [33] * count  # a stride of 45 bytes: checked byte by byte
        first = rng.choice([rng.randrange(1 << 40), (1 << 32) - rng.randrange(1, 300)])  # ids over 2**32
        block, payloads = frames(sizes, first, rng)
        assert parsed(block, first, count) == (count, payloads)
        assert parsed(block, first, None) == (count, payloads)
        limit = rng.randrange(formats.HEADER_SIZE, len(block))  # the bytes at hand end early
        found, got = parsed(block, first, count, limit)
        assert got == payloads[:found]
        victim = rng.randrange(count)
        at = formats.HEADER_SIZE + sum(12 + size for size in sizes[:victim])
        damaged = bytearray(block)
        damaged[at + 4 + rng.randrange(8)] ^= 1 << rng.randrange(8)  # a bit of its entry id
        for bad, want in [(bytes(damaged), count), (block, count + 1), (block, count - 1)]:
            if want == 0:
                continue
            with pytest.raises(InvalidOffloadObject):
                parsed(bad, first, want)
