"""Sealed records (the metadata's copy on tier-2 and the journal of an encrypted store):
sealed and opened, plain ones passed through, a changed byte ``MetadataCorrupted``, a
missing key ``KeyUnavailable`` naming it, a new data key after ``RECORDS_PER_KEY``."""

from __future__ import annotations

import msgpack
import pytest
from slts.journal import framing

from slts.errors import InvalidArgument, KeyUnavailable, MetadataCorrupted
from slts.transforms import sealed
from slts.transforms.sealed import MARKER, RecordSeal
from tests.support.engine import key_ring


def test_a_record_is_sealed_and_opened_and_plain_ones_pass(tmp_path) -> None:
    seal = RecordSeal(key_ring(tmp_path), sealing=True)
    body = msgpack.packb({"segment": "orders/secret", "s": 7})
    closed = seal.seal(body)
    assert closed[0] == MARKER and b"orders/secret" not in closed
    assert seal.open(closed) == body
    assert seal.open(body) == body, "a plain record reads as it is"
    assert RecordSeal(None, sealing=False).open(body) == body
    assert seal.seal(body) != closed, "a fresh nonce per record"


def test_a_changed_byte_is_metadata_corrupted_and_a_missing_key_key_unavailable(tmp_path) -> None:
    ring = key_ring(tmp_path)
    closed = RecordSeal(ring, sealing=True).seal(b"\x81\xa1a\x01")
    for position in range(len(closed)):
        damaged = bytearray(closed)
        damaged[position] ^= 0x04
        if position == 0:
            continue  # no longer sealed: a plain body (and a msgpack decode error later)
        with pytest.raises((MetadataCorrupted, KeyUnavailable)):
            RecordSeal(ring, sealing=False).open(bytes(damaged))
    with pytest.raises(KeyUnavailable) as caught:
        RecordSeal(None, sealing=False).open(closed)
    assert caught.value.key_id == ring.active_id()
    with pytest.raises(InvalidArgument):
        RecordSeal(None, sealing=True)


def test_a_writer_draws_a_new_data_key_after_records_per_key(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(sealed, "RECORDS_PER_KEY", 3)
    seal = RecordSeal(key_ring(tmp_path), sealing=True)
    records = [seal.seal(b"\x80") for _ in range(7)]
    heads = {record[: 3 + record[2] + 40] for record in records}  # up to the nonce: key id, wrapped key
    assert len(heads) == 3, "7 records under keys of 3 records each"


def test_framing_seals_and_reads_back_and_counts_a_bad_tag_as_corrupt(tmp_path) -> None:
    ring = key_ring(tmp_path)
    seal = RecordSeal(ring, sealing=True)
    data = b"".join(framing.encode_record({"n": n}, seal) for n in range(5))
    assert [r for _, r in framing.read_records(data, seal).records] == [{"n": n} for n in range(5)]
    assert list(framing.iter_records_strict([data], seal)) == [{"n": n} for n in range(5)]
    with pytest.raises(KeyUnavailable):
        framing.read_records(data)
    # A sealed body changed, its CRC recomputed (a deliberate change): corrupt, skipped.
    header = framing.HEADER_BYTES
    first = framing.encode_record({"n": 0}, seal)
    body = bytearray(first[header:])
    body[-1] ^= 1
    import struct

    import crc32c

    forged = struct.pack(">II", len(body), crc32c.crc32c(bytes(body))) + bytes(body)
    result = framing.read_records(forged + data[len(first) :], seal)
    assert result.corrupt == 1 and [r for _, r in result.records] == [{"n": n} for n in range(1, 5)]
    with pytest.raises(MetadataCorrupted):
        list(framing.iter_records_strict([forged], seal))
