"""Kafka's on-disk formats (``slts.remote.kafka_formats``) against genuine Kafka bytes.

The logs are built by kafka-python's batch builder and read back by its reader
(``tests/support/kafka_logs.py``); the indexes the library builds are compared with ones the
helper packs by hand from Kafka's rule. Every malformed input must raise InvalidLogSegment
naming the segment and the byte position or offset.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slts.tools.kafka_logs import (
    BatchInfo,
    KafkaLog,
    build_log,
    decode_records,
    kafka_index_bytes,
    make_batch,
    write_log_dir,
)

from slts.errors import InvalidLogSegment
from slts.remote import kafka_formats as kf

BASE = 1_000_000
SEGMENT = "orders-3/00000000000001000000.log"


@pytest.fixture(scope="module")
def big_log() -> KafkaLog:
    """3,000 batches of 3 records (about 1.2 MB), three leader epochs."""
    return build_log(BASE, 3000, leader_epochs=((3, BASE), (4, BASE + 2100), (9, BASE + 7500)), seed=1)


@pytest.fixture(scope="module")
def single_record_log() -> KafkaLog:
    """2,000 one-record batches from offset 0 with small values: many batches per index entry."""
    return build_log(0, 2000, records_per_batch=1, value_bytes=40, seed=2)


@pytest.fixture(params=["big_log", "single_record_log"])
def kafka_log(request: pytest.FixtureRequest) -> KafkaLog:
    return request.getfixturevalue(request.param)


def headers_of(data: bytes, **kwargs) -> list[kf.BatchHeader]:
    return [header for header, _ in kf.iter_batches(io.BytesIO(data).read, **kwargs)]


def raises_invalid(call: Callable[[], object]) -> InvalidLogSegment:
    with pytest.raises(InvalidLogSegment) as caught:
        call()
    return caught.value


def records_of(count: int, first_timestamp: int = 1000) -> list[tuple[bytes | None, bytes, int]]:
    return [(b"k%d" % i, b"value-%d" % i, first_timestamp + i) for i in range(count)]


# --- scanning genuine logs ---------------------------------------------------------------


def test_scan_log_summarizes_a_genuine_log(kafka_log: KafkaLog, tmp_path) -> None:
    paths = write_log_dir(tmp_path, kafka_log)
    assert paths["log"].name == f"{kafka_log.base_offset:020d}.log"
    summary = kf.scan_log(paths["log"])
    assert summary.base_offset == kafka_log.base_offset
    assert summary.end_offset == kafka_log.end_offset == kafka_log.records[-1][0]
    assert summary.batch_count == len(kafka_log.batches)
    assert summary.size_bytes == len(kafka_log.data)
    assert summary.max_timestamp == max(timestamp for *_, timestamp in kafka_log.records)
    assert summary.leader_epochs == dict(kafka_log.leader_epochs)
    # A file object gives the same summary.
    with paths["log"].open("rb") as file:
        assert kf.scan_log(file, segment="s") == summary


def test_big_log_has_several_epochs_and_unordered_timestamps(big_log: KafkaLog) -> None:
    # The fixture must exercise what it is for: several epochs, and a maximum timestamp that
    # is not the last record's (so max_timestamp is a real maximum, not the last one).
    assert len(kf.scan_log(io.BytesIO(big_log.data)).leader_epochs) == 3
    timestamps = [timestamp for *_, timestamp in big_log.records]
    assert timestamps != sorted(timestamps)
    assert any(
        batch.max_timestamp != big_log.records[batch.last_offset - BASE][3] for batch in big_log.batches
    )


def test_every_batch_round_trips_through_kafka_python(kafka_log: KafkaLog) -> None:
    decoded = []
    position = 0
    for header, batch in kf.iter_batches(io.BytesIO(kafka_log.data).read, segment=SEGMENT):
        assert header.position == position
        assert batch == kafka_log.data[position : position + header.size]
        records = decode_records(batch)
        assert header.base_offset == records[0][0]
        assert header.last_offset == records[-1][0]
        assert header.records_count == len(records)
        assert header.max_timestamp == max(timestamp for *_, timestamp in records)
        assert header.base_timestamp == records[0][3]
        decoded += records
        position += header.size
    assert position == len(kafka_log.data)
    assert decoded == kafka_log.records


def test_header_fields_match_kafka_pythons_reading(big_log: KafkaLog) -> None:
    from kafka.record.default_records import DefaultRecordBatch

    for header, batch in list(kf.iter_batches(io.BytesIO(big_log.data).read))[:200]:
        theirs = DefaultRecordBatch(batch)
        assert (
            header.base_offset,
            header.size,
            header.partition_leader_epoch,
            header.magic,
            header.crc,
            header.attributes,
            header.last_offset_delta,
            header.base_timestamp,
            header.max_timestamp,
            header.producer_id,
            header.producer_epoch,
            header.base_sequence,
            header.records_count,
        ) == (
            theirs.base_offset,
            theirs.size_in_bytes,
            theirs.leader_epoch,
            theirs.magic,
            theirs.crc,
            theirs.attributes,
            theirs.last_offset_delta,
            theirs.first_timestamp,
            theirs.max_timestamp,
            theirs.producer_id,
            theirs.producer_epoch,
            theirs.base_sequence,
            theirs.records_count,
        )
        assert kf.batch_crc(batch) == theirs.crc
        assert not header.is_transactional and not header.is_control


def test_short_reads_and_start_position(big_log: KafkaLog) -> None:
    # A reader that returns at most 7 bytes a call (a socket, a raw file) gives the same batches.
    stream = io.BytesIO(big_log.data)
    trickle = [header for header, _ in kf.iter_batches(lambda n: stream.read(min(n, 7)))]
    assert trickle == headers_of(big_log.data)
    # Reading from the middle: positions count from start_position.
    middle = big_log.batches[100]
    tail = headers_of(big_log.data[middle.position :], start_position=middle.position)
    assert [h.position for h in tail] == [b.position for b in big_log.batches[100:]]


@pytest.mark.parametrize("block_bytes", [0, 1000, 20_000, 1 << 20])
@pytest.mark.parametrize("piece", [7, 4096, None])
def test_the_headers_walk_finds_what_iter_batches_finds(
    big_log: KafkaLog, block_bytes: int, piece: int | None
) -> None:
    """``iter_batch_headers`` (no batch copied out) yields ``iter_batches``' headers for any
    block size and any read size, and the batches are the log's bytes."""

    def reader() -> Callable[[int], bytes]:
        stream = io.BytesIO(big_log.data)
        return lambda n: stream.read(n if piece is None else min(n, piece))

    walked = list(kf.iter_batches(reader(), block_bytes=block_bytes))
    assert list(kf.iter_batch_headers(reader(), block_bytes=block_bytes)) == [header for header, _ in walked]
    assert [batch for _, batch in walked] == [
        big_log.data[b.position : b.position + b.size] for b in big_log.batches
    ]
    assert all(type(batch) is bytes for _, batch in walked)


def test_a_batch_across_two_blocks_is_completed_by_reading_only_what_it_lacks(big_log: KafkaLog) -> None:
    """Every read asks for a whole block, or for the rest of a header or batch that runs
    past one (so only that item is joined, not the next block), and no byte is read twice."""
    stream = io.BytesIO(big_log.data)
    asked: list[int] = []
    got: list[int] = []

    def read(n: int) -> bytes:
        asked.append(n)
        data = stream.read(n)
        got.append(len(data))
        return data

    block = 100_000
    assert len(list(kf.iter_batch_headers(read, block_bytes=block))) == len(big_log.batches)
    largest = max(b.size for b in big_log.batches)
    assert all(n >= block or n < largest for n in asked)
    assert sum(1 for n in asked if n < largest) >= len(big_log.data) // block - 1, "blocks end inside batches"
    assert sum(got) == len(big_log.data)


@pytest.mark.parametrize("damage", ["crc", "truncated"])
def test_the_headers_walk_refuses_damage_as_iter_batches_does(big_log: KafkaLog, damage: str) -> None:
    data = bytearray(big_log.data)
    if damage == "crc":
        batch = big_log.batches[1234]
        data[batch.position + batch.size - 10] ^= 0x01
    else:
        del data[-5:]
    errors = [
        raises_invalid(lambda walk=walk: list(walk(io.BytesIO(bytes(data)).read, block_bytes=50_000)))
        for walk in (kf.iter_batches, kf.iter_batch_headers)
    ]
    assert str(errors[0]) == str(errors[1])
    assert (errors[0].position, errors[0].offset) == (errors[1].position, errors[1].offset)


def test_compressed_batches_gaps_and_attribute_bits() -> None:
    # gzip batches (the records are compressed after the header), offsets with gaps as
    # compaction leaves them.
    compressible = [(None, b"abc" * 200, 5000 + i) for i in range(4)]
    data = b"".join(
        make_batch(base, compressible, leader_epoch=epoch, compression=1)
        for base, epoch in ((0, 1), (10, 1), (100, 2))
    )
    summary = kf.scan_log(io.BytesIO(data))
    assert (summary.base_offset, summary.end_offset, summary.batch_count) == (0, 103, 3)
    assert summary.leader_epochs == {1: 0, 2: 100}
    assert [offset for offset, *_ in decode_records(data)] == [0, 1, 2, 3, 10, 11, 12, 13, 100, 101, 102, 103]
    assert all(header.attributes & 0x07 == 1 for header in headers_of(data))
    # Bits 4 and 5 of the attributes (outside a CRC check: the header parse alone).
    patched = bytearray(data)
    struct.pack_into(">h", patched, 21, 0x30)
    header = kf.parse_batch_header(bytes(patched))
    assert header.is_transactional and header.is_control


def test_negative_leader_epochs_are_skipped() -> None:
    epochs = [-1, 4, -2, 4, 6]
    data = b"".join(make_batch(2 * n, records_of(2), leader_epoch=epoch) for n, epoch in enumerate(epochs))
    assert kf.scan_log(io.BytesIO(data)).leader_epochs == {4: 2, 6: 8}


# --- offset and time indexes -------------------------------------------------------------


def test_built_indexes_equal_kafkas(kafka_log: KafkaLog) -> None:
    headers = headers_of(kafka_log.data)
    base = kafka_log.base_offset
    offset_index = kf.build_offset_index(headers, base)
    time_index = kf.build_time_index(headers, base)
    assert len(offset_index) > 20
    assert kf.encode_offset_index(offset_index, base) == kafka_log.offset_index
    assert kf.encode_time_index(time_index, base) == kafka_log.time_index
    kf.check_offset_index(offset_index, headers, segment=SEGMENT)
    # An active segment's time index lacks only the entry added on roll (if any).
    active = kf.build_time_index(headers, base, rolled=False)
    assert time_index[: len(active)] == active and len(time_index) - len(active) in (0, 1)
    assert time_index[-1].timestamp == max(timestamp for *_, timestamp in kafka_log.records)


@pytest.mark.parametrize("interval", [0, 100, 1000, 50_000, 10_000_000])
def test_built_indexes_equal_kafkas_at_other_intervals(big_log: KafkaLog, interval: int) -> None:
    headers = headers_of(big_log.data)
    expected = kafka_index_bytes(big_log.batches, BASE, interval)
    offset_index = kf.build_offset_index(headers, BASE, interval)
    assert kf.encode_offset_index(offset_index, BASE) == expected[0]
    assert kf.encode_time_index(kf.build_time_index(headers, BASE, interval), BASE) == expected[1]
    if interval == 0:  # every batch but the first is indexed
        assert len(offset_index) == len(headers) - 1
    kf.check_offset_index(offset_index, headers)


def test_index_files_round_trip(kafka_log: KafkaLog) -> None:
    base = kafka_log.base_offset
    offset_index = kf.parse_offset_index(kafka_log.offset_index, base, segment=SEGMENT)
    time_index = kf.parse_time_index(kafka_log.time_index, base, segment=SEGMENT)
    assert kf.encode_offset_index(offset_index, base) == kafka_log.offset_index
    assert kf.encode_time_index(time_index, base) == kafka_log.time_index
    # Kafka's preallocated zeros after the entries are not entries.
    assert kf.parse_offset_index(kafka_log.offset_index + bytes(8 * 500), base) == offset_index
    assert kf.parse_time_index(kafka_log.time_index + bytes(12 * 500), base) == time_index


def test_preallocated_zeros_keep_a_first_entry() -> None:
    assert kf.parse_offset_index(bytes(80), 7) == [kf.OffsetIndexEntry(7, 0)]
    assert kf.parse_time_index(bytes(120), 7) == [kf.TimeIndexEntry(0, 7)]
    assert kf.parse_offset_index(b"", 7) == []


def test_lookup_position_for_every_offset(kafka_log: KafkaLog) -> None:
    entries = kf.parse_offset_index(kafka_log.offset_index, kafka_log.base_offset)
    starts = {batch.position for batch in kafka_log.batches}
    largest_batch = max(batch.size for batch in kafka_log.batches)
    holder = {}
    for batch in kafka_log.batches:
        holder.update(dict.fromkeys(range(batch.base_offset, batch.last_offset + 1), batch))
    # Offsets grouped by the position the index sends them to; one decode per group.
    groups: dict[int, list[int]] = {}
    for offset, *_ in kafka_log.records:
        position = kf.lookup_position(entries, offset)
        floor = [entry.position for entry in entries if entry.offset <= offset]
        assert position == (floor[-1] if floor else 0)
        batch: BatchInfo = holder[offset]
        assert position in starts and position <= batch.position
        # Sparse, but never sparser than the interval allows.
        assert batch.position - position <= kafka_log.interval_bytes + largest_batch
        groups.setdefault(position, []).append(offset)
    assert len(groups) == len(entries) + 1
    by_offset = {record[0]: record for record in kafka_log.records}
    for position, offsets in groups.items():
        last = holder[offsets[-1]]
        decoded = {
            record[0]: record
            for record in decode_records(kafka_log.data[position : last.position + last.size])
        }
        for offset in offsets:
            assert decoded[offset] == by_offset[offset]


def test_lookup_before_the_first_entry_and_in_an_empty_index() -> None:
    entries = [kf.OffsetIndexEntry(10, 100), kf.OffsetIndexEntry(20, 250)]
    assert [kf.lookup_position(entries, offset) for offset in (0, 9, 10, 19, 20, 10**12)] == [
        0,
        0,
        100,
        100,
        250,
        250,
    ]
    assert kf.lookup_position([], 5) == 0


def test_older_followers_multi_batch_entries_are_accepted(big_log: KafkaLog) -> None:
    # Before Kafka 4.0 a follower's append of several batches made one entry: the append's
    # largest offset at its first batch's position. Lookups stay right, so it passes.
    headers = headers_of(big_log.data)
    entries = kf.build_offset_index(headers, BASE)
    after = next(header for header in headers if header.position > entries[3].position)
    entries[3] = kf.OffsetIndexEntry(after.last_offset, entries[3].position)
    kf.check_offset_index(entries, headers)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(
        st.tuples(st.integers(1, 4), st.integers(0, 300), st.integers(-50, 50)), min_size=1, max_size=25
    ),
    gap=st.integers(0, 3),
    interval=st.sampled_from([0, 64, 500, 4096]),
)
def test_indexes_of_random_logs_equal_kafkas(sizes, gap, interval) -> None:
    # Random batches (record count, value size, timestamp jitter), offsets with gaps.
    base = 5000
    data, batches = bytearray(), []
    offset = base
    for number, (count, value_size, jitter) in enumerate(sizes):
        records = [(None, bytes(value_size), 10_000 + number * 20 + jitter + i) for i in range(count)]
        batch = make_batch(offset, records)
        batches.append(
            BatchInfo(len(data), len(batch), offset, offset + count - 1, max(r[2] for r in records), 0)
        )
        data += batch
        offset += count + gap
    headers = headers_of(bytes(data))
    offset_index, time_index = kafka_index_bytes(batches, base, interval)
    built = kf.build_offset_index(headers, base, interval)
    assert kf.encode_offset_index(built, base) == offset_index
    assert kf.encode_time_index(kf.build_time_index(headers, base, interval), base) == time_index
    assert kf.parse_offset_index(offset_index, base) == built
    kf.check_offset_index(built, headers)


@settings(max_examples=100, deadline=None)
@given(
    base=st.integers(0, 2**62),
    steps=st.lists(st.tuples(st.integers(1, 2**20), st.integers(0, 2**16)), max_size=40),
)
def test_index_encoding_round_trips(base, steps) -> None:
    offsets, timestamps = [], []
    offset, position, timestamp = base, 0, -1
    entries = []
    for offset_step, position_step in steps:
        offset += offset_step
        position += position_step
        timestamp += position_step + 1
        entries.append(kf.OffsetIndexEntry(offset, position))
        offsets.append(offset)
        timestamps.append(kf.TimeIndexEntry(timestamp, offset))
    assert kf.parse_offset_index(kf.encode_offset_index(entries, base), base) == entries
    assert kf.parse_time_index(kf.encode_time_index(timestamps, base), base) == timestamps


# --- leader-epoch checkpoint -------------------------------------------------------------


def test_leader_epoch_checkpoint_round_trip(big_log: KafkaLog) -> None:
    entries = kf.parse_leader_epoch_checkpoint(big_log.leader_epoch_checkpoint)
    assert entries == list(big_log.leader_epochs)
    assert kf.encode_leader_epoch_checkpoint(entries) == big_log.leader_epoch_checkpoint
    assert kf.encode_leader_epoch_checkpoint([(0, 0), (5, 120)]) == b"0\n2\n0 0\n5 120\n"
    assert kf.encode_leader_epoch_checkpoint([]) == b"0\n0\n"
    assert kf.parse_leader_epoch_checkpoint(b"0\n0\n") == []
    assert kf.parse_leader_epoch_checkpoint(b"0\n1\n3 7") == [(3, 7)]  # no final newline


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 1000), st.integers(1, 10**12)), max_size=30))
def test_leader_epoch_checkpoint_property(steps) -> None:
    entries, epoch, offset = [], -1, -1
    for epoch_step, offset_step in steps:
        epoch, offset = epoch + epoch_step, offset + offset_step
        entries.append((epoch, offset))
    assert kf.parse_leader_epoch_checkpoint(kf.encode_leader_epoch_checkpoint(entries)) == entries


@pytest.mark.parametrize(
    ("data", "line", "position"),
    [
        (b"0\n3\n0 0\n1 5\n", 2, 2),  # count says 3, holds 2
        (b"0\n1\n0 0\n1 5\n", 2, 2),  # count says 1, holds 2
        (b"1\n1\n0 0\n", 1, 0),  # version 1
        (b"", 1, 0),
        (b"0\n1\n0 x\n", 3, 4),
        (b"0\n1\n0 1 2\n", 3, 4),
        (b"0\n1\n-1 0\n", 3, 4),
        (b"0\ntwo\n", 2, 2),
        (b"0\n2\n5 0\n3 10\n", 4, 8),  # epochs decrease
        (b"0\n2\n3 10\n5 7\n", 4, 9),  # start offsets decrease
        (b"0\n2\n3 10\n3 17\n", 4, 9),  # an epoch twice
    ],
)
def test_bad_leader_epoch_checkpoints(data: bytes, line: int, position: int) -> None:
    error = raises_invalid(lambda: kf.parse_leader_epoch_checkpoint(data, segment="cp"))
    assert (error.segment, error.line, error.position) == ("cp", line, position)


def test_bad_checkpoint_entries_are_not_encoded() -> None:
    raises_invalid(lambda: kf.encode_leader_epoch_checkpoint([(3, 10), (2, 20)]))
    raises_invalid(lambda: kf.encode_leader_epoch_checkpoint([(3, 10), (4, 10)]))


# --- damaged logs ------------------------------------------------------------------------


def scan_error(data: bytes | bytearray) -> InvalidLogSegment:
    error = raises_invalid(lambda: kf.scan_log(io.BytesIO(bytes(data)), segment=SEGMENT))
    assert error.segment == SEGMENT and SEGMENT in str(error)
    return error


def test_flipped_record_byte_is_a_crc_mismatch(big_log: KafkaLog) -> None:
    batch = big_log.batches[1234]
    data = bytearray(big_log.data)
    data[batch.position + batch.size - 10] ^= 0x01  # inside the last record's value
    error = scan_error(data)
    assert (error.position, error.offset) == (batch.position, batch.base_offset)
    assert "CRC" in str(error)
    # Kafka's client agrees the bytes are damaged; without CRC checks the scan passes.
    with pytest.raises(AssertionError, match="CRC"):
        decode_records(bytes(data[batch.position : batch.position + batch.size]))
    assert len(headers_of(bytes(data), verify_crc=False)) == len(big_log.batches)


def test_truncated_batch(big_log: KafkaLog) -> None:
    last = big_log.batches[-1]
    error = scan_error(big_log.data[:-5])
    assert (error.position, error.offset) == (last.position, last.base_offset)
    # Cut inside the header: the offset is still known once its 8 bytes are there.
    error = scan_error(big_log.data[: last.position + 30])
    assert (error.position, error.offset) == (last.position, last.base_offset)
    error = scan_error(big_log.data[: last.position + 5])
    assert (error.position, error.offset) == (last.position, None)


def test_magic_1_batch(big_log: KafkaLog) -> None:
    batch = big_log.batches[500]
    data = bytearray(big_log.data)
    data[batch.position + 16] = 1
    error = scan_error(data)
    assert (error.position, error.offset) == (batch.position, batch.base_offset)
    assert "magic 1" in str(error)


@pytest.mark.parametrize("length", [0, 48, -1, kf.MAX_BATCH_LENGTH + 1])
def test_impossible_batch_length(big_log: KafkaLog, length: int) -> None:
    batch = big_log.batches[7]
    data = bytearray(big_log.data)
    struct.pack_into(">i", data, batch.position + 8, length)
    error = scan_error(data)
    assert (error.position, error.offset) == (batch.position, batch.base_offset)


@pytest.mark.parametrize(
    ("field", "fmt", "value", "message"),
    [
        (0, ">q", -5, "negative base offset"),
        (23, ">i", -1, "negative last offset delta"),
        (57, ">i", -1, "negative records count"),
    ],
)
def test_negative_header_fields(field: int, fmt: str, value: int, message: str) -> None:
    data = bytearray(make_batch(0, records_of(3)) + make_batch(3, records_of(3)))
    second = len(data) // 2
    struct.pack_into(fmt, data, second + field, value)
    error = scan_error(data)
    assert error.position == second
    assert message in str(error)  # found by the header check, before the CRC's


@pytest.mark.parametrize("second_base", [5, 9, 11])
def test_offsets_must_increase(second_base: int) -> None:
    first = make_batch(10, records_of(2))  # offsets 10, 11
    data = first + make_batch(second_base, records_of(2))
    error = scan_error(data)
    assert (error.position, error.offset) == (len(first), second_base)


def test_leader_epoch_must_not_decrease() -> None:
    first = make_batch(0, records_of(2), leader_epoch=5)
    error = scan_error(first + make_batch(2, records_of(2), leader_epoch=3))
    assert (error.position, error.offset) == (len(first), 2)


def test_empty_log(tmp_path) -> None:
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(b"")
    error = raises_invalid(lambda: kf.scan_log(path))
    assert error.segment == path.name and error.position == 0


# --- damaged indexes ---------------------------------------------------------------------


def test_index_of_odd_length(big_log: KafkaLog) -> None:
    error = raises_invalid(
        lambda: kf.parse_offset_index(big_log.offset_index + b"\x01", BASE, segment=SEGMENT)
    )
    assert (error.segment, error.position) == (SEGMENT, len(big_log.offset_index))
    error = raises_invalid(lambda: kf.parse_time_index(big_log.time_index[:-5], BASE, segment=SEGMENT))
    assert (error.segment, error.position) == (SEGMENT, len(big_log.time_index) - 12)


def test_index_entries_out_of_order() -> None:
    entries = [(1, 100), (1, 200)]  # the same offset twice
    data = b"".join(struct.pack(">II", *entry) for entry in entries)
    error = raises_invalid(lambda: kf.parse_offset_index(data, 50, segment="s"))
    assert (error.segment, error.offset, error.position) == ("s", 51, 200)
    data = b"".join(struct.pack(">II", *entry) for entry in [(1, 200), (2, 100)])  # position back
    assert raises_invalid(lambda: kf.parse_offset_index(data, 50)).offset == 52
    data = b"".join(struct.pack(">qI", *entry) for entry in [(9, 1), (9, 2)])  # timestamp repeats
    assert raises_invalid(lambda: kf.parse_time_index(data, 50)).offset == 52
    raises_invalid(lambda: kf.encode_offset_index([kf.OffsetIndexEntry(5, 0), kf.OffsetIndexEntry(4, 9)], 0))


def test_relative_offset_overflow() -> None:
    error = raises_invalid(lambda: kf.parse_offset_index(struct.pack(">II", 2**31, 0), 0, segment="s"))
    assert (error.segment, error.offset) == ("s", 2**31)
    raises_invalid(lambda: kf.parse_time_index(struct.pack(">qI", 5, 2**31), 0))
    raises_invalid(lambda: kf.encode_offset_index([kf.OffsetIndexEntry(2**31 + 10, 0)], 10))
    raises_invalid(lambda: kf.encode_offset_index([kf.OffsetIndexEntry(9, 0)], 10))
    # A log whose offsets an index of its base offset cannot reach.
    headers = headers_of(make_batch(0, records_of(1)) + make_batch(2**31, records_of(1)))
    assert raises_invalid(lambda: kf.build_offset_index(headers, 0, 0)).offset == 2**31


def test_index_entry_into_the_middle_of_a_batch(big_log: KafkaLog) -> None:
    headers = headers_of(big_log.data)
    entries = kf.parse_offset_index(big_log.offset_index, BASE)
    bad = list(entries)
    bad[5] = kf.OffsetIndexEntry(entries[5].offset, entries[5].position + 1)
    error = raises_invalid(lambda: kf.check_offset_index(bad, headers, segment=SEGMENT))
    assert (error.segment, error.offset, error.position) == (
        SEGMENT,
        entries[5].offset,
        entries[5].position + 1,
    )
    assert "not the start of a batch" in str(error)


@pytest.mark.parametrize(
    "change", ["first offset of the batch", "past the next indexed batch", "past the end"]
)
def test_index_entry_offset_disagrees_with_its_batch(big_log: KafkaLog, change: str) -> None:
    headers = headers_of(big_log.data)
    entries = kf.parse_offset_index(big_log.offset_index, BASE)
    by_position = {header.position: header for header in headers}
    number = len(entries) - 1 if change == "past the end" else 5
    entry = entries[number]
    if change == "first offset of the batch":
        offset = by_position[entry.position].base_offset
    elif change == "past the next indexed batch":
        offset = by_position[entries[number + 1].position].base_offset
    else:
        offset = big_log.end_offset + 1
    bad = [*entries[:number], kf.OffsetIndexEntry(offset, entry.position), *entries[number + 1 :]]
    error = raises_invalid(lambda: kf.check_offset_index(bad, headers, segment=SEGMENT))
    assert (error.segment, error.offset, error.position) == (SEGMENT, offset, entry.position)


def test_batches_not_a_whole_segment(big_log: KafkaLog) -> None:
    headers = headers_of(big_log.data)
    error = raises_invalid(lambda: kf.build_offset_index(headers[1:], BASE, segment=SEGMENT))
    assert (error.segment, error.position, error.offset) == (
        SEGMENT,
        headers[1].position,
        headers[1].base_offset,
    )
    with_gap = headers[:3] + headers[4:]
    assert raises_invalid(lambda: kf.build_time_index(with_gap, BASE)).position == headers[4].position
