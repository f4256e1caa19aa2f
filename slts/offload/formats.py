"""Pulsar's offload object formats, byte for byte (PIP-17 ledger offload).

The seeds describe the layouts; Pulsar's offloaders (``BlockAwareSegmentInputStreamImpl``,
``DataBlockHeaderImpl``, ``OffloadIndexBlockImpl``) are what wrote the objects that exist in
buckets today, and where the two differ these functions follow the code (``docs/offload.md``
lists the differences). Every integer is big-endian, two's complement.

* **Data object**: blocks back to back. A block is a 128-byte header, whole entries framed
  as ``[entry length i32][entry id i64][payload]``, then padding: the bytes FE DC DE AD
  repeated from the first byte after the last entry (phase 0 there), cut at the block's
  end. Header::

      offset  size  field
       0      u32   magic 0xFBDBABCB
       4      i64   header length (128)
      12      i64   block length (the whole block, header and padding included)
      20      i64   first entry id of the block
      28      100   zero bytes

  Every block has ``max_block_bytes`` except the last, which has exactly what is left
  (``block_size``: the seed's formula has ``4 * 8`` bytes per entry where the framing is 12).

* **Index object**::

      offset  size  field
       0      u32   magic 0xDE47DE47
       4      i32   index length (the whole object)
       8      i64   data object length
      16      i64   data header length (128)
      24      i32   index entry count
      28      i32   ledger metadata length
      32      ...   ledger metadata (BookKeeper's LedgerMetadataFormat, protobuf)
      ...     20 x  (first entry id i64, part id i32, block offset i64), ascending

  Part ids count blocks from 1 (the multipart upload's part numbers); a block's offset is
  where its header starts in the data object.

Errors about bytes are ``InvalidOffloadObject`` naming the object and the byte offset.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from slts.errors import InvalidOffloadObject

BLOCK_MAGIC = 0xFBDBABCB
INDEX_MAGIC = 0xDE47DE47
HEADER_SIZE = 128
ENTRY_HEADER_SIZE = 12
PADDING = b"\xfe\xdc\xde\xad"
#: PIP-17's default block size (``managedLedgerOffloadMaxBlockSizeInBytes``).
MAX_BLOCK_BYTES_DEFAULT = 64 << 20
#: The object format version Pulsar's readers require (``s3managedledgeroffloaderformatversion``).
FORMAT_VERSION = "1"
INT32_MAX = (1 << 31) - 1

_BLOCK_HEADER = struct.Struct(">Iqqq")
_ENTRY_HEADER = struct.Struct(">iq")
_INDEX_HEADER = struct.Struct(">Iiqqii")
_INDEX_ENTRY = struct.Struct(">qiq")
_BLOCK_HEADER_ZEROS = bytes(HEADER_SIZE - _BLOCK_HEADER.size)

assert _ENTRY_HEADER.size == ENTRY_HEADER_SIZE and _INDEX_ENTRY.size == 20 and _BLOCK_HEADER.size == 28


class BlockHeader(NamedTuple):
    """A data block's header: the block's whole length and its first entry id."""

    block_length: int
    first_entry_id: int

    def encode(self) -> bytes:
        """The header's 128 bytes."""
        assert self.block_length >= HEADER_SIZE and self.first_entry_id >= 0, self
        return _BLOCK_HEADER.pack(BLOCK_MAGIC, HEADER_SIZE, self.block_length, self.first_entry_id) + (
            _BLOCK_HEADER_ZEROS
        )


def parse_block_header(data: bytes | memoryview, *, name: str = "", offset: int = 0) -> BlockHeader:
    """The header at the start of ``data`` (the block at byte ``offset`` of object ``name``).
    Raises ``InvalidOffloadObject`` for fewer than 128 bytes, a wrong magic, a header
    length other than 128, a block length below it or a negative first entry id."""
    if len(data) < HEADER_SIZE:
        raise _invalid(f"truncated block header: {len(data)} of {HEADER_SIZE} bytes", name, offset)
    magic, header_length, block_length, first_entry_id = _BLOCK_HEADER.unpack_from(data)
    problem = None
    if magic != BLOCK_MAGIC:
        problem = f"magic {magic:#010x}, expected {BLOCK_MAGIC:#010x}"
    elif header_length != HEADER_SIZE:
        problem = f"header length {header_length}, expected {HEADER_SIZE}"
    elif block_length < HEADER_SIZE:
        problem = f"block length {block_length} below the header's {HEADER_SIZE}"
    elif first_entry_id < 0:
        problem = f"negative first entry id {first_entry_id}"
    if problem is not None:
        raise _invalid(f"bad block header: {problem}", name, offset)
    return BlockHeader(block_length, first_entry_id)


def entry_header(entry_id: int, payload_length: int) -> bytes:
    """The 12 bytes that frame an entry in a block (its payload follows them)."""
    assert entry_id >= 0 and 0 <= payload_length <= INT32_MAX
    return _ENTRY_HEADER.pack(payload_length, entry_id)


def padding(length: int) -> bytes:
    """``length`` bytes of the fill pattern, starting at its first byte."""
    assert length >= 0
    return (PADDING * (length // 4 + 1))[:length]


def block_size(max_block_bytes: int, entries_left: int, payload_bytes_left: int) -> int:
    """The size of the next block: ``max_block_bytes``, or exactly what the rest of the
    ledger needs (128 + 12 per entry + the payload) when that is less."""
    assert entries_left >= 0 and payload_bytes_left >= 0
    return min(max_block_bytes, HEADER_SIZE + ENTRY_HEADER_SIZE * entries_left + payload_bytes_left)


def parse_entry_header(data: bytes | memoryview) -> tuple[int, int]:
    """(length, entry id) of the entry framing at the start of ``data`` (12 bytes). A
    negative length is the fill pattern (it begins with 0xFE), as Pulsar's readers decide."""
    length, entry_id = _ENTRY_HEADER.unpack_from(data)
    return length, entry_id


class IndexEntry(NamedTuple):
    """A block in the index: its first entry id, part id (from 1) and byte offset."""

    entry_id: int
    part_id: int
    offset: int


@dataclass(frozen=True, slots=True)
class OffloadIndex:
    """The index object of one offloaded ledger."""

    ledger_metadata: bytes
    entries: Sequence[IndexEntry]
    data_object_length: int
    data_header_length: int = HEADER_SIZE

    def encode(self) -> bytes:
        """The index object's bytes."""
        body = b"".join(_INDEX_ENTRY.pack(*entry) for entry in self.entries)
        total = _INDEX_HEADER.size + len(self.ledger_metadata) + len(body)
        assert total <= INT32_MAX
        header = _INDEX_HEADER.pack(
            INDEX_MAGIC,
            total,
            self.data_object_length,
            self.data_header_length,
            len(self.entries),
            len(self.ledger_metadata),
        )
        return header + self.ledger_metadata + body

    def block_for(self, entry_id: int) -> int:
        """The position in ``entries`` of the block holding ``entry_id`` (the greatest first
        entry id at or below it); ``entry_id`` is at least the first block's."""
        low, high = 0, len(self.entries)
        while low < high:
            middle = (low + high) // 2
            if self.entries[middle].entry_id <= entry_id:
                low = middle + 1
            else:
                high = middle
        assert low > 0, (entry_id, self.entries[:1])
        return low - 1


def parse_index(data: bytes | memoryview, *, name: str = "") -> OffloadIndex:
    """The index object in ``data``. Raises ``InvalidOffloadObject`` (naming ``name`` and
    the byte offset) for a wrong magic, lengths that disagree with the bytes, entries whose
    ids do not increase from 0, part ids not counting from 1, or offsets that do not
    increase within the data object's length."""
    if len(data) < _INDEX_HEADER.size:
        raise _invalid(f"truncated index header: {len(data)} of {_INDEX_HEADER.size} bytes", name, 0)
    magic, total, data_length, header_length, count, metadata_length = _INDEX_HEADER.unpack_from(data)
    if magic != INDEX_MAGIC:
        raise _invalid(f"index magic {magic:#010x}, expected {INDEX_MAGIC:#010x}", name, 0)
    expected_total = _INDEX_HEADER.size + metadata_length + _INDEX_ENTRY.size * count
    if count < 0 or metadata_length < 0 or total != expected_total or len(data) != total:
        raise _invalid(
            f"index of {len(data)} bytes says {total} (count {count}, metadata {metadata_length} bytes)",
            name,
            4,
        )
    if header_length != HEADER_SIZE or data_length < 0:
        raise _invalid(f"data header length {header_length}, data length {data_length}", name, 8)
    metadata_end = _INDEX_HEADER.size + metadata_length
    entries = [IndexEntry(*fields) for fields in _INDEX_ENTRY.iter_unpack(memoryview(data)[metadata_end:])]
    for number, entry in enumerate(entries):
        position = metadata_end + number * _INDEX_ENTRY.size
        previous = entries[number - 1] if number else None
        if (
            entry.part_id != number + 1
            or (previous is None and (entry.entry_id, entry.offset) != (0, 0))
            or (
                previous is not None
                and (entry.entry_id <= previous.entry_id or entry.offset <= previous.offset)
            )
            or entry.offset + HEADER_SIZE > data_length
        ):
            raise _invalid(f"bad index entry {number}: {entry}", name, position)
    return OffloadIndex(bytes(data[_INDEX_HEADER.size : metadata_end]), entries, data_length, header_length)


def _invalid(message: str, name: str, offset: int) -> InvalidOffloadObject:
    where = f"offload object {name!r}" if name else "offload object"
    return InvalidOffloadObject(f"{where} at byte {offset}: {message}", object=name, offset=offset)
