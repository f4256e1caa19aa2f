"""Pravega RollingStorage header files: import into and export from SLTS (PDP-34 "Compatibility").

Format (DESIGN.md §10): UTF-8 text of ``key=value&`` entries.

* ``maxsize=<long>``: the rolling policy (becomes ``max_rolling_length``);
* ``<startOffset>=<chunkName>``: a chunk, in offset order;
* ``concat=<count>@<offset>``: add ``<offset>`` to the start offsets of the next
  ``<count>`` chunk entries (what RollingStorage writes when it concatenates a source's
  header into a target's).

The header object of segment ``S`` is ``S$header``; its chunks are ``S$offset.<start>``.

``parse_header``/``format_header`` are the pure codec. ``import_segment`` creates an SLTS
segment from a header on the chunk storage: chunk lengths are the distances between
start offsets, and for the last chunk the length on storage (the one place a length is
taken from the chunk storage: a legacy layout has no other record of it). The chunks
keep their legacy names; their records carry epoch 0, so SLTS never appends to them.
``export_segment`` writes ``S$header`` for an SLTS segment so that a RollingStorage
reader can find its chunks.
"""

from __future__ import annotations

from dataclasses import dataclass

from slts.admin.backup import check_unreferenced
from slts.bindings.base import ChunkStorage
from slts.errors import ChunkExists, ChunkNotFound, InvalidArgument, MetadataCorrupted, SegmentExists
from slts.metadata import index
from slts.metadata.records import ChunkRecord, SegmentRecord, SegmentStatus
from slts.metadata.schema import CHUNKS, SEGMENTS, name_key
from slts.metadata.store import Expect, Operation, Put
from slts.storage.chunked import ChunkedSegmentStorage, SegmentInfo
from slts.storage.segment_names import check_segment_name

HEADER_SUFFIX = "$header"
_MAXSIZE = "maxsize"
_CONCAT = "concat"


@dataclass(frozen=True, slots=True)
class RollingHeader:
    """A parsed header: the rolling policy and the chunks as (start offset, name)."""

    max_size: int
    chunks: tuple[tuple[int, str], ...]


def header_name(segment: str) -> str:
    """Name of the header object of ``segment``."""
    return segment + HEADER_SUFFIX


def legacy_chunk_name(segment: str, start: int) -> str:
    """RollingStorage's name for the chunk of ``segment`` starting at ``start``."""
    return f"{segment}$offset.{start}"


def parse_header(text: str) -> RollingHeader:
    """Parse header text; ``MetadataCorrupted`` if it is not a valid header."""
    max_size: int | None = None
    chunks: list[tuple[int, str]] = []
    pending_shift, pending_count = 0, 0
    for entry in text.split("&"):
        if not entry:
            continue
        key, separator, value = entry.partition("=")
        if not separator or not value:
            raise MetadataCorrupted(f"rolling header entry {entry!r} is not key=value")
        try:
            if key == _MAXSIZE:
                max_size = int(value)
            elif key == _CONCAT:
                count, _, shift = value.partition("@")
                pending_count, pending_shift = int(count), int(shift)
            else:
                start = int(key)
                if pending_count:
                    start += pending_shift
                    pending_count -= 1
                chunks.append((start, value))
        except ValueError as exc:
            raise MetadataCorrupted(f"rolling header entry {entry!r} has a bad number") from exc
    if max_size is None or max_size <= 0:
        raise MetadataCorrupted("rolling header has no positive maxsize")
    if pending_count:
        raise MetadataCorrupted("rolling header ends inside a concat entry")
    starts = [start for start, _ in chunks]
    if starts != sorted(starts) or len(set(starts)) != len(starts) or (starts and starts[0] < 0):
        raise MetadataCorrupted("rolling header chunk offsets are not strictly increasing")
    return RollingHeader(max_size, tuple(chunks))


def format_header(header: RollingHeader) -> str:
    """Header text for ``header`` (no concat entries: offsets are written absolute)."""
    parts = [f"{_MAXSIZE}={header.max_size}"]
    parts.extend(f"{start}={name}" for start, name in header.chunks)
    return "".join(part + "&" for part in parts)


def _read_all(binding: ChunkStorage, name: str) -> bytes:
    handle = binding.open_read(name)
    return binding.read(handle, 0, binding.get_info(name).length)


def import_segment(storage: ChunkedSegmentStorage, name: str, *, sealed: bool = True) -> SegmentInfo:
    """Create segment ``name`` from its RollingStorage header on the chunk storage.

    Raises ``InvalidName``, ``SegmentExists``, ``ChunkNotFound`` (no header or a chunk
    missing), ``InvalidArgument`` (a chunk another segment references), ``MetadataCorrupted``
    (bad header, or a chunk shorter than the header implies). One commit; nothing is written
    to the chunk storage.
    """
    check_segment_name(name)
    binding = storage.chunk_storage
    header = parse_header(_read_all(binding, header_name(name)).decode("utf-8"))
    if storage.exists(name):
        raise SegmentExists(f"segment {name!r} exists", segment=name)
    check_unreferenced(storage, [chunk for _, chunk in header.chunks])
    lengths = []
    for position, (start, chunk) in enumerate(header.chunks):
        stored = binding.get_info(chunk).length
        if position + 1 < len(header.chunks):
            length = header.chunks[position + 1][0] - start
            if stored < length:
                raise MetadataCorrupted(
                    f"legacy chunk {chunk!r} holds {stored} bytes, header implies {length}"
                )
        else:
            length = stored
        lengths.append(length)
    segment_id = storage.context.new_segment_id()
    now = storage.context.now_ms()
    ops: list[Operation] = []
    expect = [Expect(SEGMENTS, name_key(name), 0)]
    for position, ((start, chunk), length) in enumerate(zip(header.chunks, lengths, strict=True)):
        following = header.chunks[position + 1][1] if position + 1 < len(header.chunks) else None
        record = ChunkRecord(chunk, segment_id, start, length, following, 0, None)
        ops.append(Put(CHUNKS, name_key(chunk), record.encode()))
        ops.append(index.chunk_entry(record))
        expect.append(Expect(CHUNKS, name_key(chunk), 0))
    first_start = header.chunks[0][0] if header.chunks else 0
    length = header.chunks[-1][0] + lengths[-1] if header.chunks else 0
    status = SegmentStatus.ACTIVE | (SegmentStatus.SEALED if sealed else 0)
    segment = SegmentRecord(
        name=name,
        segment_id=segment_id,
        status=int(status),
        start_offset=first_start,
        length=length,
        first_chunk=header.chunks[0][1] if header.chunks else None,
        last_chunk=header.chunks[-1][1] if header.chunks else None,
        first_chunk_start_offset=first_start,
        last_chunk_start_offset=header.chunks[-1][0] if header.chunks else 0,
        max_rolling_length=header.max_size,
        owner_epoch=storage.epoch,
        chunk_count=len(header.chunks),
        created_ms=now,
        modified_ms=now,
        index_depth=0,
    )
    ops.append(Put(SEGMENTS, name_key(name), segment.encode()))
    storage.context.ownership.commit(ops, expect)
    return storage.info(name)


def export_segment(storage: ChunkedSegmentStorage, name: str, *, replace: bool = False) -> str:
    """Write ``name$header`` describing segment ``name``'s chunks; returns the header name.

    Raises ``SegmentNotFound``; ``ChunkExists`` if the header exists and not ``replace``;
    ``InvalidArgument`` if the segment is truncated inside its first chunk (a header can
    only start at a chunk boundary).
    """
    info = storage.info(name)
    chunks = storage.chunks(name)
    if chunks and chunks[0][0] != info.start_offset:
        raise InvalidArgument(
            f"segment {name!r} starts inside its first chunk ({info.start_offset}); a rolling header cannot "
            "say so",
            segment=name,
        )
    text = format_header(
        RollingHeader(info.max_rolling_length, tuple((start, c.name) for start, c in chunks))
    )
    binding = storage.chunk_storage
    target = header_name(name)
    if binding.exists(target):
        if not replace:
            raise ChunkExists(f"header {target!r} exists", chunk=target)
        try:
            binding.delete(binding.open_write(target))
        except ChunkNotFound:
            pass
    binding.create(target, text.encode("utf-8"))
    return target
