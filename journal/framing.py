"""Record framing for the metadata log and the system journal (DESIGN.md §6).

A record on tier-2 is ``[length u32 BE][crc32c u32 BE][msgpack payload]``: ``length``
counts the payload bytes, the CRC covers them. Records are appended back to back.

Reading (``read_records``) is what boot and restore rely on, so it is defensive:

* a **torn tail** (the last record's header or payload cut short, as a crash mid-append
  leaves it) ends the scan; everything before it is returned;
* a **CRC mismatch** skips that record (its length still frames the next one) and is
  counted, because a record whose bytes are wrong must never be applied;
* a **length beyond ``RECORD_BYTES_MAX``** cannot be a record this code wrote: the rest
  of the data cannot be framed, so the scan ends there and reports it;
* a payload that passes its CRC but is not a msgpack map is counted as corrupt too.

With a ``RecordSeal`` (``slts.transforms.sealed``; a store with encryption on), payloads
are sealed when written and opened when read: the CRC covers the sealed bytes, a sealed
payload that fails its tag counts as corrupt, and one whose key is missing raises
``KeyUnavailable`` (the copy cannot be read at all without it). Plain payloads read back
whatever the seal.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import crc32c
import msgpack

from slts.errors import InvalidArgument, MetadataCorrupted
from slts.transforms.sealed import MARKER, RecordSeal

HEADER = struct.Struct(">II")
HEADER_BYTES = HEADER.size
#: Largest payload one record may hold.
RECORD_BYTES_MAX = 64 << 20


def encode_record(payload: Mapping[str, Any], seal: RecordSeal | None = None) -> bytes:
    """The framed bytes of one record (sealed by ``seal`` if it seals). ``InvalidArgument``
    if it is too large or not a map."""
    if not isinstance(payload, Mapping):
        raise InvalidArgument(f"a journal record is a map, got {type(payload).__name__}")
    try:
        body = msgpack.packb(dict(payload), use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidArgument(f"a journal record must hold msgpack values: {exc}") from exc
    return frame(body, seal)


def frame(body: bytes, seal: RecordSeal | None = None) -> bytes:
    """The framed bytes of one record whose msgpack payload ``body`` is already encoded
    (sealed by ``seal`` if it seals): what ``encode_record`` does after encoding.
    ``InvalidArgument`` if it is too large. The caller vouches that ``body`` is one
    msgpack map (``read_records`` counts anything else as corrupt)."""
    if seal is not None:
        body = seal.seal(body)
    if len(body) > RECORD_BYTES_MAX:
        raise InvalidArgument(f"journal record of {len(body)} bytes exceeds {RECORD_BYTES_MAX}")
    return HEADER.pack(len(body), crc32c.crc32c(body)) + body


@dataclass
class ReadResult:
    """The records of one byte string, and what was wrong with the rest of it."""

    records: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # (offset, payload)
    corrupt: int = 0  # records skipped for a bad CRC or a payload that is not a map
    torn_at: int | None = None  # offset of a torn tail, if any
    unframeable_at: int | None = None  # offset where an impossible length stopped the scan
    end: int = 0  # offset just past the last whole record (valid or skipped)


def read_records(
    data: bytes | memoryview, seal: RecordSeal | None = None, start: int = 0, frames_max: int | None = None
) -> ReadResult:
    """Every whole, valid record in ``data``, in order (see module doc); from offset
    ``start`` on, and at most ``frames_max`` frames (valid or skipped) when given.

    One pass over ``data``: per frame, the header, the CRC of the payload and one msgpack
    decode of it (a slice of ``data``, no copy beyond the slice). Offsets (of records,
    ``end``...) count from the start of ``data``."""
    result = ReadResult()
    records = result.records
    header_at, checksum_of, decode = HEADER.unpack_from, crc32c.crc32c, msgpack.unpackb
    offset, size, corrupt = start, len(data), 0
    frames_left = -1 if frames_max is None else frames_max
    while offset < size and frames_left:
        frames_left -= 1
        if size - offset < HEADER_BYTES:
            result.torn_at = offset
            break
        length, checksum = header_at(data, offset)
        if length > RECORD_BYTES_MAX:
            result.unframeable_at = offset
            break
        stop = offset + HEADER_BYTES + length
        if stop > size:
            result.torn_at = offset
            break
        body = data[offset + HEADER_BYTES : stop]
        if checksum_of(body) != checksum:
            corrupt += 1
        else:
            try:
                payload = decode(_opened(body, seal), raw=False, strict_map_key=False)
            except (ValueError, msgpack.UnpackException, MetadataCorrupted):
                payload = None
            if type(payload) is dict:
                records.append((offset, payload))
            else:
                corrupt += 1
        offset = stop
    result.corrupt, result.end = corrupt, offset
    return result


def plain_bodies(data: bytes | memoryview, offset: int) -> Iterator[tuple[int, bytes]]:
    """From ``offset`` of ``data``, each whole frame's payload while the frames are plain:
    (the offset past the frame, its payload), in order. Stops, yielding nothing more, at
    the first frame that is partial, of a bad length, sealed (``MARKER``) or failing its
    CRC32C: the compiled walks' reference loop (their callers read such a frame one by
    one, which raises for damage or opens a sealed record)."""
    size = len(data)
    while offset <= size - HEADER_BYTES:
        payload_bytes, checksum = HEADER.unpack_from(data, offset)
        stop = offset + HEADER_BYTES + payload_bytes
        if not 0 < payload_bytes <= RECORD_BYTES_MAX or stop > size:
            return
        body = bytes(data[offset + HEADER_BYTES : stop])
        if body[0] == MARKER or crc32c.crc32c(body) != checksum:
            return
        yield stop, body
        offset = stop


def _opened(body: bytes | memoryview, seal: RecordSeal | None) -> bytes | memoryview:
    """A payload's msgpack bytes: opened if sealed (``KeyUnavailable`` without a key)."""
    if body and body[0] == MARKER:
        return (seal or RecordSeal(None, sealing=False)).open(bytes(body))
    return body


def read_record_strict(
    data: bytes | memoryview, offset: int, seal: RecordSeal | None = None
) -> tuple[int, dict[str, Any]] | None:
    """The record whose frame starts at ``offset`` of ``data`` and where its frame ends, or
    None if ``data`` ends before the frame does. For bytes that must hold whole, valid
    records (``iter_records_strict``): ``MetadataCorrupted`` on an impossible length, a
    CRC mismatch, or a payload that is not a msgpack map."""
    if len(data) - offset < HEADER_BYTES:
        return None
    length, checksum = HEADER.unpack_from(data, offset)
    if length > RECORD_BYTES_MAX:
        raise MetadataCorrupted(f"impossible record length {length} at offset {offset}")
    stop = offset + HEADER_BYTES + length
    if stop > len(data):
        return None
    body = data[offset + HEADER_BYTES : stop]  # a view of a view: no copy
    if crc32c.crc32c(body) != checksum:
        raise MetadataCorrupted(f"record at offset {offset} fails its CRC")
    try:
        payload = msgpack.unpackb(_opened(body, seal), raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise MetadataCorrupted(f"record at offset {offset} is not msgpack") from exc
    if not isinstance(payload, dict):
        raise MetadataCorrupted(f"record at offset {offset} is not a map")
    return stop, payload


def iter_records_strict(
    pieces: Iterable[bytes | memoryview], seal: RecordSeal | None = None
) -> Iterator[dict[str, Any]]:
    """The records of a byte stream given as ``pieces`` that must hold only whole, valid
    records (a system segment's journaled range: its length is known to be durable, so
    a bad record there is real damage). Raises ``MetadataCorrupted`` on a CRC mismatch,
    a payload that is not a map, or bytes left over at the end.

    Records are read in place from each piece (a view stays a view: no copy of the
    stream); only a record cut across two pieces is put together."""
    carry = b""
    consumed = 0  # stream offset of the start of ``carry`` (or of the piece, without carry)
    for piece in pieces:
        offset = 0
        if carry:
            whole, offset = completed(carry, piece, consumed)
            if whole is None:
                carry += bytes(piece)
                continue
            found = _strict(whole, 0, seal, consumed)
            assert found is not None, "a completed record is whole"
            yield found[1]
            consumed += len(whole)
            carry = b""
        size = len(piece)
        while size - offset >= HEADER_BYTES:
            found = _strict(piece, offset, seal, consumed)
            if found is None:
                break
            stop, payload = found
            yield payload
            consumed += stop - offset
            offset = stop
        carry = bytes(piece[offset:])
    if carry:
        raise MetadataCorrupted(f"{len(carry)} bytes of a partial record at offset {consumed}")


def _strict(
    data: bytes | memoryview, offset: int, seal: RecordSeal | None, at: int
) -> tuple[int, dict[str, Any]] | None:
    """``read_record_strict`` with ``at`` as the stream offset its errors name."""
    try:
        return read_record_strict(data, offset, seal)
    except MetadataCorrupted as exc:
        raise MetadataCorrupted(f"{exc} (stream offset {at})") from exc


def completed(carry: bytes, piece: bytes | memoryview, at: int = 0) -> tuple[bytes | None, int]:
    """The record ``carry`` starts, completed from the start of ``piece``, and how many
    bytes of ``piece`` it took; (None, 0) if ``piece`` ends before the record does.
    ``MetadataCorrupted`` for an impossible length (``at``: its stream offset)."""
    missing = HEADER_BYTES - len(carry)
    head = carry + bytes(piece[:missing]) if missing > 0 else carry
    if len(head) < HEADER_BYTES:
        return None, 0
    length = HEADER.unpack_from(head)[0]
    if length > RECORD_BYTES_MAX:
        raise MetadataCorrupted(f"impossible record length {length} at offset {at}")
    taken = HEADER_BYTES + length - len(carry)
    if taken > len(piece):
        return None, 0
    return carry + bytes(piece[:taken]), taken
