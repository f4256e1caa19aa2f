"""Record framing: round trips, torn tails and corruption never yield a wrong record."""

from __future__ import annotations

import itertools

import crc32c
import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st
from slts.journal.framing import (
    HEADER_BYTES,
    RECORD_BYTES_MAX,
    encode_record,
    iter_records_strict,
    read_records,
)

from slts.errors import InvalidArgument, MetadataCorrupted

payloads = st.dictionaries(
    st.text(max_size=8),
    st.one_of(st.integers(-(2**63), 2**64 - 1), st.binary(max_size=40), st.text(max_size=20)),
    max_size=5,
)


@given(st.lists(payloads, max_size=12))
def test_round_trip(records: list[dict]) -> None:
    data = b"".join(encode_record(record) for record in records)
    result = read_records(data)
    assert [payload for _, payload in result.records] == records
    assert result.corrupt == 0 and result.torn_at is None and result.end == len(data)


@given(st.lists(payloads, min_size=1, max_size=8), st.data())
def test_a_torn_tail_yields_exactly_the_whole_records_before_it(
    records: list[dict], data: st.DataObject
) -> None:
    frames = [encode_record(record) for record in records]
    blob = b"".join(frames)
    cut = data.draw(st.integers(0, len(blob) - 1))
    result = read_records(blob[:cut])
    whole, position = 0, 0
    for frame in frames:
        if position + len(frame) > cut:
            break
        position += len(frame)
        whole += 1
    assert [payload for _, payload in result.records] == records[:whole]
    assert result.torn_at == (position if cut > position else None)


@given(st.lists(payloads, min_size=1, max_size=8), st.data())
def test_a_flipped_byte_never_yields_a_wrong_record(records: list[dict], data: st.DataObject) -> None:
    blob = bytearray(b"".join(encode_record(record) for record in records))
    position = data.draw(st.integers(0, len(blob) - 1))
    blob[position] ^= data.draw(st.integers(1, 255))
    result = read_records(bytes(blob))
    assert all(payload in records for _, payload in result.records)
    damage_seen = result.corrupt or result.torn_at is not None or result.unframeable_at is not None
    if not damage_seen:  # the flip landed where it changes nothing decodable (e.g. an equal re-encoding)
        assert [payload for _, payload in result.records] == records


def test_impossible_length_stops_the_scan() -> None:
    good = encode_record({"a": 1})
    bad = (RECORD_BYTES_MAX + 1).to_bytes(4, "big") + bytes(4) + b"junk"
    result = read_records(good + bad + good)
    assert [payload for _, payload in result.records] == [{"a": 1}]
    assert result.unframeable_at == len(good)


def test_bad_payloads_are_refused() -> None:
    with pytest.raises(InvalidArgument):
        encode_record([1, 2])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        encode_record({"too big": 2**70})
    assert HEADER_BYTES == 8


def _frame(body: bytes) -> bytes:
    """A frame with a valid CRC around any ``body`` (msgpack or not)."""
    return len(body).to_bytes(4, "big") + crc32c.crc32c(body).to_bytes(4, "big") + body


@pytest.mark.parametrize(
    "bad",
    [
        "crc",  # the payload's bytes changed
        _frame(msgpack.packb([1, 2])),  # valid msgpack, not a map
        _frame(msgpack.packb({"a": 1}) + b"\x01"),  # a map followed by extra bytes
        _frame(b"\xc1"),  # not msgpack at all
        _frame(b""),  # nothing
    ],
)
def test_a_bad_record_in_the_middle_is_counted_and_its_neighbours_kept(bad: bytes | str) -> None:
    frames = [encode_record({"n": i, "pad": "x" * i}) for i in range(5)]
    if bad == "crc":
        damaged = bytearray(frames[2])
        damaged[-1] ^= 0x10
        frames[2] = bytes(damaged)
    else:
        assert isinstance(bad, bytes)
        frames[2] = bad
    blob = b"".join(frames)
    result = read_records(blob)
    offsets = [sum(len(f) for f in frames[:i]) for i in range(5)]
    assert result.records == [(offsets[i], {"n": i, "pad": "x" * i}) for i in (0, 1, 3, 4)]
    assert result.corrupt == 1 and result.torn_at is None and result.unframeable_at is None
    assert result.end == len(blob)


@given(st.lists(payloads, max_size=10), st.lists(st.integers(0, 400), max_size=6), st.booleans())
def test_strict_reading_over_pieces_cut_anywhere_yields_the_records(
    records: list[dict], cuts: list[int], as_views: bool
) -> None:
    """``iter_records_strict`` reads records in place from each piece and puts together
    only those cut across pieces: any cutting of the stream, bytes or views, yields the
    records; a stream cut short raises, naming where."""
    blob = b"".join(encode_record(record) for record in records)
    points = sorted({0, len(blob), *(min(cut, len(blob)) for cut in cuts)})
    pieces = [blob[a:b] for a, b in itertools.pairwise(points)]
    if as_views:
        pieces = [memoryview(piece) for piece in pieces]  # type: ignore[misc]
    assert list(iter_records_strict(pieces)) == records
    if blob:
        with pytest.raises(MetadataCorrupted, match="partial record"):
            list(iter_records_strict([blob[:-1]]))
