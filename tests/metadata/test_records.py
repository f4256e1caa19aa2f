"""The metadata records' codec (``slts.metadata.records``): round trips, records written by
older and newer versions, and bad bytes as ``MetadataCorrupted``, never anything else."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from slts.errors import MetadataCorrupted
from slts.metadata.records import (
    ChunkRecord,
    ContainerRecord,
    GcEntry,
    GcReason,
    Record,
    SegmentRecord,
    SegmentStatus,
)

SEGMENT = SegmentRecord(
    name="stream/0",
    segment_id=7,
    status=SegmentStatus.ACTIVE,
    start_offset=10,
    length=300,
    first_chunk="c1",
    last_chunk="c2",
    first_chunk_start_offset=0,
    last_chunk_start_offset=200,
    max_rolling_length=1 << 20,
    owner_epoch=3,
    chunk_count=2,
    created_ms=1,
    modified_ms=2,
    index_depth=1,
)
CHUNK = ChunkRecord("c1", 7, 0, 200, "c2", 3, 12345, b"\x00\x00\x00\xc8\x00\x00\x30\x39")
RECORDS: list[Record] = [
    SEGMENT,
    CHUNK,
    ContainerRecord(0, 4, 99),
    GcEntry("c9", GcReason.DROPPED, 5, False),
]


def fields_of(data: bytes) -> dict:
    return msgpack.unpackb(data, raw=False)


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.KIND)
def test_every_kind_round_trips(record: Record) -> None:
    data = record.encode()
    assert type(record).decode(data) == record
    assert fields_of(data)["v"] == 1
    assert type(record).decode(data).encode() == data


def test_fields_of_a_newer_version_are_kept_and_written_back_first() -> None:
    newer = {"tier": "cold", **fields_of(SEGMENT.encode()), "zz": [1, 2]}
    record = SegmentRecord.decode(msgpack.packb(newer, use_bin_type=True))
    assert record == SEGMENT and dict(record.extra) == {"tier": "cold", "zz": [1, 2]}
    again = fields_of(record.replace(length=400).encode())
    assert list(again)[:2] == ["tier", "zz"] and again["length"] == 400
    assert {k: again[k] for k in ("tier", "zz")} == {"tier": "cold", "zz": [1, 2]}


def test_a_record_written_before_an_optional_field_decodes_with_its_default() -> None:
    older = fields_of(SEGMENT.encode())
    del older["index_depth"]
    assert SegmentRecord.decode(msgpack.packb(older)).index_depth is None
    chunk = fields_of(CHUNK.encode())
    del chunk["blocks"]
    assert ChunkRecord.decode(msgpack.packb(chunk)) == CHUNK.replace(blocks=None)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"\xc1", "not valid msgpack"),
        (msgpack.packb([1, 2]), "no format version"),
        (msgpack.packb({"name": "x"}), "no format version"),
        (msgpack.packb({**fields_of(CHUNK.encode()), "length": None}), "breaks an invariant"),
        (msgpack.packb({**fields_of(CHUNK.encode()), "next_chunk": "c1"}), "breaks an invariant"),
    ],
)
def test_bad_bytes_are_metadata_corrupted(data: bytes, says: str) -> None:
    with pytest.raises(MetadataCorrupted, match=says):
        ChunkRecord.decode(data)


def test_a_missing_required_field_is_named() -> None:
    fields = fields_of(SEGMENT.encode())
    del fields["owner_epoch"]
    with pytest.raises(MetadataCorrupted, match="lacks field 'owner_epoch'"):
        SegmentRecord.decode(msgpack.packb(fields))


def test_a_gc_entry_with_an_unknown_reason_is_corrupted() -> None:
    fields = fields_of(GcEntry("c", GcReason.INTENT, 1, False).encode())
    with pytest.raises(MetadataCorrupted, match="breaks an invariant"):
        GcEntry.decode(msgpack.packb({**fields, "reason": "tidy"}))


names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)
extras = st.dictionaries(
    st.text(min_size=1, max_size=8).filter(lambda k: k != "v" and k not in ChunkRecord._field_names()),
    st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=8), st.binary(max_size=8), st.none()),
    max_size=3,
)


@given(
    name=names,
    index_id=st.integers(1, 2**63 - 1),
    index_offset=st.integers(0, 2**63 - 1),
    length=st.integers(0, 2**63 - 1),
    next_chunk=st.none() | names,
    epoch=st.integers(0, 2**63 - 1),
    checksum=st.none() | st.integers(0, 2**32 - 1),
    blocks=st.none() | st.binary(max_size=64).map(lambda b: b[: len(b) // 8 * 8]),
    extra=extras,
)
def test_chunk_records_round_trip_with_any_unknown_fields(
    name, index_id, index_offset, length, next_chunk, epoch, checksum, blocks, extra
) -> None:
    if next_chunk == name:
        next_chunk = None
    record = ChunkRecord(name, index_id, index_offset, length, next_chunk, epoch, checksum, blocks)
    written = msgpack.packb({**extra, **fields_of(record.encode())}, use_bin_type=True)
    decoded = ChunkRecord.decode(written)
    assert decoded == record and dict(decoded.extra) == extra
    assert decoded.encode() == written
