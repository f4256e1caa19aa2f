"""Pulsar's offload formats byte for byte: objects built by hand from the seeds' layouts
(with Pulsar's code where the seeds are loose) against what ``slts.offload`` writes and
reads. The numbers are the vectors of Pulsar's own tests (``DataBlockHeaderTest``,
``BlockAwareSegmentInputStreamTest``, ``OffloadIndexTest``)."""

from __future__ import annotations

import struct

import pytest

from slts.errors import InvalidArgument, InvalidOffloadObject
from slts.offload import formats
from slts.offload.ledger_metadata import (
    DigestType,
    LedgerMetadata,
    decode_ledger_metadata,
    encode_ledger_metadata,
)

MIB = 1 << 20


def test_a_block_header_is_pulsars_128_bytes() -> None:
    encoded = formats.BlockHeader(block_length=MIB, first_entry_id=3333).encode()
    expected = bytes.fromhex("fbdbabcb000000000000008000000000001000000000000000000d05") + bytes(100)
    assert encoded == expected
    assert formats.parse_block_header(encoded) == (MIB, 3333)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (bytes(128), "magic 0x00000000"),
        (formats.BlockHeader(MIB, 1).encode()[:127], "truncated block header: 127 of 128"),
        (struct.pack(">Iqqq", formats.BLOCK_MAGIC, 64, MIB, 1) + bytes(100), "header length 64"),
        (struct.pack(">Iqqq", formats.BLOCK_MAGIC, 128, 100, 1) + bytes(100), "block length 100"),
        (struct.pack(">Iqqq", formats.BLOCK_MAGIC, 128, MIB, -1) + bytes(100), "negative first entry id"),
    ],
)
def test_a_bad_block_header_names_the_object_and_offset(data: bytes, message: str) -> None:
    with pytest.raises(InvalidOffloadObject, match=message) as caught:
        formats.parse_block_header(data, name="u-ledger-3", offset=4096)
    assert caught.value.object == "u-ledger-3" and caught.value.offset == 4096
    assert "at byte 4096" in str(caught.value)


def test_padding_starts_at_its_first_byte_and_is_cut_at_the_end() -> None:
    assert formats.padding(0) == b""
    assert formats.padding(5) == bytes.fromhex("fedcdeadfe")
    assert formats.padding(1000) == bytes.fromhex("fedcdead") * 250
    assert struct.unpack(">i", formats.padding(4))[0] < 0, "a reader sees a negative length"


@pytest.mark.parametrize(
    ("entries", "size", "max_block", "expected"),
    [
        (161, 8, 3153, 3153),  # testHaveEndPadding: 151 entries and 5 bytes of padding
        (121, 8, 2148, 2148),  # testNoEndPadding: 101 entries exactly
        (90, 8, 1928, 1928),  # testReadTillLac: the whole ledger, 128 + 90 x 20
        (10, 8, 3153, 328),  # the last block: exactly what is left (12, not 4 x 8, per entry)
        (1, 10_000, 20_128, 10_140),
    ],
)
def test_the_block_size_follows_pulsars_formula(
    entries: int, size: int, max_block: int, expected: int
) -> None:
    assert formats.block_size(max_block, entries, entries * size) == expected


def test_an_index_is_pulsars_layout_and_finds_the_block_of_an_entry() -> None:
    metadata = encode_ledger_metadata(LedgerMetadata(last_entry_id=5000, length=100))
    blocks = [
        formats.IndexEntry(0, 1, 0),
        formats.IndexEntry(1000, 2, 64 * MIB),
        formats.IndexEntry(2000, 3, 128 * MIB),
    ]
    index = formats.OffloadIndex(metadata, blocks, data_object_length=192 * MIB)
    encoded = index.encode()
    by_hand = (
        struct.pack(">I", 0xDE47DE47)
        + struct.pack(">i", 32 + len(metadata) + 60)
        + struct.pack(">q", 192 * MIB)
        + struct.pack(">q", 128)
        + struct.pack(">i", 3)
        + struct.pack(">i", len(metadata))
        + metadata
        + b"".join(struct.pack(">qiq", *block) for block in blocks)
    )
    assert encoded == by_hand
    assert formats.parse_index(by_hand) == index
    assert [index.block_for(e) for e in (0, 500, 999, 1000, 1300, 2000, 3000)] == [0, 0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda data: bytes(len(data)), "index magic 0x00000000"),
        (lambda data: data[:-1], "says"),
        (lambda data: data[:20], "truncated index header"),
        (lambda data: data[:4] + struct.pack(">i", len(data) + 20) + data[8:], "says"),
        (lambda data: data[:-20] + struct.pack(">qiq", 1000, 3, 64 * MIB), "bad index entry 1"),
        (lambda data: data[:-20] + struct.pack(">qiq", 1000, 2, 0), "bad index entry 1"),
    ],
)
def test_a_damaged_index_is_a_typed_error(damage, message: str) -> None:  # type: ignore[no-untyped-def]
    metadata = encode_ledger_metadata(LedgerMetadata(last_entry_id=1999, length=100))
    blocks = [formats.IndexEntry(0, 1, 0), formats.IndexEntry(1000, 2, 64 * MIB)]
    data = formats.OffloadIndex(metadata, blocks, data_object_length=128 * MIB).encode()
    with pytest.raises(InvalidOffloadObject, match=message) as caught:
        formats.parse_index(damage(data), name="u-ledger-9-index")
    assert caught.value.object == "u-ledger-9-index"


def test_ledger_metadata_is_bookkeepers_protobuf_in_field_order() -> None:
    metadata = LedgerMetadata(
        ensemble_size=3,
        write_quorum_size=3,
        ack_quorum_size=2,
        last_entry_id=5000,
        length=100,
        closed=True,
        digest_type=DigestType.CRC32C,
        ctime=0,
        ensembles=((0, ("127.0.0.1:3181",)),),
        custom_metadata={"key1": b"value1"},
    )
    member = b"127.0.0.1:3181"
    segment = b"\x0a" + bytes([len(member)]) + member + b"\x10\x00"
    custom = b"\x0a\x04key1\x12\x06value1"
    by_hand = (
        b"\x08\x03"  # 1 quorumSize
        b"\x10\x03"  # 2 ensembleSize
        b"\x18\x64"  # 3 length 100
        b"\x20\x88\x27"  # 4 lastEntryId 5000
        b"\x28\x03"  # 5 state CLOSED
        + b"\x32"
        + bytes([len(segment)])
        + segment  # 6 segment
        + b"\x38\x03"  # 7 digestType CRC32C
        b"\x48\x02"  # 9 ackQuorumSize
        b"\x50\x00"  # 10 ctime
         + b"\x5a" + bytes([len(custom)]) + custom  # 11 customMetadata
    )
    assert encode_ledger_metadata(metadata) == by_hand
    assert decode_ledger_metadata(by_hand) == metadata


def test_bad_ledger_metadata_is_a_typed_error() -> None:
    with pytest.raises(InvalidOffloadObject, match="does not parse"):
        decode_ledger_metadata(b"\x08\x03", name="x-index")  # required fields missing
    with pytest.raises(InvalidOffloadObject, match="does not parse"):
        decode_ledger_metadata(b"\xff\xff\xff")
    with pytest.raises(InvalidArgument, match="quorums"):
        LedgerMetadata(ensemble_size=2, write_quorum_size=3)
    with pytest.raises(InvalidArgument, match="ensembles"):
        LedgerMetadata(ensembles=((5, ("a:1",)),))
