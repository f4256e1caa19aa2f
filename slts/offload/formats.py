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

* **Streaming (PIP-76)**: a segment object's blocks carry their ledger id after the first
  entry id (magic 0x26A66D32, 92 zero bytes after the fields) and hold entries of one
  ledger each; a block is at least the streaming block size and padded up to it. The
  segment's index (magic 0x3D1FB0BC) has no entry count of its own: after a 24-byte
  header (magic, index length, data object length, data header length) come groups
  ``[ledger id i64][entry count i32][metadata length i32][LedgerInfo protobuf][entries]``
  in Java ``HashMap`` order of the ledger ids (what Pulsar's builder iterates), part ids
  and offsets counting over the whole segment object.

Errors about bytes are ``InvalidOffloadObject`` naming the object and the byte offset.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from slts.errors import InvalidOffloadObject

BLOCK_MAGIC = 0xFBDBABCB
INDEX_MAGIC = 0xDE47DE47
STREAMING_BLOCK_MAGIC = 0x26A66D32
STREAMING_INDEX_MAGIC = 0x3D1FB0BC
HEADER_SIZE = 128
ENTRY_HEADER_SIZE = 12
PADDING = b"\xfe\xdc\xde\xad"
#: PIP-17's default block size (``managedLedgerOffloadMaxBlockSizeInBytes``).
MAX_BLOCK_BYTES_DEFAULT = 64 << 20
#: The object format version Pulsar's readers require (``s3managedledgeroffloaderformatversion``).
FORMAT_VERSION = "1"
INT32_MAX = (1 << 31) - 1

_BLOCK_HEADER = struct.Struct(">Iqqq")
ENTRY_HEADER = struct.Struct(">iq")  # (payload length i32, entry id i64)
_INDEX_HEADER = struct.Struct(">Iiqqii")
_INDEX_ENTRY = struct.Struct(">qiq")
_BLOCK_HEADER_ZEROS = bytes(HEADER_SIZE - _BLOCK_HEADER.size)
_STREAMING_HEADER = struct.Struct(">Iqqqq")
_STREAMING_HEADER_ZEROS = bytes(HEADER_SIZE - _STREAMING_HEADER.size)
_STREAMING_INDEX_HEADER = struct.Struct(">Iiqq")
_LEDGER_GROUP = struct.Struct(">qii")

assert ENTRY_HEADER.size == ENTRY_HEADER_SIZE and _INDEX_ENTRY.size == 20 and _BLOCK_HEADER.size == 28


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
    return ENTRY_HEADER.pack(payload_length, entry_id)


def padding(length: int) -> bytes:
    """``length`` bytes of the fill pattern, starting at its first byte."""
    assert length >= 0
    return (PADDING * (length // 4 + 1))[:length]


def block_size(max_block_bytes: int, entries_left: int, payload_bytes_left: int) -> int:
    """The size of the next block: ``max_block_bytes``, or exactly what the rest of the
    ledger needs (128 + 12 per entry + the payload) when that is less."""
    assert entries_left >= 0 and payload_bytes_left >= 0
    return min(max_block_bytes, HEADER_SIZE + ENTRY_HEADER_SIZE * entries_left + payload_bytes_left)


class StreamingBlockHeader(NamedTuple):
    """A streaming data block's header: its length, first entry id and ledger id."""

    block_length: int
    first_entry_id: int
    ledger_id: int

    def encode(self) -> bytes:
        """The header's 128 bytes."""
        assert self.block_length >= HEADER_SIZE and self.first_entry_id >= 0 and self.ledger_id >= 0, self
        fields = _STREAMING_HEADER.pack(
            STREAMING_BLOCK_MAGIC, HEADER_SIZE, self.block_length, self.first_entry_id, self.ledger_id
        )
        return fields + _STREAMING_HEADER_ZEROS


def parse_streaming_block_header(
    data: bytes | memoryview, *, name: str = "", offset: int = 0
) -> StreamingBlockHeader:
    """The streaming header at the start of ``data``; errors as ``parse_block_header``
    (and a negative ledger id)."""
    if len(data) < HEADER_SIZE:
        raise _invalid(f"truncated block header: {len(data)} of {HEADER_SIZE} bytes", name, offset)
    magic, header_length, block_length, first_entry_id, ledger_id = _STREAMING_HEADER.unpack_from(data)
    problem = None
    if magic != STREAMING_BLOCK_MAGIC:
        problem = f"magic {magic:#010x}, expected {STREAMING_BLOCK_MAGIC:#010x}"
    elif header_length != HEADER_SIZE or block_length < HEADER_SIZE:
        problem = f"header length {header_length}, block length {block_length}"
    elif first_entry_id < 0 or ledger_id < 0:
        problem = f"first entry id {first_entry_id}, ledger id {ledger_id}"
    if problem is not None:
        raise _invalid(f"bad block header: {problem}", name, offset)
    return StreamingBlockHeader(block_length, first_entry_id, ledger_id)


def streaming_block_size(min_block_bytes: int, entries: int, payload_bytes: int) -> int:
    """A streaming block's size: at least ``min_block_bytes``, and room for its entries
    (every entry counted: Pulsar leaves the first one out and can overrun the block)."""
    return max(min_block_bytes, HEADER_SIZE + ENTRY_HEADER_SIZE * entries + payload_bytes)


def parse_entry_header(data: bytes | memoryview) -> tuple[int, int]:
    """(length, entry id) of the entry framing at the start of ``data`` (12 bytes). A
    negative length is the fill pattern (it begins with 0xFE), as Pulsar's readers decide."""
    length, entry_id = ENTRY_HEADER.unpack_from(data)
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


class LedgerGroup(NamedTuple):
    """One ledger's part of a streaming index: its LedgerInfo bytes and its blocks."""

    ledger_metadata: bytes
    entries: Sequence[IndexEntry]


@dataclass(frozen=True, slots=True)
class StreamingIndex:
    """The index object of one streaming segment: ledger id -> its group."""

    ledgers: Mapping[int, LedgerGroup]
    data_object_length: int
    data_header_length: int = HEADER_SIZE

    def encode(self) -> bytes:
        """The index object's bytes, the ledgers in Java ``HashMap`` order."""
        groups = []
        for ledger_id in java_hash_map_order(self.ledgers):
            group = self.ledgers[ledger_id]
            groups.append(_LEDGER_GROUP.pack(ledger_id, len(group.entries), len(group.ledger_metadata)))
            groups.append(group.ledger_metadata)
            groups.extend(_INDEX_ENTRY.pack(*entry) for entry in group.entries)
        body = b"".join(groups)
        total = _STREAMING_INDEX_HEADER.size + len(body)
        assert total <= INT32_MAX
        header = _STREAMING_INDEX_HEADER.pack(
            STREAMING_INDEX_MAGIC, total, self.data_object_length, self.data_header_length
        )
        return header + body


def parse_streaming_index(data: bytes | memoryview, *, name: str = "") -> StreamingIndex:
    """The streaming index object in ``data``; ``InvalidOffloadObject`` for a wrong magic,
    lengths that disagree with the bytes, or a group that runs past the end."""
    size = _STREAMING_INDEX_HEADER.size
    if len(data) < size:
        raise _invalid(f"truncated index header: {len(data)} of {size} bytes", name, 0)
    magic, total, data_length, header_length = _STREAMING_INDEX_HEADER.unpack_from(data)
    if magic != STREAMING_INDEX_MAGIC:
        raise _invalid(f"index magic {magic:#010x}, expected {STREAMING_INDEX_MAGIC:#010x}", name, 0)
    if total != len(data) or header_length != HEADER_SIZE or data_length < 0:
        raise _invalid(f"index of {len(data)} bytes says {total}, data header {header_length}", name, 4)
    ledgers: dict[int, LedgerGroup] = {}
    position = size
    while position < total:
        if position + _LEDGER_GROUP.size > total:
            raise _invalid("truncated ledger group", name, position)
        ledger_id, count, metadata_length = _LEDGER_GROUP.unpack_from(data, position)
        end = position + _LEDGER_GROUP.size + metadata_length + _INDEX_ENTRY.size * count
        if count < 1 or metadata_length < 0 or end > total or ledger_id in ledgers:
            raise _invalid(f"bad group of ledger {ledger_id}: {count} entries", name, position)
        metadata_start = position + _LEDGER_GROUP.size
        entries_start = metadata_start + metadata_length
        entries = [
            IndexEntry(*fields) for fields in _INDEX_ENTRY.iter_unpack(memoryview(data)[entries_start:end])
        ]
        ledgers[ledger_id] = LedgerGroup(bytes(data[metadata_start:entries_start]), entries)
        position = end
    return StreamingIndex(ledgers, data_length, header_length)


def java_hash_map_order(keys: Iterable[int]) -> list[int]:
    """The order a ``java.util.HashMap<Long, _>`` built by putting ``keys`` in ascending
    order iterates them: by bucket (the spread hash of ``Long.hashCode``, masked by the
    table size, which starts at 16 and doubles past a load of 0.75), then by insertion."""
    ordered = sorted(keys)
    capacity = 16
    while len(ordered) > capacity * 3 // 4:
        capacity *= 2

    def bucket(key: int) -> int:
        unsigned = key & 0xFFFFFFFFFFFFFFFF
        h = (unsigned ^ (unsigned >> 32)) & 0xFFFFFFFF
        return (h ^ (h >> 16)) & (capacity - 1)

    return sorted(ordered, key=bucket)  # stable: insertion order within a bucket


def check_format_version(version: str, name: str) -> None:
    """``InvalidOffloadObject`` unless objects written in ``version`` are readable here
    (Pulsar's readers refuse every version but their own, too)."""
    if version != FORMAT_VERSION:
        raise _invalid(f"format version {version!r}; this reader reads version {FORMAT_VERSION}", name, 0)


def _invalid(message: str, name: str, offset: int) -> InvalidOffloadObject:
    where = f"offload object {name!r}" if name else "offload object"
    return InvalidOffloadObject(f"{where} at byte {offset}: {message}", object=name, offset=offset)
