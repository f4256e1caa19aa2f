"""The scrubber: re-read every chunk of a store and check its bytes against the metadata.

Reads that the engine serves verify the blocks they touch; bytes nobody reads are checked by
nobody, and bit rot there is found only when it is too late to repair from a replica.
``scrub`` walks the segments in name order and reads each chunk of each segment whole, in
pieces of about ``piece_bytes`` cut on the chunk's checksum blocks, as the ``SCRUB``
traffic class of the chunk storage's limiter (``slts.limiter``: the lowest priority), and
checks:

* the chunk is on the chunk storage (``missing``) and holds at least its recorded length
  (``short``);
* every block's CRC32C (``checksum``, at the segment offset of the first bad block of a
  piece), or the chunk's whole CRC32C for chunks written before block checksums.

Chunks without any checksum (written with ``checksums`` off) are counted as unverified.
Nothing is changed: a read-only instance scrubs beside the live owner and fences nobody.

Resumable: ``max_chunks`` stops after the segment during which the count was reached and
the report's ``next_segment`` names where to go on (``start_at``); None when the walk
reached the end. Anomalies name the segment, the chunk and the segment offset.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import crc32c

from slts.errors import ChunkCorrupted, ChunkNotFound, InvalidArgument, SegmentNotFound
from slts.limiter import TrafficClass, traffic_class
from slts.metadata.records import ChunkRecord
from slts.storage import block_checksums
from slts.storage.chunked import ChunkedSegmentStorage

PIECE_BYTES_DEFAULT = 8 << 20


@dataclass(frozen=True, slots=True)
class Anomaly:
    """One thing wrong with a chunk: ``kind`` is ``missing``, ``short`` or ``checksum``;
    ``offset`` is the segment offset where it starts (a bad block's first byte)."""

    segment: str
    chunk: str
    offset: int
    kind: str
    detail: str


@dataclass
class ScrubReport:
    """What ``scrub`` read and found."""

    segments: int = 0
    chunks: int = 0
    bytes_read: int = 0
    unverified_chunks: int = 0
    anomalies: list[Anomaly] = field(default_factory=list)
    next_segment: str | None = None
    seconds: float = 0.0


def scrub(
    storage: ChunkedSegmentStorage,
    *,
    prefix: str = "",
    start_at: str | None = None,
    max_chunks: int | None = None,
    piece_bytes: int = PIECE_BYTES_DEFAULT,
    progress: Callable[[int], None] | None = None,
) -> ScrubReport:
    """Scrub the segments under ``prefix`` from ``start_at`` on (see module doc).

    Raises ``InvalidArgument`` for bad arguments (before anything is read) and chunk
    storage errors other than a missing chunk (the walk stops: retry from the report's
    position). ``progress`` is called with the chunks done after each segment."""
    if not isinstance(storage, ChunkedSegmentStorage):
        raise InvalidArgument(f"{storage!r} is not a ChunkedSegmentStorage")
    if start_at is not None and not isinstance(start_at, str):
        raise InvalidArgument(f"start_at must be a segment name, got {start_at!r}")
    for value, what in ((max_chunks, "max_chunks"), (piece_bytes, "piece_bytes")):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise InvalidArgument(f"{what} must be a positive integer, got {value!r}")
    report = ScrubReport()
    began = time.perf_counter()
    with traffic_class(TrafficClass.SCRUB):
        for name in storage.list(prefix):
            if start_at is not None and name < start_at:
                continue
            if max_chunks is not None and report.chunks >= max_chunks:
                report.next_segment = name
                break
            try:
                layout = storage.chunks(name)
            except SegmentNotFound:
                continue  # deleted while the walk went on
            report.segments += 1
            for start, chunk in layout:
                _scrub_chunk(storage, name, start, chunk, piece_bytes, report)
            if progress is not None:
                progress(len(layout))
    report.seconds = time.perf_counter() - began
    return report


def _scrub_chunk(
    storage: ChunkedSegmentStorage,
    segment: str,
    start: int,
    chunk: ChunkRecord,
    piece_bytes: int,
    report: ScrubReport,
) -> None:
    binding = storage.chunk_storage
    report.chunks += 1

    def anomaly(kind: str, offset: int, detail: str) -> None:
        report.anomalies.append(Anomaly(segment, chunk.name, start + offset, kind, detail))

    try:
        stored = binding.get_info(chunk.name).length
    except ChunkNotFound:
        anomaly("missing", 0, "the chunk is not on the chunk storage")
        return
    if stored < chunk.length:
        anomaly("short", stored, f"{stored} bytes stored, {chunk.length} recorded")
        return
    if chunk.length == 0:
        return
    if chunk.blocks is None and chunk.checksum is None:
        report.unverified_chunks += 1
    handle = binding.open_read(chunk.name)
    whole = 0
    position = 0
    while position < chunk.length:
        size = min(piece_bytes, chunk.length - position)
        if chunk.blocks is not None:
            first, end, begin, stop = block_checksums.covering(chunk.blocks, position, size)
            assert begin == position, (begin, position)
            data = binding.read(handle, begin, stop - begin)
            report.bytes_read += len(data)
            try:
                block_checksums.verify(chunk.blocks, first, end, data, chunk=chunk.name, start=begin)
            except ChunkCorrupted as exc:
                anomaly("checksum", exc.context.get("offset", begin), exc.message)
            position = stop
        else:
            data = binding.read(handle, position, size)
            report.bytes_read += len(data)
            whole = crc32c.crc32c(data, whole)
            position += len(data)
    if chunk.blocks is None and chunk.checksum is not None and whole != chunk.checksum:
        anomaly("checksum", 0, "the chunk fails its CRC32C: its bytes are not the ones written")
