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

The planner pattern of defrag batches: the driver walks the metadata and turns each chunk
into a ``ChunkCheck`` of plain values; ``check_chunk`` checks one through any binding, in
this process or on a Spark executor (``slts.tools.spark_scrub``, ``slts scrub --spark``),
which rebuilds the binding from the URL. Executors read outside the driver's limiter: pace
a Spark scrub with its partitions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import crc32c

from slts.bindings.base import ChunkStorage
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


@dataclass(frozen=True, slots=True)
class ChunkCheck:
    """What checking one chunk needs, as plain values (it travels to Spark executors):
    the chunk storage's URL, the segment and the chunk's start in it, and the chunk's
    recorded name, length and checksums."""

    url: str
    segment: str
    start: int
    chunk: str
    length: int
    blocks: bytes | None
    checksum: int | None
    piece_bytes: int = PIECE_BYTES_DEFAULT


@dataclass(frozen=True, slots=True)
class ChunkResult:
    """What checking one chunk read and found."""

    bytes_read: int
    unverified: bool
    anomalies: tuple[Anomaly, ...]


#: Checks a batch of chunks, in order: each result, or the chunk storage error that stopped
#: its check. In process (``check_chunks_locally``) or on Spark (``slts.tools.spark_scrub``).
ChunkChecker = Callable[[Sequence[ChunkCheck]], Sequence["ChunkResult | BaseException"]]
#: Chunks planned per batch when a ``ChunkChecker`` runs them.
BATCH_CHUNKS_DEFAULT = 4096


def scrub(
    storage: ChunkedSegmentStorage,
    *,
    prefix: str = "",
    start_at: str | None = None,
    max_chunks: int | None = None,
    piece_bytes: int = PIECE_BYTES_DEFAULT,
    progress: Callable[[int], None] | None = None,
    checker: ChunkChecker | None = None,
    batch_chunks: int = BATCH_CHUNKS_DEFAULT,
) -> ScrubReport:
    """Scrub the segments under ``prefix`` from ``start_at`` on (see module doc).

    The walk (which segments, which chunks, where to stop) is planned here from
    ``storage``'s metadata; the chunks are checked by ``checker`` in batches of about
    ``batch_chunks`` whole segments (default: in this process, one segment at a time, as
    the ``SCRUB`` class of ``storage``'s limiter). The report is the same either way.

    Raises ``InvalidArgument`` for bad arguments (before anything is read) and chunk
    storage errors other than a missing chunk (the walk stops: retry from the report's
    position). ``progress`` is called with the chunks done after each segment (each batch
    with a ``checker``)."""
    if not isinstance(storage, ChunkedSegmentStorage):
        raise InvalidArgument(f"{storage!r} is not a ChunkedSegmentStorage")
    if start_at is not None and not isinstance(start_at, str):
        raise InvalidArgument(f"start_at must be a segment name, got {start_at!r}")
    for value, what in (
        (max_chunks, "max_chunks"),
        (piece_bytes, "piece_bytes"),
        (batch_chunks, "batch_chunks"),
    ):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise InvalidArgument(f"{what} must be a positive integer, got {value!r}")
    if checker is not None and not callable(checker):
        raise InvalidArgument(f"checker must be callable, got {checker!r}")
    report = ScrubReport()
    began = time.perf_counter()
    pending: list[ChunkCheck] = []

    def run_pending() -> None:
        results = (
            check_chunks_locally(storage.chunk_storage)(pending) if checker is None else checker(pending)
        )
        assert len(results) == len(pending), (len(results), len(pending))
        found: list[Anomaly] = []
        for result in results:
            if isinstance(result, BaseException):
                raise result
            report.bytes_read += result.bytes_read
            report.unverified_chunks += result.unverified
            found.extend(result.anomalies)
        report.anomalies.extend(_confirmed(storage, found))
        if progress is not None:
            progress(len(pending))
        pending.clear()

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
            report.chunks += len(layout)
            pending.extend(
                _check_of(storage.chunk_storage.url, name, start, c, piece_bytes) for start, c in layout
            )
            if checker is None or len(pending) >= batch_chunks:
                run_pending()
        if pending:
            run_pending()
    report.seconds = time.perf_counter() - began
    return report


def _confirmed(storage: ChunkedSegmentStorage, anomalies: list[Anomaly]) -> list[Anomaly]:
    """``anomalies`` less those of chunks that left their segment's layout since the walk
    planned them: a chunk missing or short on the chunk storage because a defrag, truncate
    or delete dropped it and GC collected it is no damage. A checksum anomaly stands: the
    bytes below a chunk's recorded length never change while it exists."""
    suspects: dict[str, set[str]] = {}
    for anomaly in anomalies:
        if anomaly.kind != "checksum":
            suspects.setdefault(anomaly.segment, set()).add(anomaly.chunk)
    still = {
        (segment, chunk)
        for segment, chunks in suspects.items()
        for chunk in storage.context.still_listed(segment, chunks)
    }
    return [a for a in anomalies if a.kind == "checksum" or (a.segment, a.chunk) in still]


def _check_of(url: str, segment: str, start: int, chunk: ChunkRecord, piece_bytes: int) -> ChunkCheck:
    # A chunk of frames is checked as stored (its checksum covers its stored bytes): no keys.
    return ChunkCheck(
        url, segment, start, chunk.name, chunk.stored, chunk.blocks, chunk.checksum, piece_bytes
    )


def check_chunks_locally(binding: ChunkStorage) -> ChunkChecker:
    """The in-process checker: each chunk of a batch in turn, through ``binding``; a chunk
    storage error propagates (it stops the walk)."""
    return lambda checks: [check_chunk(check, binding) for check in checks]


def check_chunk(check: ChunkCheck, binding: ChunkStorage) -> ChunkResult:
    """Read chunk ``check.chunk`` whole through ``binding`` and check it (see module doc).
    Raises chunk storage errors other than a missing chunk."""
    anomalies: list[Anomaly] = []

    def anomaly(kind: str, offset: int, detail: str) -> None:
        anomalies.append(Anomaly(check.segment, check.chunk, check.start + offset, kind, detail))

    try:
        stored = binding.get_info(check.chunk).length
    except ChunkNotFound:
        anomaly("missing", 0, "the chunk is not on the chunk storage")
        return ChunkResult(0, False, tuple(anomalies))
    if stored < check.length:
        anomaly("short", stored, f"{stored} bytes stored, {check.length} recorded")
        return ChunkResult(0, False, tuple(anomalies))
    if check.length == 0:
        return ChunkResult(0, False, ())
    try:
        return _read_and_check(check, binding, anomaly, anomalies)
    except ChunkNotFound:  # deleted while it was read: reported as missing (and confirmed)
        anomalies.clear()
        anomaly("missing", 0, "the chunk left the chunk storage while it was read")
        return ChunkResult(0, False, tuple(anomalies))


def _read_and_check(
    check: ChunkCheck,
    binding: ChunkStorage,
    anomaly: Callable[[str, int, str], None],
    anomalies: list[Anomaly],
) -> ChunkResult:
    """``check_chunk``'s reading part: the chunk's bytes read in pieces and checked."""
    unverified = check.blocks is None and check.checksum is None
    handle = binding.open_read(check.chunk)
    whole = bytes_read = position = 0
    while position < check.length:
        size = min(check.piece_bytes, check.length - position)
        if check.blocks is not None:
            first, end, begin, stop = block_checksums.covering(check.blocks, position, size)
            assert begin == position, (begin, position)
            data = binding.read(handle, begin, stop - begin)
            bytes_read += len(data)
            try:
                block_checksums.verify(check.blocks, first, end, data, chunk=check.chunk, start=begin)
            except ChunkCorrupted as exc:
                anomaly("checksum", exc.context.get("offset", begin), exc.message)
            position = stop
        else:
            data = binding.read(handle, position, size)
            bytes_read += len(data)
            whole = crc32c.crc32c(data, whole)
            position += len(data)
    if check.blocks is None and check.checksum is not None and whole != check.checksum:
        anomaly("checksum", 0, "the chunk fails its CRC32C: its bytes are not the ones written")
    return ChunkResult(bytes_read, unverified, tuple(anomalies))
