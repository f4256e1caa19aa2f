"""Streaming offload (PIP-76) held to Pulsar's behaviour, on the filesystem binding and S3.

The facts come from Pulsar's ``BlobStoreManagedLedgerOffloaderStreamingTest`` and
``BlobStoreManagedLedgerOffloader.offerEntry``/``streamingOffload`` (segment size counted
in payload bytes, the buffer refusing once it holds ``buffer_bytes``, the minimum segment
age before a size rollover) and from PIP-76's failure handling (a failed segment is
abandoned and offloaded again from its begin before anything else). The crash cases are
SLTS's own: a close interrupted by a crash is finished by the resume, and deletes leave
nothing behind once ``cleanup`` ran.
"""

from __future__ import annotations

import itertools
import random
import struct
import threading
import uuid
from collections.abc import Callable

import pytest
from slts.bindings.faulty import FaultyChunkStorage
from slts.tools.simulation.seam import FakeClock

from slts.errors import (
    EntryOutOfRange,
    Fenced,
    InvalidArgument,
    MetadataError,
    OffloadNotFound,
    SegmentNotFound,
    SltsError,
    StorageUnavailable,
)
from slts.metadata.schema import OFFLOAD_STREAM_SEGMENTS, SEGMENTS
from slts.metadata.store import SCAN_LIMIT_DEFAULT, Put
from slts.offload import formats
from slts.offload.names import FOLDER, segment_index_name, segment_name
from slts.offload.records import StreamSegmentRecord, StreamState
from slts.offload.streaming import OfferResult, OffloadHandle, StreamingOffloader
from slts.storage.chunked import ChunkedSegmentStorage
from tests.support.engine import Env, env_fixture
from tests.support.faults import faulty_owner

env = env_fixture([("filesystem", "lmdb"), ("s3", "lmdb")])
#: The crash matrix is about the records (the same on every binding): the filesystem's.
fs_env = env_fixture([("filesystem", "lmdb")])
ML = "public/default/persistent/orders"
#: Pulsar's tests: 5 MiB blocks, 100-byte entries, segments of 1,000 or 2,000 bytes.
PULSAR_BLOCK = 5 << 20


def entries(count: int, seed: int, size: int = 100) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(size) for _ in range(count)]


def _nothing() -> None:
    pass


def exists(storage: ChunkedSegmentStorage, name: str) -> bool:
    try:
        storage.info(name)
    except SegmentNotFound:
        return False
    return True


def objects_of(storage: ChunkedSegmentStorage, uid: uuid.UUID) -> list[str]:
    return [name for name in (segment_name(ML, uid), segment_index_name(ML, uid)) if exists(storage, name)]


def fail_nth_write(
    binding: FaultyChunkStorage, nth: int, prefix: str, then: Callable[[], None] = _nothing
) -> None:
    """The ``nth`` next data write (an append, or a new chunk: object stores write new
    chunks) to a chunk whose name starts with ``prefix`` raises ``StorageUnavailable``,
    after ``then()``."""

    def fail() -> None:
        then()
        raise StorageUnavailable("injected write failure", injected=True)

    binding.before(("create", "write"), fail, nth=nth, prefix=prefix)


def hold_the_first_write(binding: FaultyChunkStorage) -> tuple[threading.Event, threading.Event]:
    """The first data write of the managed ledger's objects waits for the second event
    (up to 30 s), after setting the first: the writer is held in it."""
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        entered.set()
        release.wait(30)

    binding.before(("create", "write"), hold, prefix=f"0/{FOLDER}/{ML}/")
    return entered, release


def offer_all(handle: OffloadHandle, ledger: int, first: int, payloads: list[bytes]) -> list[OfferResult]:
    return [handle.offer_entry(ledger, first + i, data) for i, data in enumerate(payloads)]


# -- point 1: a segment's size is its entries' payload ---------------------------------------------


def test_ten_100_byte_entries_fill_a_1000_byte_segment_to_its_tenth_entry(env: Env) -> None:
    """testHappyCase/testReadAndWrite: the tenth offer brings the payload to 1,000 bytes
    and closes the segment, which ends at entry 9 and reads back exactly."""
    offloader = StreamingOffloader(env.open(), ML, block_bytes=PULSAR_BLOCK, max_segment_bytes=1000)
    payloads = entries(10, seed=1)
    handle = offloader.streaming_offload(uuid.uuid4(), {"bucket": "b"}, 0, 0)
    assert offer_all(handle, 0, 0, payloads) == [OfferResult.OK] * 10
    result = handle.result(timeout=30)
    assert (result.begin_ledger, result.begin_entry, result.end_ledger, result.end_entry) == (0, 0, 0, 9)
    assert handle.offer_entry(0, 10, b"late") == OfferResult.FAIL_SEGMENT_CLOSED
    assert offloader.read_ledger(0).read(0, 9) == payloads


def test_a_segment_across_two_ledgers_ends_where_the_payload_reaches_its_size(env: Env) -> None:
    """testReadAndWriteAcrossLedger: 2,000 bytes hold ten entries of ledger 0 and ten of
    ledger 1; each ledger reads back on its own."""
    offloader = StreamingOffloader(env.open(), ML, block_bytes=PULSAR_BLOCK, max_segment_bytes=2000)
    first, second = entries(10, seed=2), entries(10, seed=3)
    handle = offloader.streaming_offload(uuid.uuid4(), {}, 0, 0)
    assert offer_all(handle, 0, 0, first) + offer_all(handle, 1, 0, second) == [OfferResult.OK] * 20
    result = handle.result(timeout=30)
    assert (result.end_ledger, result.end_entry) == (1, 9)
    assert offloader.read_ledger(0).read(0, 9) == first
    assert offloader.read_ledger(1).read(0, 9) == second


def test_a_ledger_reads_across_two_segments_in_any_range(env: Env) -> None:
    """testReadAndWriteAcrossSegment/testRandomRead: the second segment begins at entry 10
    of the same ledger; every range of the 20 entries reads back exactly; a read outside
    them (testInvalidEntryIds) is a typed error."""
    offloader = StreamingOffloader(env.open(), ML, block_bytes=PULSAR_BLOCK, max_segment_bytes=1000)
    payloads = entries(20, seed=4)
    one = offloader.streaming_offload(uuid.uuid4(), {}, 0, 0)
    assert offer_all(one, 0, 0, payloads[:10]) == [OfferResult.OK] * 10
    assert (one.result(timeout=30).end_entry, one.offer_entry(0, 10, payloads[10])) == (
        9,
        OfferResult.FAIL_SEGMENT_CLOSED,
    )
    two = offloader.streaming_offload(uuid.uuid4(), {}, 0, 10)
    assert offer_all(two, 0, 10, payloads[10:]) == [OfferResult.OK] * 10
    result = two.result(timeout=30)
    assert (result.begin_ledger, result.begin_entry, result.end_ledger, result.end_entry) == (0, 10, 0, 19)
    handle = offloader.read_ledger(0)
    assert handle.read(0, 19) == payloads
    rng = random.Random(0)
    for _ in range(40):
        begin, end = sorted((rng.randrange(20), rng.randrange(20)))
        assert handle.read(begin, end) == payloads[begin : end + 1]
    for first, last in ((-1, -1), (0, 20), (5, 4)):
        with pytest.raises((EntryOutOfRange, InvalidArgument)):
            handle.read(first, last)


def test_a_segment_younger_than_the_minimum_age_does_not_roll_over_by_size(env: Env) -> None:
    """``minOffloadSegmentRolloverTimeInSeconds``: past the size, the segment stays open
    until it is old enough; then the next offer closes it."""
    clock = FakeClock()
    offloader = StreamingOffloader(
        env.open(), ML, block_bytes=PULSAR_BLOCK, max_segment_bytes=1000, min_segment_age_s=60, clock=clock
    )
    payloads = entries(12, seed=5)
    handle = offloader.streaming_offload(uuid.uuid4(), {}, 0, 0)
    assert offer_all(handle, 0, 0, payloads[:11]) == [OfferResult.OK] * 11
    assert handle.alive
    clock.advance(60)
    assert handle.offer_entry(0, 11, payloads[11]) == OfferResult.OK  # old enough: this offer closes it
    assert handle.offer_entry(0, 12, b"x") == OfferResult.FAIL_SEGMENT_CLOSED
    assert handle.result(timeout=30).end_entry == 11
    assert offloader.read_ledger(0).read(0, 11) == payloads


def test_the_buffer_refuses_only_once_it_holds_its_size(env: Env) -> None:
    """offerEntry: ``FAIL_BUFFER_FULL`` when the buffer already holds ``buffer_bytes``;
    an offer below that is taken even if it overfills the buffer. The writer is held in
    its first block's write, so the buffer's contents are known."""
    storage, binding, _ = faulty_owner(env)
    entered, release = hold_the_first_write(binding)
    offloader = StreamingOffloader(storage, ML, block_bytes=1024, buffer_bytes=1024)
    a, b, c, d = entries(4, seed=6, size=1000)
    handle = offloader.streaming_offload(uuid.uuid4(), {}, 0, 0)
    try:
        assert handle.offer_entry(0, 0, a) == OfferResult.OK
        assert handle.offer_entry(0, 1, b) == OfferResult.OK  # 1,000 buffered < 1,024: taken
        assert entered.wait(30)  # the writer took a (a block's worth was buffered) and is held
        assert handle.offer_entry(0, 2, c) == OfferResult.OK  # b alone is buffered: 1,000 < 1,024
        assert not handle.can_offer(1)
        assert handle.offer_entry(0, 3, d) == OfferResult.FAIL_BUFFER_FULL  # 2,000 >= 1,024
    finally:
        release.set()
    handle.flush(timeout=30)
    assert handle.offer_entry(0, 3, d) == OfferResult.OK
    handle.close(timeout=30)
    assert offloader.read_ledger(0).read(0, 3) == [a, b, c, d]


# -- point 2: a failed segment is abandoned and redone from its begin ------------------------------


@pytest.mark.parametrize("threads", [False, True])
def test_a_failed_segment_is_removed_and_redone_from_its_begin_under_a_new_uid(
    env: Env, threads: bool
) -> None:
    """PIP-76: a segment whose write failed is FAILED and its objects are gone; nothing
    but its redo (a new uid, from the failed segment's begin) may open; the redo holds
    every entry once and the failed segment leaves no record or reference."""
    storage, binding, _ = faulty_owner(env)
    fail_nth_write(binding, 3, f"0/{FOLDER}/{ML}/")
    offloader = StreamingOffloader(storage, ML, block_bytes=1024, buffer_bytes=4096, threads=threads)
    payloads = entries(40, seed=7)
    failed_uid = uuid.uuid4()
    handle = offloader.streaming_offload(failed_uid, {}, 3, 5)
    with pytest.raises(StorageUnavailable):
        for i, data in enumerate(payloads):
            assert handle.offer_entry(3, 5 + i, data) == OfferResult.OK
            if i % 9 == 8:
                handle.flush(timeout=30)
    with pytest.raises(StorageUnavailable):
        handle.result(timeout=30)
    failed = offloader.failed_segment()
    assert failed is not None and failed.id == failed_uid and failed.state == StreamState.FAILED
    assert objects_of(storage, failed_uid) == []
    with pytest.raises(OffloadNotFound):
        offloader.read_ledger(3)  # a failed segment's blocks are not read
    with pytest.raises(InvalidArgument, match=r"\(3, 5\)"):
        offloader.streaming_offload(uuid.uuid4(), {}, 3, 5 + 18)  # after its durable blocks: refused
    with pytest.raises(InvalidArgument, match="used before"):
        offloader.streaming_offload(failed_uid, {}, 3, 5)
    assert offloader.failed_segment() == failed  # the refusals changed nothing

    redo_uid = uuid.uuid4()
    redo = offloader.streaming_offload(redo_uid, {}, 3, 5)
    assert offer_all(redo, 3, 5, payloads) == [OfferResult.OK] * 40
    result = redo.close(timeout=30)
    assert (result.uid, result.begin_entry, result.end_entry) == (redo_uid, 5, 44)
    segments = offloader.segments()
    assert [(s.id, s.state) for s in segments] == [(redo_uid, StreamState.COMPLETE)]
    assert offloader.ledger(3).segments == [segments[0].sequence]
    assert offloader.failed_segment() is None
    handle_3 = offloader.read_ledger(3)
    assert (handle_3.first_entry_id, handle_3.last_entry_id) == (5, 44)
    assert handle_3.read(5, 44) == payloads


def test_a_failed_index_write_leaves_no_index_object(env: Env) -> None:
    """The close's index write fails: the segment is FAILED and neither object stays."""
    storage, binding, _ = faulty_owner(env)
    uid = uuid.uuid4()
    binding.fail_nth("create", 1, prefix=f"0/{segment_index_name(ML, uid)}")
    offloader = StreamingOffloader(storage, ML, block_bytes=1024, threads=False)
    handle = offloader.streaming_offload(uid, {}, 0, 0)
    assert offer_all(handle, 0, 0, entries(5, seed=8)) == [OfferResult.OK] * 5
    with pytest.raises(StorageUnavailable):
        handle.close()
    assert offloader.failed_segment() is not None
    assert objects_of(storage, uid) == []


def test_a_failed_segment_whose_objects_could_not_go_is_freed_by_cleanup(env: Env) -> None:
    """The second block's write fails, and so does the delete of the data object that
    follows: the FAILED record stays with its object, which ``cleanup`` removes."""
    storage, binding, store = faulty_owner(env)
    uid = uuid.uuid4()
    fail_nth_write(binding, 2, f"0/{FOLDER}/{ML}/", then=lambda: store.fail_nth(1, table=SEGMENTS))
    offloader = StreamingOffloader(storage, ML, block_bytes=1024, threads=False)
    handle = offloader.streaming_offload(uid, {}, 0, 0)
    with pytest.raises(StorageUnavailable):
        for i, data in enumerate(entries(30, seed=9)):
            handle.offer_entry(0, i, data)
    assert offloader.failed_segment() is not None
    assert objects_of(storage, uid) == [segment_name(ML, uid)]  # its delete failed too
    assert offloader.cleanup() == [uid]
    assert objects_of(storage, uid) == []
    assert offloader.failed_segment() is not None  # the record waits for the redo


# -- point 3: a crash during the close ------------------------------------------------------------


def test_a_resume_after_a_crash_during_the_close_finishes_the_close(env: Env) -> None:
    """The process dies at the COMPLETE commit, after both objects were sealed: the resume
    finishes the close instead of taking offers its writer could never write."""
    storage, binding, store = faulty_owner(env)
    store.on_crash = binding.kill
    store.crash_at(3, landed=False, table=OFFLOAD_STREAM_SEGMENTS)  # open, one block, COMPLETE
    offloader = StreamingOffloader(storage, ML, block_bytes=1024, threads=False)
    uid = uuid.uuid4()
    payloads = entries(3, seed=10)
    handle = offloader.streaming_offload(uid, {}, 0, 0)
    assert offer_all(handle, 0, 0, payloads) == [OfferResult.OK] * 3
    handle.flush()
    with pytest.raises(SltsError):
        handle.close()
    assert store.dead

    resumed_offloader = StreamingOffloader(env.reopen(), ML, block_bytes=1024, threads=False)
    resumed = resumed_offloader.streaming_offload(uid)
    assert not resumed.alive
    assert resumed.offer_entry(0, 3, b"next") == OfferResult.FAIL_SEGMENT_CLOSED
    result = resumed.result()
    assert (result.uid, result.end_ledger, result.end_entry) == (uid, 0, 2)
    assert [s.state for s in resumed_offloader.segments()] == [StreamState.COMPLETE]
    assert resumed_offloader.read_ledger(0).read(0, 2) == payloads
    following = resumed_offloader.streaming_offload(uuid.uuid4(), {}, 0, 3)
    assert following.offer_entry(0, 3, b"next") == OfferResult.OK
    following.close()
    assert resumed_offloader.read_ledger(0).read(0, 3) == [*payloads, b"next"]


# -- point 4: deletes free their objects ----------------------------------------------------------


def test_a_segment_whose_ledgers_were_all_deleted_while_open_goes_when_it_closes(env: Env) -> None:
    storage = env.open()
    offloader = StreamingOffloader(storage, ML, block_bytes=1024, threads=False)
    kept_uid, gone_uid = uuid.uuid4(), uuid.uuid4()
    kept = offloader.streaming_offload(kept_uid, {}, 0, 0)  # ledger 0 deleted, ledger 1 kept
    offer_all(kept, 0, 0, entries(5, seed=11))
    offer_all(kept, 1, 0, entries(5, seed=12))
    kept.flush()
    assert offloader.delete_ledger(0) == []
    kept.close()
    gone = offloader.streaming_offload(gone_uid, {}, 2, 0)  # its only ledger deleted while open
    offer_all(gone, 2, 0, entries(5, seed=13))
    gone.flush()
    assert offloader.delete_ledger(2) == []  # still open: not yet
    assert objects_of(storage, gone_uid) == [segment_name(ML, gone_uid)]
    gone.close()
    assert [s.id for s in offloader.segments()] == [kept_uid]
    assert objects_of(storage, gone_uid) == []
    assert len(objects_of(storage, kept_uid)) == 2
    with pytest.raises(OffloadNotFound):
        offloader.read_ledger(2)


def test_an_interrupted_delete_is_finished_by_cleanup(env: Env) -> None:
    storage, _, store = faulty_owner(env)
    offloader = StreamingOffloader(storage, ML, block_bytes=1024, threads=False)
    uid = uuid.uuid4()
    handle = offloader.streaming_offload(uid, {}, 0, 0)
    offer_all(handle, 0, 0, entries(5, seed=14))
    handle.close()
    store.fail_nth(1, table=SEGMENTS)  # the delete of the data object
    with pytest.raises(MetadataError):
        offloader.delete_ledger(0)
    assert [s.state for s in offloader.segments()] == [StreamState.DELETING]
    assert offloader.cleanup() == [uid]
    assert offloader.segments() == [] and objects_of(storage, uid) == []
    with pytest.raises(OffloadNotFound):
        offloader.ledger(0)
    assert offloader.cleanup() == []


def test_a_managed_ledger_of_more_segments_than_one_metadata_scan_opens_its_next_one(env: Env) -> None:
    """The segments are listed past the metadata scan's page: the next segment takes the
    sequence after the last, not one a truncated listing would give (a conflict)."""
    storage = env.open()
    count = SCAN_LIMIT_DEFAULT + 1
    records = [
        StreamSegmentRecord(
            ML, n, uuid.uuid4().bytes, StreamState.COMPLETE, 0, 0, n, 0, n, 0, [], {}, 0, 0, 1024, {}
        )
        for n in range(count)
    ]
    storage.context.ownership.commit([Put(OFFLOAD_STREAM_SEGMENTS, r.key, r.encode()) for r in records], [])
    offloader = StreamingOffloader(storage, ML, block_bytes=1024, threads=False)
    assert len(offloader.segments()) == count
    with pytest.raises(InvalidArgument, match=rf"\(0, {count - 1}\)"):
        offloader.streaming_offload(uuid.uuid4(), {}, 0, count - 1)
    handle = offloader.streaming_offload(uuid.uuid4(), {}, 0, count)
    handle.offer_entry(0, count, b"last")
    assert handle.close().end_entry == count
    assert offloader.segments()[-1].sequence == count
    assert offloader.read_ledger(0).read(count, count) == [b"last"]


# -- a crash at every commit ----------------------------------------------------------------------


def _crash_payloads() -> list[tuple[int, int, bytes]]:
    rng = random.Random(15)
    return [
        (ledger, entry, rng.randbytes(rng.randrange(40, 200)))
        for ledger, count in ((0, 14), (1, 12))
        for entry in range(count)
    ]


def _stream_from_where_it_stands(
    offloader: StreamingOffloader, payloads: list[tuple[int, int, bytes]]
) -> None:
    """Drive ``offloader`` over ``payloads`` as a managed ledger does after a restart:
    redo a failed segment, resume an open one, else continue after the last closed one;
    offer every entry from there, opening the next segment when one closes, and close."""
    keys = [(ledger, entry) for ledger, entry, _ in payloads]
    failed, open_one = offloader.failed_segment(), offloader.open_segment()
    if failed is not None:
        start = keys.index((failed.begin_ledger, failed.begin_entry))
        handle = offloader.streaming_offload(uuid.uuid4(), {}, *keys[start])
    elif open_one is not None:
        handle = offloader.streaming_offload(open_one.id)
        done = handle.last_offered()
        start = (
            keys.index(done) + 1
            if done is not None
            else keys.index((open_one.begin_ledger, open_one.begin_entry))
        )
    else:
        closed = offloader.segments()
        start = keys.index((closed[-1].end_ledger, closed[-1].end_entry)) + 1 if closed else 0
        if start == len(keys):
            return
        handle = offloader.streaming_offload(uuid.uuid4(), {}, *keys[start])
    for ledger, entry, data in payloads[start:]:
        while (outcome := handle.offer_entry(ledger, entry, data)) != OfferResult.OK:
            assert outcome == OfferResult.FAIL_SEGMENT_CLOSED, outcome
            handle.result()
            handle = offloader.streaming_offload(uuid.uuid4(), {}, ledger, entry)
    handle.close()


def _crash_offloader(storage: ChunkedSegmentStorage, managed_ledger: str) -> StreamingOffloader:
    return StreamingOffloader(
        storage, managed_ledger, block_bytes=1024, max_segment_bytes=1500, threads=False
    )


@pytest.mark.parametrize("landed", [False, True], ids=["before landing", "after landing"])
def test_a_crash_at_any_commit_is_resumed_without_loss_duplicates_or_leftovers(
    fs_env: Env, landed: bool
) -> None:
    """The process dies at each commit of a streaming run in turn (the segments' and
    ledgers' records, and the SLTS segments' own: creates, writes, seals), before or after
    it lands; the next owner goes on from where the records stand (redo, resume or next
    segment). Every entry reads back once, in order, exactly; the segments do not
    overlap; no object is left but those of the recorded segments."""
    payloads = _crash_payloads()
    storage, _, store = faulty_owner(fs_env)
    before = store.calls["commit"]
    _stream_from_where_it_stands(_crash_offloader(storage, "ml/clean"), payloads)
    total = store.calls["commit"] - before
    assert total > 20
    for nth in range(1, total + 1):
        managed_ledger = f"ml/{nth:04d}"
        storage, binding, store = faulty_owner(fs_env)
        store.on_crash = binding.kill
        store.crash_at(nth, landed=landed)
        with pytest.raises(SltsError):
            _stream_from_where_it_stands(_crash_offloader(storage, managed_ledger), payloads)
        assert store.dead, nth
        offloader = _crash_offloader(fs_env.reopen(), managed_ledger)
        _stream_from_where_it_stands(offloader, payloads)
        offloader.cleanup()
        segments = offloader.segments()
        assert all(s.state == StreamState.COMPLETE for s in segments), nth
        spans = [((s.begin_ledger, s.begin_entry), (s.end_ledger, s.end_entry)) for s in segments]
        assert all(a[1] < b[0] for a, b in itertools.pairwise(spans)), (nth, spans)
        for ledger_id in (0, 1):
            expected = [data for ledger, _, data in payloads if ledger == ledger_id]
            assert offloader.read_ledger(ledger_id).read(0, len(expected) - 1) == expected, nth
        stored = sum(count for s in segments for count, _ in s.ledgers.values())
        assert stored == len(payloads), (nth, stored)
        live = {
            name
            for s in segments
            for name in (segment_name(managed_ledger, s.id), segment_index_name(managed_ledger, s.id))
        }
        assert set(fs_env.instances[-1].list(f"{FOLDER}/{managed_ledger}/")) == live, nth


@pytest.mark.parametrize("padding", [10, 0], ids=["testHavePadding", "testNoPadding"])
def test_a_streaming_block_is_its_header_the_framed_entries_and_the_fill(env: Env, padding: int) -> None:
    """BufferedOffloadStreamTest: ten entries of ledger 0 in one block of exactly their
    framed size plus ``padding`` bytes: the header (block length, first entry 0, ledger
    0), each entry's length, id and bytes, then the fill pattern to the block's end."""
    payloads = [bytes([i]) * i for i in range(10)]
    block = formats.HEADER_SIZE + sum(formats.ENTRY_HEADER_SIZE + len(p) for p in payloads) + padding
    storage = env.open()
    offloader = StreamingOffloader(storage, ML, block_bytes=block, threads=False)
    uid = uuid.uuid4()
    handle = offloader.streaming_offload(uid, {}, 0, 0)
    assert offer_all(handle, 0, 0, payloads) == [OfferResult.OK] * 10
    handle.close()
    name = segment_name(ML, uid)
    data = storage.read(storage.open_read(name), 0, storage.info(name).length)
    framed = b"".join(struct.pack(">iq", len(p), i) + p for i, p in enumerate(payloads))
    fill = bytes.fromhex("fedcdead fedcdead fedc")[:padding]
    assert data == formats.StreamingBlockHeader(block, 0, 0).encode() + framed + fill


def test_a_segment_closed_empty_keeps_its_successors_after_it(env: Env) -> None:
    """A segment that closes without entries (by age, or closed at once) ends at (-1, -1)
    as Pulsar's result says; the next segment must still begin after everything before."""
    offloader = StreamingOffloader(env.open(), ML, block_bytes=1024, threads=False)
    first = offloader.streaming_offload(uuid.uuid4(), {}, 0, 0)
    offer_all(first, 0, 0, entries(10, seed=16))
    first.close()
    empty = offloader.streaming_offload(uuid.uuid4(), {}, 0, 10)
    result = empty.close()
    assert (result.begin_ledger, result.begin_entry, result.end_ledger, result.end_entry) == (0, 10, -1, -1)
    for begin in (5, 9):
        with pytest.raises(InvalidArgument, match=r"after the last one's end \(0, 9\)"):
            offloader.streaming_offload(uuid.uuid4(), {}, 0, begin)
    following = offloader.streaming_offload(uuid.uuid4(), {}, 0, 10)
    assert following.offer_entry(0, 10, b"ten") == OfferResult.OK
    following.close()
    assert offloader.read_ledger(0).read(9, 10)[1] == b"ten"


def test_an_owner_taken_over_changes_nothing_and_the_new_owner_resumes_its_segment(env: Env) -> None:
    """A's writer thread meets the takeover at its next block: its commit is fenced, and
    so is its attempt to record the segment FAILED, so nothing of the open segment goes.
    A's redo and delete are fenced too; no record changes. B resumes the segment
    with its uid and every entry reads back once."""
    a = env.open()
    offloader_a = StreamingOffloader(a, ML, block_bytes=1024)
    uid = uuid.uuid4()
    payloads = entries(30, seed=17)
    handle = offloader_a.streaming_offload(uid, {}, 0, 0)
    offer_all(handle, 0, 0, payloads[:10])
    handle.flush(timeout=30)
    b = env.open()  # the takeover
    before = env.snapshot()
    with pytest.raises(Fenced):
        offer_all(handle, 0, 10, payloads[10:20])
        handle.flush(timeout=30)
    with pytest.raises(Fenced):
        handle.result(timeout=30)
    for change in (
        lambda: offloader_a.streaming_offload(uuid.uuid4(), {}, 0, 0),
        lambda: offloader_a.delete_ledger(0),
    ):
        with pytest.raises(Fenced):
            change()
    assert offloader_a.cleanup() == []  # nothing to clean: nothing tried
    metadata, chunks = env.snapshot()
    assert metadata == before[0]
    # A's last write may have landed past its chunk's recorded end before its commit was
    # fenced: bytes no reader sees (the metadata is unchanged) and that B never extends.
    now = dict(chunks)
    assert all(now[name].startswith(data) for name, data in before[1])

    offloader_b = StreamingOffloader(b, ML, block_bytes=1024)
    resumed = offloader_b.streaming_offload(uid)
    done = resumed.last_offered()
    assert done is not None and done[1] >= 9
    assert offer_all(resumed, 0, done[1] + 1, payloads[done[1] + 1 :]) == [OfferResult.OK] * (29 - done[1])
    resumed.close(timeout=30)
    assert offloader_b.read_ledger(0).read(0, 29) == payloads


def test_a_ledger_deleted_while_its_segment_was_open_stays_deleted_through_the_redo(env: Env) -> None:
    """Ledger 0 is deleted while its segment is open; the segment then fails and its redo
    offers ledger 0's entries again: they land in its deleted context (it does not read
    again), and the redo's segment goes once ledger 1 is deleted too; cleanup then leaves
    no record of either ledger."""
    storage, binding, _ = faulty_owner(env)
    offloader = StreamingOffloader(storage, ML, block_bytes=1024, threads=False)
    zero, one = entries(12, seed=18), entries(12, seed=19)
    failed = offloader.streaming_offload(uuid.uuid4(), {}, 0, 0)
    offer_all(failed, 0, 0, zero)
    failed.flush()
    assert offloader.delete_ledger(0) == []
    fail_nth_write(binding, 1, f"0/{FOLDER}/{ML}/")
    with pytest.raises(StorageUnavailable):
        offer_all(failed, 1, 0, one)
        failed.flush()
    redo_uid = uuid.uuid4()
    redo = offloader.streaming_offload(redo_uid, {}, 0, 0)
    offer_all(redo, 0, 0, zero)
    offer_all(redo, 1, 0, one)
    redo.close()
    assert offloader.ledger(0).deleted
    with pytest.raises(OffloadNotFound):
        offloader.read_ledger(0)
    assert offloader.read_ledger(1).read(0, 11) == one
    assert offloader.delete_ledger(1) == [redo_uid]
    assert offloader.segments() == [] and objects_of(storage, redo_uid) == []
    offloader.cleanup()
    for ledger_id in (0, 1):
        with pytest.raises(OffloadNotFound):
            offloader.ledger(ledger_id)


def test_a_deleted_ledger_re_offered_across_segments_stays_deleted_and_its_tombstone_goes(env: Env) -> None:
    """The redo of a failed segment rolls over inside ledger 0, deleted meanwhile: its
    first segment goes at close (all of it deleted), and the next one's entries of ledger
    0 still land deleted (the ledger's context stays as a tombstone). Once ledger 1 is
    past, cleanup drops the tombstone."""
    storage, binding, _ = faulty_owner(env)
    offloader = StreamingOffloader(storage, ML, block_bytes=1024, max_segment_bytes=600, threads=False)
    zero = entries(10, seed=20)  # 1,000 bytes: the redo closes after 6 of them
    failed = offloader.streaming_offload(uuid.uuid4(), {}, 0, 0)
    offer_all(failed, 0, 0, zero[:5])
    failed.flush()
    offloader.delete_ledger(0)
    fail_nth_write(binding, 1, f"0/{FOLDER}/{ML}/")
    offer_all(failed, 0, 5, zero[5:6])
    with pytest.raises(StorageUnavailable):
        failed.flush()
    first = offloader.streaming_offload(uuid.uuid4(), {}, 0, 0)
    assert offer_all(first, 0, 0, zero[:6]) == [OfferResult.OK] * 6
    assert first.result().end_entry == 5
    assert offloader.segments() == []  # all of it deleted: gone at its close
    second = offloader.streaming_offload(uuid.uuid4(), {}, 0, 6)
    offer_all(second, 0, 6, zero[6:])
    offer_all(second, 1, 0, [b"one"])
    second.close()
    assert offloader.ledger(0).deleted
    with pytest.raises(OffloadNotFound):
        offloader.read_ledger(0)
    offloader.cleanup()  # ledger 0's context holds the second segment: it stays
    assert offloader.ledger(0).segments == [offloader.segments()[0].sequence]
    assert offloader.delete_ledger(1) != []
    offloader.cleanup()
    for ledger_id in (0, 1):
        with pytest.raises(OffloadNotFound):
            offloader.ledger(ledger_id)


def test_waiting_for_room_writes_no_short_block(env: Env) -> None:
    """Back-pressure waited out with ``wait_for_room`` (Pulsar's engine retries the offer
    later) leaves every block but the last full: 8 entries of 100 bytes in 1,024 bytes,
    where a ``flush`` at each full buffer would have written short, padded ones. A held
    writer makes the wait time out."""
    storage, binding, _ = faulty_owner(env)
    entered, release = hold_the_first_write(binding)
    offloader = StreamingOffloader(storage, ML, block_bytes=1024, buffer_bytes=1024)
    payloads = entries(200, seed=21)
    handle = offloader.streaming_offload(uuid.uuid4(), {}, 0, 0)
    offered = 0

    def offer_next() -> OfferResult:
        nonlocal offered
        outcome = handle.offer_entry(0, offered, payloads[offered])
        offered += outcome == OfferResult.OK
        return outcome

    try:
        while offer_next() == OfferResult.OK:
            pass
        assert entered.wait(30)  # the writer took a block and is held in its write
        while offer_next() == OfferResult.OK:
            pass  # full again, and the writer cannot drain it
        with pytest.raises(TimeoutError):
            handle.wait_for_room(timeout=0.01)
    finally:
        release.set()
    while offered < len(payloads):
        if offer_next() == OfferResult.FAIL_BUFFER_FULL:
            handle.wait_for_room(timeout=30)
    handle.close(timeout=30)
    blocks = offloader.segments()[0].blocks
    assert [row[5] - row[1] + 1 for row in blocks[:-1]] == [8] * (len(blocks) - 1)
    assert offloader.read_ledger(0).read(0, 199) == payloads
