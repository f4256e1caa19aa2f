"""PIP-76 streaming offload on SLTS (filesystem binding and S3): Pulsar's streaming formats
byte for byte, rollover by size and by age, back-pressure, entries offered out of order
refused, a crash mid-segment resumed without loss or duplicates, ledgers read and deleted
across segments, and restore from tier-2."""

from __future__ import annotations

import itertools
import random
import struct
import threading
import uuid

import pytest
from slts.tools.simulation.seam import FakeClock

from slts.errors import (
    EntryOutOfOrder,
    InvalidArgument,
    InvalidOffloadObject,
    MetadataError,
    OffloadNotFound,
    StorageUnavailable,
)
from slts.metadata.schema import OFFLOAD_STREAM_SEGMENTS
from slts.metadata.store import Put
from slts.offload import formats
from slts.offload.ledger_metadata import LedgerInfo, decode_ledger_info, encode_ledger_info
from slts.offload.names import FOLDER, segment_index_name, segment_name
from slts.offload.records import StreamSegmentRecord, StreamState
from slts.offload.streaming import (
    OfferResult,
    OffloadHandle,
    StreamingOffloader,
)
from tests.support.engine import Env, env_fixture
from tests.support.faults import die, faulty_owner

env = env_fixture([("filesystem", "lmdb"), ("s3", "lmdb")])
ML = "public/default/orders"
MIB = 1 << 20


# -- formats ---------------------------------------------------------------------------------------


def test_a_streaming_block_header_carries_the_ledger_id() -> None:
    encoded = formats.StreamingBlockHeader(MIB, 3333, 3).encode()
    expected = bytes.fromhex("26a66d32000000000000008000000000001000000000000000000d050000000000000003")
    assert encoded == expected + bytes(92)
    assert formats.parse_streaming_block_header(encoded) == (MIB, 3333, 3)
    with pytest.raises(Exception, match="magic 0xfbdbabcb"):
        formats.parse_streaming_block_header(formats.BlockHeader(MIB, 1).encode())


def test_ledger_info_is_pulsars_protobuf() -> None:
    assert encode_ledger_info(LedgerInfo(1, 5001, 10000)) == bytes.fromhex("080110892718904e")
    assert decode_ledger_info(bytes.fromhex("080110892718904e")) == LedgerInfo(1, 5001, 10000)


def test_a_streaming_index_is_pulsars_layout() -> None:
    info = encode_ledger_info(LedgerInfo(1, 5001, 10000))
    one = formats.StreamingIndex(
        {1: formats.LedgerGroup(info, [formats.IndexEntry(0, 1, 0), formats.IndexEntry(1000, 2, MIB)])},
        3 * MIB,
    )
    by_hand = (
        struct.pack(">Iiqq", 0x3D1FB0BC, 24 + 16 + len(info) + 40, 3 * MIB, 128)
        + struct.pack(">qii", 1, 2, len(info))
        + info
        + struct.pack(">qiq", 0, 1, 0)
        + struct.pack(">qiq", 1000, 2, MIB)
    )
    assert one.encode() == by_hand
    assert formats.parse_streaming_index(by_hand) == one
    three_entries = formats.StreamingIndex(
        {1: formats.LedgerGroup(info, [formats.IndexEntry(i * 10, i + 1, i * MIB) for i in range(3)])},
        3 * MIB,
    )
    assert len(three_entries.encode()) == 108, "OffloadIndexV2Test's single ledger of three blocks"


def test_ledgers_are_in_java_hash_map_order() -> None:
    assert formats.java_hash_map_order([2, 1, 3]) == [1, 2, 3]
    assert formats.java_hash_map_order([17, 2, 1]) == [1, 17, 2], "1 and 17 share bucket 1 of 16"
    assert formats.java_hash_map_order(range(13)) == list(range(13)), "13 keys: a table of 32"
    assert formats.java_hash_map_order([4, 3 << 32, 2, 1]) == [1, 2, 3 << 32, 4], "Long.hashCode folds halves"


# -- offloading ------------------------------------------------------------------------------------


class Producer:
    """A managed ledger's entries: ledgers of random lengths, random payloads."""

    def __init__(self, seed: int = 0, ledger_every: float = 0.01, largest: int = 200) -> None:
        self.rng = random.Random(seed)
        self.ledger, self.entry = 0, 0
        self.ledger_every = ledger_every
        self.largest = largest
        self.entries: dict[tuple[int, int], bytes] = {}

    def next(self) -> tuple[int, int, bytes]:
        if self.entries and self.rng.random() < self.ledger_every:
            self.ledger, self.entry = self.ledger + 1, 0
        key = (self.ledger, self.entry)
        self.entries[key] = self.rng.randbytes(self.rng.randrange(self.largest))
        self.entry += 1
        return (*key, self.entries[key])

    def ledger_entries(self, ledger_id: int) -> list[bytes]:
        return [data for (ledger, _), data in sorted(self.entries.items()) if ledger == ledger_id]


def offer(handle: OffloadHandle, ledger: int, entry: int, data: bytes) -> OfferResult:
    """Offer, waiting out back-pressure (the writer drains the buffer)."""
    while (result := handle.offer_entry(ledger, entry, data)) == OfferResult.FAIL_BUFFER_FULL:
        handle.flush()
    return result


def stream(offloader: StreamingOffloader, producer: Producer, count: int) -> list:
    """Offer ``count`` new entries, opening the next segment whenever one closes; close the last."""
    results = []
    handle = offloader.streaming_offload(uuid.uuid4(), {"driver": "slts"}, 0, 0)
    for _ in range(count):
        ledger, entry, data = producer.next()
        if offer(handle, ledger, entry, data) == OfferResult.FAIL_SEGMENT_CLOSED:
            results.append(handle.result())
            handle = offloader.streaming_offload(uuid.uuid4(), {}, ledger, entry)
            assert offer(handle, ledger, entry, data) == OfferResult.OK
    results.append(handle.close())
    return results


def test_segments_roll_over_by_size_and_every_ledger_reads_back_across_them(env: Env, framer: str) -> None:
    offloader = StreamingOffloader(
        env.open(), ML, block_bytes=4096, buffer_bytes=1 << 20, max_segment_bytes=60_000
    )
    producer = Producer(seed=1)
    results = stream(offloader, producer, 4000)
    segments = offloader.segments()
    assert len(segments) == len(results) >= 3 and all(s.state == StreamState.COMPLETE for s in segments)
    for before, after in itertools.pairwise(results):
        assert (after.begin_ledger, after.begin_entry) > (before.end_ledger, before.end_entry)
    spanning = [lid for lid in range(producer.ledger + 1) if len(offloader.ledger(lid).segments) > 1]
    assert spanning, "some ledger spans two segments"
    for segment in segments:  # the offer reaching the size (payload only) closes the segment
        payload = sum(size for _, size in segment.ledgers.values())
        assert payload < 60_000 + producer.largest, segment.sequence
        assert segment is segments[-1] or payload >= 60_000, segment.sequence
    for ledger_id in range(producer.ledger + 1):
        handle = offloader.read_ledger(ledger_id)
        expected = producer.ledger_entries(ledger_id)
        assert handle.read(0, len(expected) - 1) == expected, ledger_id
        assert handle.length == sum(len(e) for e in expected)
    storage = offloader.storage
    first = segments[0]
    name = segment_index_name(ML, first.id)
    index = formats.parse_streaming_index(storage.read(storage.open_read(name), 0, storage.info(name).length))
    assert index.data_object_length == first.data_length == storage.info(segment_name(ML, first.id)).length
    assert sorted(index.ledgers) == sorted(first.ledgers)
    parts = sorted(e.part_id for group in index.ledgers.values() for e in group.entries)
    assert parts == list(range(1, len(first.blocks) + 1)), "part ids count over the whole segment"


def test_a_segment_rolls_over_by_age(env: Env) -> None:
    clock = FakeClock(1_000.0)
    offloader = StreamingOffloader(env.open(), ML, block_bytes=4096, max_segment_age_s=60, clock=clock)
    handle = offloader.streaming_offload(uuid.uuid4(), {}, 0, 0)
    for entry in range(10):
        assert handle.offer_entry(0, entry, b"x" * 100) == OfferResult.OK
    clock.advance(61)
    assert handle.offer_entry(0, 10, b"x") == OfferResult.FAIL_SEGMENT_CLOSED
    result = handle.result(timeout=30)
    assert (result.begin_ledger, result.begin_entry, result.end_ledger, result.end_entry) == (0, 0, 0, 9)
    assert not handle.can_offer(1)
    nxt = offloader.streaming_offload(uuid.uuid4(), {}, 0, 10)
    assert nxt.offer_entry(0, 10, b"x") == OfferResult.OK
    nxt.close()
    assert offloader.read_ledger(0).read(0, 10) == [b"x" * 100] * 10 + [b"x"]


def test_a_full_buffer_refuses_offers_until_the_writer_drains_it(env: Env) -> None:
    """The writer's first block waits at the chunk storage (a slow tier-2) until the
    producer has filled the buffer."""
    storage, binding, _ = faulty_owner(env)  # no faults: a pause at its binding only
    release = threading.Event()
    binding.before(("create", "write"), lambda: release.wait(30), prefix=f"0/{FOLDER}/{ML}/")
    offloader = StreamingOffloader(storage, ML, block_bytes=1000, buffer_bytes=3000)
    handle = offloader.streaming_offload(uuid.uuid4(), {}, 0, 0)
    results, entry = [], 0
    while len(results) < 40 and (not results or results[-1] == OfferResult.OK):
        results.append(handle.offer_entry(0, entry, b"y" * 500))
        entry += results[-1] == OfferResult.OK
    assert results[-1] == OfferResult.FAIL_BUFFER_FULL, "the buffer is bounded"
    assert not handle.can_offer(500)
    assert handle.last_offered() == (0, entry - 1), "a refused entry is not taken"
    release.set()
    handle.flush(timeout=30)
    assert handle.offer_entry(0, entry, b"y" * 500) == OfferResult.OK
    handle.close(timeout=30)
    assert offloader.read_ledger(0).read(0, entry) == [b"y" * 500] * (entry + 1)


def test_entries_out_of_order_are_refused_and_nothing_is_taken(env: Env, framer: str) -> None:
    offloader = StreamingOffloader(env.open(), ML, block_bytes=4096)
    handle = offloader.streaming_offload(uuid.uuid4(), {}, 5, 3)
    with pytest.raises(EntryOutOfOrder, match="does not follow"):
        handle.offer_entry(5, 4, b"a")  # the segment begins at (5, 3)
    assert handle.offer_entry(5, 3, b"a") == OfferResult.OK
    for ledger, entry in ((5, 3), (5, 5), (4, 0), (6, 1)):
        with pytest.raises(EntryOutOfOrder):
            handle.offer_entry(ledger, entry, b"b")
    assert handle.last_offered() == (5, 3)
    assert handle.offer_entry(6, 0, b"c") == OfferResult.OK
    with pytest.raises(InvalidArgument):
        handle.offer_entry(6, 1, "text")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=r"still open|being offloaded"):
        offloader.streaming_offload(uuid.uuid4(), {}, 7, 0)
    result = handle.close(timeout=30)
    assert (result.end_ledger, result.end_entry) == (6, 0)
    with pytest.raises(InvalidArgument, match="begin after"):
        offloader.streaming_offload(uuid.uuid4(), {}, 6, 0)


@pytest.mark.parametrize(
    "crash", ["after the block's commit", "at the block's commit", "before the block's write"]
)
def test_a_crashed_segment_resumes_without_loss_or_duplicates(env: Env, crash: str, framer: str) -> None:
    """The writer's process dies at its third write of blocks: right after the commit that
    makes them readable and records them (landed), at that commit (not landed: the bytes
    were written, never readable), or before writing (at the chunk storage call); a new owner resumes the
    segment with its uid: it continues right after the last durable entry, the producer
    offers again from there, and every ledger reads back exactly."""
    storage, binding, store = faulty_owner(env)
    if crash != "before the block's write":
        store.on_crash = binding.kill  # the whole process dies
        # The segment's first commit opens it; the next ones are its blocks' writes.
        store.crash_at(1 + 3, landed=crash == "after the block's commit", table=OFFLOAD_STREAM_SEGMENTS)
    else:
        binding.before(("create", "write"), lambda: die(binding, store), nth=3, prefix=f"0/{FOLDER}/{ML}/")
    producer = Producer(seed=4, ledger_every=0.02)
    offloader = StreamingOffloader(storage, ML, block_bytes=2048, buffer_bytes=4096)
    batches: list[int] = []  # blocks per write (and commit): as many as were full
    write_blocks = offloader._write_blocks

    def counted(record: StreamSegmentRecord, blocks: list) -> StreamSegmentRecord:
        batches.append(len(blocks))
        return write_blocks(record, blocks)

    offloader._write_blocks = counted
    uid = uuid.uuid4()
    handle = offloader.streaming_offload(uid, {}, 0, 0)
    offered = []
    for _ in range(400):
        entry = producer.next()
        try:
            if offer(handle, *entry) != OfferResult.OK:
                break
        except (MetadataError, StorageUnavailable):  # the writer's error, once it died
            break
        offered.append(entry)
    with pytest.raises((MetadataError, StorageUnavailable)) as caught:
        handle.result(timeout=30)
    assert caught.value.context["injected"]
    assert binding.dead and store.dead

    resumed_offloader = StreamingOffloader(env.reopen(), ML, block_bytes=2048, buffer_bytes=4096)
    resumed = resumed_offloader.streaming_offload(uid)
    durable = resumed.last_offered()
    assert durable is not None
    recorded = resumed_offloader.segments()[0]
    assert (recorded.end_ledger, recorded.end_entry) == durable
    # The third write's blocks are durable only if its commit landed.
    landed = 3 if crash == "after the block's commit" else 2
    assert len(batches) == 3 and len(recorded.blocks) == sum(batches[:landed])
    assert resumed_offloader.storage.info(segment_name(ML, uid)).length == recorded.data_length
    keys = [(ledger, entry) for ledger, entry, _ in offered]
    assert durable in keys
    if landed == 2:
        assert keys.index(durable) < len(keys) - 1, "the third write's entries were not durable"
    for ledger, entry, data in offered[keys.index(durable) + 1 :]:  # the producer offers again
        assert offer(resumed, ledger, entry, data) == OfferResult.OK
    resumed.close(timeout=30)
    for ledger_id in range(offered[-1][0] + 1):
        expected = [data for ledger, _, data in offered if ledger == ledger_id]
        assert resumed_offloader.read_ledger(ledger_id).read(0, len(expected) - 1) == expected


def test_a_writer_behind_its_producer_writes_the_full_blocks_in_one_write_and_commit(env: Env) -> None:
    """Blocks that pile up while the writer writes go in its next write, in order, with
    one commit recording them all; they read back exactly."""
    storage, binding, _ = faulty_owner(env)
    release = threading.Event()
    binding.before(("create", "write"), lambda: release.wait(30), nth=1, prefix=f"0/{FOLDER}/{ML}/")
    offloader = StreamingOffloader(storage, ML, block_bytes=2048, buffer_bytes=8192)
    handle = offloader.streaming_offload(uuid.uuid4(), {}, 0, 0)
    payloads = [bytes([i % 251]) * 100 for i in range(200)]
    entry = 0
    while handle.offer_entry(0, entry, payloads[entry]) == OfferResult.OK:
        entry += 1  # the first block's write waits: the rest piles up until the buffer is full
    writes = storage.statistics().writes
    release.set()
    for entry_id in range(entry, len(payloads)):
        assert offer(handle, 0, entry_id, payloads[entry_id]) == OfferResult.OK
    handle.close(timeout=30)
    (segment,) = offloader.segments()
    data_writes = storage.statistics().writes - writes - 1  # the index object's write
    assert len(segment.blocks) >= 6 and data_writes < len(segment.blocks), (len(segment.blocks), data_writes)
    assert [row[3] for row in segment.blocks] == [2048 * i for i in range(len(segment.blocks))]
    assert offloader.read_ledger(0).read(0, 199) == payloads


def test_deleting_ledgers_removes_a_segment_once_all_of_its_ledgers_are_gone(env: Env) -> None:
    offloader = StreamingOffloader(
        env.open(), ML, block_bytes=2048, buffer_bytes=8192, max_segment_bytes=20_000
    )
    producer = Producer(seed=7, ledger_every=0.01)
    stream(offloader, producer, 1500)
    segments = offloader.segments()

    def only_here(ledger_id: int) -> bool:
        return len(offloader.ledger(ledger_id).segments) == 1

    # a segment whose last ledger goes on into the next segment and whose others are its own
    first = next(
        s
        for s in segments
        if len(s.ledgers) > 1
        and not only_here(max(s.ledgers))
        and all(only_here(ledger) for ledger in s.ledgers if ledger != max(s.ledgers))
    )
    ledgers_of_first = sorted(first.ledgers)
    spanning = ledgers_of_first[-1]
    for ledger_id in ledgers_of_first[:-1]:
        assert offloader.delete_ledger(ledger_id) == []
        with pytest.raises(OffloadNotFound):
            offloader.read_ledger(ledger_id)
    assert first.sequence in [s.sequence for s in offloader.segments()], "one ledger of it is still there"
    assert offloader.delete_ledger(spanning) == [first.id]
    storage = offloader.storage
    assert not list(storage.list(segment_name(ML, first.id)))
    assert [s.sequence for s in offloader.segments()] == [s.sequence for s in segments if s is not first]
    assert first.sequence not in offloader.ledger(spanning).segments, "its context forgot the segment"
    with pytest.raises(OffloadNotFound):
        offloader.read_ledger(spanning)
    later = spanning + 1
    expected = producer.ledger_entries(later)
    assert offloader.read_ledger(later).read(0, len(expected) - 1) == expected


def test_restore_from_tier2_brings_the_streaming_segments_back(env: Env) -> None:
    storage = env.open(metadata_log_flush_interval_s=0.0)
    offloader = StreamingOffloader(storage, ML, block_bytes=2048, max_segment_bytes=20_000)
    producer = Producer(seed=9)
    stream(offloader, producer, 600)
    expected = offloader.segments()
    revived = env.lose_machine_and_restore(storage)
    offloader = StreamingOffloader(revived, ML)
    assert offloader.segments() == expected
    for ledger_id in range(producer.ledger + 1):
        entries = producer.ledger_entries(ledger_id)
        assert offloader.read_ledger(ledger_id).read(0, len(entries) - 1) == entries


def test_bad_arguments_are_typed_errors(env: Env) -> None:
    storage = env.open()
    for bad in (
        lambda: StreamingOffloader(storage, ""),
        lambda: StreamingOffloader(storage, ML, block_bytes=10),
        lambda: StreamingOffloader(storage, ML, max_segment_age_s=0),
        lambda: StreamingOffloader(storage, ML).streaming_offload("uid"),  # type: ignore[arg-type]
        lambda: StreamingOffloader(storage, ML).streaming_offload(uuid.uuid4(), {"k": 1}),  # type: ignore[dict-item]
    ):
        with pytest.raises(InvalidArgument):
            bad()
    with pytest.raises(OffloadNotFound):
        StreamingOffloader(storage, ML).read_ledger(3)


def test_a_segment_of_an_unknown_format_version_is_refused(env: Env) -> None:
    storage = env.open()
    offloader = StreamingOffloader(storage, ML, block_bytes=2048)
    handle = offloader.streaming_offload(uuid.uuid4(), {}, 0, 0)
    for entry_id in range(10):
        assert handle.offer_entry(0, entry_id, bytes([entry_id]) * 100) == OfferResult.OK
    handle.close()
    (segment,) = offloader.segments()
    assert segment.format_version == formats.FORMAT_VERSION
    assert offloader.read_ledger(0).read(0, 9)[9] == bytes([9]) * 100
    newer = segment.replace(format_version="2")
    storage.context.ownership.commit([Put(OFFLOAD_STREAM_SEGMENTS, segment.key, newer.encode())], [])
    with pytest.raises(InvalidOffloadObject, match="format version '2'"):
        offloader.read_ledger(0)
