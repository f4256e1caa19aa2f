"""Export and import one segment's metadata (PDP-34 "Backup and Restore of the segments").

An export is a self-checking document that describes a segment completely: its header
record and its chunk records in list order, each with its start offset. Chunks are not
copied: the document names chunks on the chunk storage, so it restores a segment into a
metadata store that lost it (or into another container on the same chunk storage).

Format: ``MAGIC`` + CRC32C (u32 BE) of the payload + the msgpack payload
``{"v": 1, "segment": <SegmentRecord bytes>, "chunks": [[start, <ChunkRecord bytes>], ...]}``.
Records use their own versioned codec, so unknown fields survive the round trip.

``import_segment`` checks that every chunk exists with at least its recorded length,
gives the segment a new ``segment_id`` and re-anchors every chunk in that namespace
(index entries at the chunks' offsets), in one commit, so at most
``IMPORT_CHUNKS_MAX`` chunks per segment.
"""

from __future__ import annotations

import struct

import crc32c
import msgpack

from slts.errors import ChunkNotFound, InvalidArgument, MetadataCorrupted, SegmentExists
from slts.metadata import index
from slts.metadata.records import ChunkRecord, SegmentRecord, SegmentStatus
from slts.metadata.schema import CHUNKS, SEGMENTS, name_key
from slts.metadata.store import Expect, Operation, Put
from slts.storage.chunked import ChunkedSegmentStorage, SegmentInfo
from slts.storage.segment_names import check_segment_name

MAGIC = b"SLTS-SEGMENT\n"
FORMAT_VERSION = 1
#: Chunks one import may carry (three operations each must fit one commit).
IMPORT_CHUNKS_MAX = 30_000
_CRC = struct.Struct(">I")


def check_unreferenced(storage: ChunkedSegmentStorage, chunks: list[str]) -> None:
    """``InvalidArgument`` if any of ``chunks`` belongs to a segment of this store (live,
    or deleted and awaiting GC): an import never takes a chunk from another segment."""
    for chunk in chunks:
        if storage.context.store.get(CHUNKS, name_key(chunk)) is not None:
            raise InvalidArgument(f"chunk {chunk!r} belongs to a segment of this store already", chunk=chunk)


def export_segment(storage: ChunkedSegmentStorage, name: str) -> bytes:
    """The export document of segment ``name``. Raises ``SegmentNotFound``."""
    record, _ = storage.context.load(name)
    chunks = [[start, chunk.encode()] for start, chunk in storage.chunks(name)]
    payload = msgpack.packb(
        {"v": FORMAT_VERSION, "segment": record.encode(), "chunks": chunks}, use_bin_type=True
    )
    return MAGIC + _CRC.pack(crc32c.crc32c(payload)) + payload


def parse_export(document: bytes) -> tuple[SegmentRecord, list[tuple[int, ChunkRecord]]]:
    """The segment and chunk records of an export; ``MetadataCorrupted`` if damaged."""
    if not isinstance(document, (bytes, bytearray)) or not document.startswith(MAGIC):
        raise MetadataCorrupted("not an SLTS segment export (bad magic)")
    body = bytes(document[len(MAGIC) :])
    if len(body) < _CRC.size or _CRC.unpack_from(body)[0] != crc32c.crc32c(body[_CRC.size :]):
        raise MetadataCorrupted("segment export fails its CRC32C check")
    try:
        payload = msgpack.unpackb(body[_CRC.size :], raw=False)
        if payload.get("v") != FORMAT_VERSION:
            raise MetadataCorrupted(f"segment export has format version {payload.get('v')!r}")
        record = SegmentRecord.decode(payload["segment"])
        chunks = [(int(start), ChunkRecord.decode(raw)) for start, raw in payload["chunks"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise MetadataCorrupted(f"segment export is malformed: {exc}") from exc
    if len(chunks) != record.chunk_count:
        raise MetadataCorrupted("segment export lists a different number of chunks than its header says")
    return record, chunks


def import_segment(
    storage: ChunkedSegmentStorage, document: bytes, *, name: str | None = None
) -> SegmentInfo:
    """Create the exported segment (under ``name`` if given) from an export document.

    Raises ``MetadataCorrupted`` (damaged document), ``InvalidName``, ``SegmentExists``,
    ``ChunkNotFound`` (a chunk missing or shorter than recorded), ``InvalidArgument``
    (more than ``IMPORT_CHUNKS_MAX`` chunks, or a chunk another segment of this store
    references), ``Fenced``. One commit; nothing is written
    to the chunk storage; a chunk another segment references makes it fail unchanged.
    """
    record, chunks = parse_export(document)
    target = check_segment_name(record.name if name is None else name)
    if len(chunks) > IMPORT_CHUNKS_MAX:
        raise InvalidArgument(
            f"segment export has {len(chunks)} chunks; one import takes {IMPORT_CHUNKS_MAX}"
        )
    if storage.exists(target):
        raise SegmentExists(f"segment {target!r} exists", segment=target)
    binding = storage.chunk_storage
    check_unreferenced(storage, [chunk.name for _, chunk in chunks])
    for _, chunk in chunks:
        if binding.get_info(chunk.name).length < chunk.length:
            raise ChunkNotFound(f"chunk {chunk.name!r} holds fewer bytes than its record", chunk=chunk.name)
    segment_id = storage.context.new_segment_id()
    ops: list[Operation] = []
    expect = [Expect(SEGMENTS, name_key(target), 0)]
    for start, chunk in chunks:
        anchored = chunk.replace(index_id=segment_id, index_offset=start)
        ops.append(Put(CHUNKS, name_key(chunk.name), anchored.encode()))
        ops.append(index.chunk_entry(anchored))
        expect.append(Expect(CHUNKS, name_key(chunk.name), 0))
    now = storage.context.now_ms()
    restored = record.replace(
        name=target,
        segment_id=segment_id,
        owner_epoch=storage.epoch,
        modified_ms=now,
        index_depth=0,
        status=int((record.status | SegmentStatus.ACTIVE) & ~SegmentStatus.DELETED),
    )
    ops.append(Put(SEGMENTS, name_key(target), restored.encode()))
    storage.context.ownership.commit(ops, expect)
    return storage.info(target)
