"""Kafka's on-disk log formats, read and written byte for byte (KIP-405 tiered storage).

A Kafka partition's log is a series of segments; each segment is a ``.log`` file of record
batches plus sparse indexes over it. This module reads and writes exactly those bytes, so a
segment copied to remote storage and back is the one Kafka wrote, and checks them before
anything is uploaded: nothing here trusts its input.

Every integer is big-endian (network order). Layouts:

* **Record batch, magic 2** (the ``.log`` file is these, back to back; ``HEADER_SIZE`` = 61)::

      offset  size  field
       0      i64   baseOffset
       8      i32   batchLength            bytes after this field (batch size - 12)
      12      i32   partitionLeaderEpoch
      16      i8    magic                  must be 2
      17      u32   crc                    CRC32C of bytes 21 .. end of batch
      21      i16   attributes             bit 4 transactional, bit 5 control
      23      i32   lastOffsetDelta
      27      i64   baseTimestamp
      35      i64   maxTimestamp
      43      i64   producerId
      51      i16   producerEpoch
      53      i32   baseSequence
      57      i32   recordsCount
      61            records (possibly compressed; not parsed here)

  baseOffset, batchLength, partitionLeaderEpoch and magic lie before the CRC's range: a
  broker assigns the base offset and the leader epoch on append without recomputing it.

* **Offset index** (``.index``): 8-byte entries ``relative offset u32, position u32``;
  the absolute offset is the segment's base offset plus the relative one, the position a
  byte position in the ``.log``. Sparse; offsets strictly increase, positions do not decrease.
* **Time index** (``.timeindex``): 12-byte entries ``timestamp i64, relative offset u32``;
  timestamps strictly increase, offsets do not decrease. An entry (T, O) says that every
  record with a timestamp above T lies after offset O.
* **Leader-epoch checkpoint** (``leader-epoch-checkpoint``, text): line 1 the version ``0``,
  line 2 the number of entries, then one ``"<epoch> <start offset>"`` line per entry, every
  line ending in ``\\n``.

Relative offsets and positions are stored in 4 bytes but Kafka reads them as signed ``int``:
only 0 .. 2**31-1 is valid, anything above is refused as an overflow.

Kafka preallocates the index files of the active segment and fills them with zeros; a broker
that stops without trimming them leaves all-zero entries at the end. The parsers drop every
trailing all-zero entry after the first entry (the first one is kept: it is a well-formed
entry for the base offset). Kafka's segment dump tool likewise stops at a later entry
whose offset is the base offset.

Every error about the bytes is :class:`slts.errors.InvalidLogSegment`, with context
attributes ``segment`` (the name the caller gave), ``position`` (byte position in the file
read, or ``None``) and ``offset`` (the Kafka offset concerned, or ``None``); errors about the
checkpoint file also carry ``line``.
"""

from __future__ import annotations

import os
import re
import struct
from bisect import bisect_right
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO, NamedTuple

import crc32c

from slts.errors import InvalidLogSegment

# --- constants ---------------------------------------------------------------------------

#: Bytes before a batch's ``batchLength`` field's range: baseOffset and batchLength.
LOG_OVERHEAD = 12
#: Bytes of a magic-2 batch header, up to and including recordsCount.
HEADER_SIZE = 61
#: The only batch format read or written here.
MAGIC_V2 = 2
#: Smallest valid ``batchLength``: the header after the batchLength field, no records.
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD
#: Largest ``batchLength`` accepted (1 GiB). Kafka segments are at most 2 GiB (positions
#: are signed 32-bit); a larger claimed length is damage, refused before it is read.
MAX_BATCH_LENGTH = 1 << 30
#: Largest relative offset or position an index entry can hold (Kafka's signed ``int``).
INT32_MAX = (1 << 31) - 1
INT64_MAX = (1 << 63) - 1
#: The timestamp of a batch or index with none (Kafka's ``NO_TIMESTAMP``).
NO_TIMESTAMP = -1
#: Kafka's default ``index.interval.bytes``.
DEFAULT_INDEX_INTERVAL_BYTES = 4096
#: Bytes asked per read by a pass over a whole log (``scan_log``, ``slts.remote.inspection``).
SCAN_BLOCK_BYTES = 1 << 20
OFFSET_INDEX_ENTRY_SIZE = 8
TIME_INDEX_ENTRY_SIZE = 12
#: The only leader-epoch checkpoint version.
LEADER_EPOCH_CHECKPOINT_VERSION = 0

_HEADER = struct.Struct(">qiibIhiqqqhii")
_BATCH_LENGTH = struct.Struct(">qi")
_OFFSET_ENTRY = struct.Struct(">II")
_TIME_ENTRY = struct.Struct(">qI")
#: Byte position of ``attributes``: the CRC covers the batch from here to its end.
_CRC_START = 21
_TRANSACTIONAL_BIT = 0x10
_CONTROL_BIT = 0x20
_DIGITS = re.compile(rb"[0-9]+")

assert _HEADER.size == HEADER_SIZE
assert _OFFSET_ENTRY.size == OFFSET_INDEX_ENTRY_SIZE
assert _TIME_ENTRY.size == TIME_INDEX_ENTRY_SIZE
assert struct.calcsize(">qiib") + 4 == _CRC_START


# --- record batches ----------------------------------------------------------------------


class BatchHeader(NamedTuple):
    """The 61-byte header of one magic-2 record batch, and where the batch starts.

    ``position`` is the byte position of the batch's first byte in the log it was read
    from; every other field is the header field of the same name. (A named tuple: a pass
    over a log makes one per batch, and a tuple is built several times faster than a
    frozen dataclass.)
    """

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int
    position: int

    @property
    def last_offset(self) -> int:
        """The offset of the batch's last record (kept even if compaction removed it)."""
        return self.base_offset + self.last_offset_delta

    @property
    def size(self) -> int:
        """The whole batch's size in bytes, header included."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def is_transactional(self) -> bool:
        """Attributes bit 4: the batch belongs to a transaction."""
        return bool(self.attributes & _TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        """Attributes bit 5: the batch holds a control record (a transaction marker)."""
        return bool(self.attributes & _CONTROL_BIT)


def _invalid(
    message: str, *, segment: str, position: int | None, offset: int | None, **more: object
) -> InvalidLogSegment:
    """The error for bad bytes, its message prefixed with where they are."""
    where = f"segment {segment!r}" if segment else "log segment"
    return InvalidLogSegment(f"{where}: {message}", segment=segment, position=position, offset=offset, **more)


def parse_batch_header(data: bytes | memoryview, position: int = 0, *, segment: str = "") -> BatchHeader:
    """Parse the magic-2 batch header at the start of ``data``.

    ``data`` holds at least the 61 header bytes (more is ignored); ``position`` is where
    they lie in the log, recorded in the result and in errors. Checks the header alone, not
    the CRC: raises InvalidLogSegment for a short header, a magic other than 2, a
    ``batchLength`` below 49 or above ``MAX_BATCH_LENGTH``, a negative base offset,
    ``lastOffsetDelta`` or ``recordsCount``, or a last offset past the 64-bit range.
    """
    if len(data) < HEADER_SIZE:
        offset = _BATCH_LENGTH.unpack_from(data)[0] if len(data) >= LOG_OVERHEAD else None
        raise _invalid(
            f"truncated batch header at position {position}: {len(data)} of {HEADER_SIZE} bytes",
            segment=segment,
            position=position,
            offset=offset,
        )
    header = BatchHeader._make((*_HEADER.unpack_from(data), position))
    _check_header(header, segment)
    return header


def _check_header(header: BatchHeader, segment: str) -> None:
    """Raise InvalidLogSegment if the header's fields cannot be a magic-2 batch's."""
    problem = None
    if header.magic != MAGIC_V2:
        problem = f"magic {header.magic}, only magic {MAGIC_V2} batches are supported"
    elif not MIN_BATCH_LENGTH <= header.batch_length <= MAX_BATCH_LENGTH:
        problem = f"batch length {header.batch_length} outside {MIN_BATCH_LENGTH}..{MAX_BATCH_LENGTH}"
    elif header.base_offset < 0:
        problem = f"negative base offset {header.base_offset}"
    elif header.last_offset_delta < 0:
        problem = f"negative last offset delta {header.last_offset_delta}"
    elif header.records_count < 0:
        problem = f"negative records count {header.records_count}"
    elif header.last_offset > INT64_MAX:
        problem = f"last offset {header.last_offset} past the 64-bit range"
    if problem is not None:
        raise _invalid(
            f"bad batch header at position {header.position}: {problem}",
            segment=segment,
            position=header.position,
            offset=header.base_offset,
        )


def _refill(read: Callable[[int], bytes], buffer: memoryview, need: int, block_bytes: int) -> memoryview:
    """``buffer`` extended by further input to at least ``need`` bytes (fewer only at the
    end of input; ``read`` may return short counts). From an empty ``buffer`` it reads at
    least ``block_bytes`` per call; with bytes left in it (a header or batch that runs on
    past the block) it reads just what that item lacks, so the join copies one item, not
    the next block: the block after it is read whole, on its own."""
    parts = [buffer] if buffer else []
    got = len(buffer)
    while got < need:
        more = read(need - got if parts else max(need - got, block_bytes))
        if not more:
            break
        parts.append(memoryview(more))
        got += len(more)
    if not parts:
        return buffer
    return parts[0] if len(parts) == 1 else memoryview(b"".join(parts))


def batch_crc(batch: bytes | memoryview) -> int:
    """The CRC32C a magic-2 batch's header must hold: over attributes .. end of batch."""
    assert len(batch) >= HEADER_SIZE
    return int(crc32c.crc32c(memoryview(batch)[_CRC_START:]))


def iter_batches(
    read: Callable[[int], bytes],
    *,
    segment: str = "",
    verify_crc: bool = True,
    start_position: int = 0,
    block_bytes: int = 0,
) -> Iterator[tuple[BatchHeader, bytes]]:
    """Stream the batches ``read`` returns: each header with the batch's whole bytes.

    ``read(n)`` returns up to ``n`` further bytes, ``b""`` at the end (a binary file's
    ``read``); its first byte is at ``start_position`` of the log, which positions in
    headers and errors count from. Each call asks for at least ``block_bytes`` (0: exactly
    what the next header or batch needs), so at most one block and one batch are in memory
    at a time: large blocks for a pass over a whole log, none for a reader that wants one
    batch. Stops at the end of input between two batches. Raises InvalidLogSegment, naming
    the segment, position and base offset, for a truncated batch, a bad header (see
    ``parse_batch_header``), a CRC mismatch (unless ``verify_crc`` is false), or a batch
    whose base offset is not above the previous batch's last offset.
    """
    for header, batch in _walk_batches(read, segment, verify_crc, start_position, block_bytes):
        yield header, bytes(batch)


def iter_batch_headers(
    read: Callable[[int], bytes],
    *,
    segment: str = "",
    verify_crc: bool = True,
    start_position: int = 0,
    block_bytes: int = 0,
) -> Iterator[BatchHeader]:
    """``iter_batches``' headers alone, each batch checked the same way (CRC and all), its
    bytes never copied out of the block they were read in: for a pass that learns what a
    log holds (``inspection``, ``summarize``, ``local_log``)."""
    for header, _ in _walk_batches(read, segment, verify_crc, start_position, block_bytes):
        yield header


def _walk_batches(
    read: Callable[[int], bytes], segment: str, verify_crc: bool, start_position: int, block_bytes: int
) -> Iterator[tuple[BatchHeader, memoryview]]:
    """``iter_batches``' walk: each header with a view of its batch in the bytes read."""
    position = start_position
    previous_last: int | None = None
    pending = memoryview(b"")
    while True:
        if len(pending) < HEADER_SIZE:
            pending = _refill(read, pending, HEADER_SIZE, block_bytes)
            if not pending:
                return
        header = parse_batch_header(pending, position, segment=segment)
        if len(pending) < header.size:
            pending = _refill(read, pending, header.size, block_bytes)
            if len(pending) < header.size:
                raise _invalid(
                    f"truncated batch at position {position}: {len(pending)} of {header.size} bytes",
                    segment=segment,
                    position=position,
                    offset=header.base_offset,
                )
        batch = pending[: header.size]
        pending = pending[header.size :]
        _check_batch(header, batch, previous_last, segment, verify_crc)
        yield header, batch
        previous_last = header.last_offset
        position += header.size


def iter_batch_views(
    read: Callable[[int, int], bytes | memoryview],
    size: int,
    start: int,
    first_end: int,
    *,
    more_bytes: int = 0,
    segment: str = "",
) -> Generator[tuple[BatchHeader, memoryview], None, None]:
    """The batches of a log of ``size`` bytes from position ``start`` (a batch's first
    byte), each header with a view of the batch's bytes in what ``read`` returned: for a
    reader that knows where its batches lie (a fetch, through the offset index) and reads
    no more than it needs, without a stream or a copy per batch.

    ``read(position, length)`` returns exactly those bytes of the log (bytes or a view
    of them). The first read is
    ``[start, first_end)``; a batch (or header) that runs past what was read is completed
    by one further read of what it lacks, or ``more_bytes`` if that is more (bounded by
    the log's end). Checks as ``iter_batches`` does (headers, CRCs, increasing offsets;
    ``InvalidLogSegment`` naming ``segment``, position and offset, also for a batch cut
    by the log's end). Stops at the log's end. A view keeps its read's bytes alive."""
    assert 0 <= start <= first_end <= size, (start, first_end, size)
    data = memoryview(read(start, first_end - start)) if first_end > start else memoryview(b"")
    base = start  # the log position of data[0]
    at = 0  # where the next batch starts in data
    previous_last: int | None = None
    while True:
        if len(data) - at < HEADER_SIZE:
            data, base, at = _read_more(read, data, base, at, HEADER_SIZE, size, more_bytes)
            if at == len(data):
                return
        header = parse_batch_header(data[at : at + HEADER_SIZE], base + at, segment=segment)
        end = at + LOG_OVERHEAD + header.batch_length
        if end > len(data):
            data, base, at = _read_more(read, data, base, at, end - at, size, more_bytes)
            end = at + LOG_OVERHEAD + header.batch_length
            if end > len(data):
                raise _invalid(
                    f"truncated batch at position {base + at}: {len(data) - at} of {end - at} bytes",
                    segment=segment,
                    position=base + at,
                    offset=header.base_offset,
                )
        batch = data[at:end]
        _check_batch(header, batch, previous_last, segment, True)
        yield header, batch
        previous_last = header.base_offset + header.last_offset_delta
        at = end


def _read_more(
    read: Callable[[int, int], bytes | memoryview],
    data: memoryview,
    base: int,
    at: int,
    need: int,
    size: int,
    more_bytes: int,
) -> tuple[memoryview, int, int]:
    """``iter_batch_views``'s bytes from ``at`` on, extended by one read to at least
    ``need`` bytes (fewer only at the log's end), as (data, base, at)."""
    rest = data[at:]
    position = base + len(data)
    length = min(size - position, max(need - len(rest), more_bytes))
    if length <= 0:
        return rest, base + at, 0
    more = read(position, length)
    assert len(more) == length, (len(more), length)
    return memoryview(b"".join((rest, more)) if rest else more), base + at, 0


def _check_batch(
    header: BatchHeader, batch: bytes | memoryview, previous_last: int | None, segment: str, verify_crc: bool
) -> None:
    """Raise InvalidLogSegment for a CRC mismatch or offsets that do not increase."""
    assert len(batch) == header.size
    if verify_crc and batch_crc(batch) != header.crc:
        raise _invalid(
            f"CRC mismatch in the batch at position {header.position} (base offset {header.base_offset}): "
            f"header says {header.crc:#010x}, bytes give {batch_crc(batch):#010x}",
            segment=segment,
            position=header.position,
            offset=header.base_offset,
        )
    if previous_last is not None and header.base_offset <= previous_last:
        raise _invalid(
            f"offsets do not increase: the batch at position {header.position} starts at offset "
            f"{header.base_offset}, the previous one ends at {previous_last}",
            segment=segment,
            position=header.position,
            offset=header.base_offset,
        )


@dataclass(frozen=True, slots=True)
class LogSummary:
    """What one pass over a segment's ``.log`` learns (see ``scan_log``)."""

    #: The first batch's base offset.
    base_offset: int
    #: The last batch's last offset (inclusive).
    end_offset: int
    size_bytes: int
    batch_count: int
    #: The greatest ``maxTimestamp`` of any batch (``NO_TIMESTAMP`` if none has one).
    max_timestamp: int
    #: Leader epoch -> the first offset written in it, in offset order.
    leader_epochs: dict[int, int] = field(default_factory=dict)


def scan_log(path_or_file: str | os.PathLike[str] | BinaryIO, *, segment: str = "") -> LogSummary:
    """Check a whole ``.log`` in one streaming pass and summarize it.

    Takes a path (``segment`` defaults to its file name) or a binary file positioned at the
    log's first byte. Every batch is checked as ``iter_batches`` does, CRC included. The
    leader epochs come from the batches' ``partitionLeaderEpoch``: each epoch maps to the
    base offset of its first batch; a batch with a negative epoch carries none and is
    skipped, as Kafka's recovery skips it. Raises InvalidLogSegment for an empty log, any
    error of ``iter_batches``, or an epoch below an earlier batch's.
    """
    if isinstance(path_or_file, str | os.PathLike):
        name = segment or os.path.basename(os.fspath(path_or_file))
        with open(path_or_file, "rb") as file:
            return _scan(file.read, name)
    return _scan(path_or_file.read, segment)


def _scan(read: Callable[[int], bytes], segment: str) -> LogSummary:
    """``scan_log`` on a reader."""
    return summarize(
        iter_batch_headers(read, segment=segment, block_bytes=SCAN_BLOCK_BYTES),
        segment=segment,
    )


def summarize(headers: Iterable[BatchHeader], *, segment: str = "") -> LogSummary:
    """The ``LogSummary`` of a log whose batches, in order from position 0, have
    ``headers`` (already checked, as ``iter_batches`` yields them); consumed in one pass.
    Raises InvalidLogSegment for no batch, or an epoch below an earlier batch's."""
    summary = SummaryBuilder(segment=segment)
    for header in headers:
        summary.add(header)
    return summary.result()


class SummaryBuilder:
    """A ``LogSummary`` folded batch by batch: memory O(leader epochs), whatever the
    number of batches (a pass over a log keeps no header once it has added it).

    ``add`` takes the headers in log order, each already checked (as ``iter_batches``
    yields them); it raises InvalidLogSegment for a leader epoch below an earlier batch's
    (negative epochs carry none and are skipped, as Kafka's recovery skips them).
    ``result`` raises InvalidLogSegment if no batch was added."""

    __slots__ = ("_base", "_count", "_end", "_epochs", "_latest_epoch", "_max_timestamp", "_segment", "_size")

    def __init__(self, *, segment: str = "") -> None:
        self._segment = segment
        self._base: int | None = None
        self._end = -1
        self._size = 0
        self._count = 0
        self._max_timestamp = NO_TIMESTAMP
        self._epochs: dict[int, int] = {}
        self._latest_epoch = -1

    def add(self, header: BatchHeader) -> None:
        """Fold in the next batch of the log."""
        if self._base is None:
            self._base = header.base_offset
        self._end = header.last_offset
        self._size = header.position + header.size
        self._count += 1
        if header.max_timestamp > self._max_timestamp:
            self._max_timestamp = header.max_timestamp
        epoch = header.partition_leader_epoch
        if epoch < 0 or epoch == self._latest_epoch:
            return
        if epoch < self._latest_epoch:
            raise _invalid(
                f"leader epoch {epoch} at offset {header.base_offset} after epoch {self._latest_epoch}",
                segment=self._segment,
                position=header.position,
                offset=header.base_offset,
            )
        self._epochs[epoch] = header.base_offset
        self._latest_epoch = epoch

    def result(self) -> LogSummary:
        """The summary of the batches added so far."""
        if self._base is None:
            raise _invalid("empty log: no record batch", segment=self._segment, position=0, offset=None)
        return LogSummary(
            base_offset=self._base,
            end_offset=self._end,
            size_bytes=self._size,
            batch_count=self._count,
            max_timestamp=self._max_timestamp,
            leader_epochs=dict(self._epochs),
        )


# --- indexes: common ---------------------------------------------------------------------


def _relative(offset: int, base_offset: int, segment: str, position: int | None) -> int:
    """``offset - base_offset``, or InvalidLogSegment if an index entry cannot hold it."""
    relative = offset - base_offset
    if not 0 <= relative <= INT32_MAX:
        raise _invalid(
            f"offset {offset} is not within 0..{INT32_MAX} of the base offset {base_offset}",
            segment=segment,
            position=position,
            offset=offset,
        )
    return relative


def _entry_count(data: bytes | memoryview, entry_size: int, kind: str, segment: str) -> int:
    """The number of entries in an index file, trailing preallocated zeros dropped.

    Raises InvalidLogSegment if the length is not a multiple of ``entry_size``.
    """
    if len(data) % entry_size:
        raise _invalid(
            f"{kind} of {len(data)} bytes, not a multiple of its {entry_size}-byte entries",
            segment=segment,
            position=len(data) - len(data) % entry_size,
            offset=None,
        )
    view = memoryview(data)
    count = len(data) // entry_size
    zero = bytes(entry_size)
    while count > 1 and view[(count - 1) * entry_size : count * entry_size] == zero:
        count -= 1
    return count


@dataclass(frozen=True, slots=True)
class _IndexPoint:
    """One batch of a segment walked as Kafka's log does when it indexes it."""

    batch: BatchHeader
    #: Kafka adds index entries at this batch.
    indexed: bool
    #: The greatest batch ``maxTimestamp`` so far (this batch included), and the last
    #: offset of the first batch that reached it.
    max_timestamp: int
    offset_of_max_timestamp: int


def _walk(
    batches: Iterable[BatchHeader], base_offset: int, interval_bytes: int, segment: str
) -> Iterator[_IndexPoint]:
    """Kafka's indexing walk over a segment's batches (see ``build_offset_index``).

    The batches must be a whole segment's, in order: the first at position 0, each
    starting where the previous ends, every offset within reach of ``base_offset``.
    """
    assert interval_bytes >= 0
    expected_position = 0
    last_entry_position = 0
    max_timestamp = NO_TIMESTAMP
    offset_of_max = base_offset
    for batch in batches:
        if batch.position != expected_position:
            raise _invalid(
                f"the batch at offset {batch.base_offset} starts at position {batch.position}, "
                f"expected {expected_position}: not a whole segment's batches",
                segment=segment,
                position=batch.position,
                offset=batch.base_offset,
            )
        _relative(batch.base_offset, base_offset, segment, batch.position)
        _relative(batch.last_offset, base_offset, segment, batch.position)
        if batch.max_timestamp > max_timestamp:
            max_timestamp, offset_of_max = batch.max_timestamp, batch.last_offset
        indexed = batch.position - last_entry_position > interval_bytes
        if indexed:
            last_entry_position = batch.position
        yield _IndexPoint(batch, indexed, max_timestamp, offset_of_max)
        expected_position = batch.position + batch.size


# --- offset index ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class OffsetIndexEntry:
    """An offset index entry: ``offset`` (absolute) maps to byte ``position`` in the log."""

    offset: int
    position: int


def encode_offset_index(entries: Iterable[OffsetIndexEntry], base_offset: int, *, segment: str = "") -> bytes:
    """The ``.index`` bytes for ``entries`` of the segment at ``base_offset``.

    Raises InvalidLogSegment for an entry Kafka could not have written: an offset not
    within 0..2**31-1 of the base offset, a position outside 0..2**31-1, offsets not
    strictly increasing or positions decreasing.
    """
    out = bytearray()
    previous: OffsetIndexEntry | None = None
    for entry in entries:
        relative = _relative(entry.offset, base_offset, segment, entry.position)
        _check_offset_entry(entry, previous, segment)
        out += _OFFSET_ENTRY.pack(relative, entry.position)
        previous = entry
    return bytes(out)


def _check_offset_entry(entry: OffsetIndexEntry, previous: OffsetIndexEntry | None, segment: str) -> None:
    """Raise InvalidLogSegment unless ``entry`` may follow ``previous`` in an offset index."""
    problem = None
    if not 0 <= entry.position <= INT32_MAX:
        problem = f"position {entry.position} outside 0..{INT32_MAX}"
    elif previous is not None and entry.offset <= previous.offset:
        problem = f"offset {entry.offset} not above the previous entry's {previous.offset}"
    elif previous is not None and entry.position < previous.position:
        problem = f"position {entry.position} below the previous entry's {previous.position}"
    if problem is not None:
        raise _invalid(
            f"bad offset index entry: {problem}",
            segment=segment,
            position=entry.position,
            offset=entry.offset,
        )


def parse_offset_index(
    data: bytes | memoryview, base_offset: int, *, segment: str = ""
) -> list[OffsetIndexEntry]:
    """The entries of a ``.index`` file of the segment at ``base_offset``.

    Trailing all-zero entries after the first are preallocated space and dropped. Raises
    InvalidLogSegment for a length that is not a multiple of 8, a relative offset or
    position above 2**31-1, offsets not strictly increasing or positions decreasing.
    """
    return list(iter_offset_index(data, base_offset, segment=segment))


def iter_offset_index(
    data: bytes | memoryview, base_offset: int, *, segment: str = ""
) -> Iterator[OffsetIndexEntry]:
    """``parse_offset_index`` one entry at a time (no list of entries is built). The
    length is checked at the call; each entry as it is reached."""
    count = _entry_count(data, OFFSET_INDEX_ENTRY_SIZE, "offset index", segment)
    return _offset_entries(memoryview(data)[: count * OFFSET_INDEX_ENTRY_SIZE], base_offset, segment)


def _offset_entries(view: memoryview, base_offset: int, segment: str) -> Iterator[OffsetIndexEntry]:
    previous: OffsetIndexEntry | None = None
    for relative, position in _OFFSET_ENTRY.iter_unpack(view):
        entry = OffsetIndexEntry(base_offset + relative, position)
        _relative(entry.offset, base_offset, segment, position)
        _check_offset_entry(entry, previous, segment)
        yield entry
        previous = entry


def lookup_position(entries: Sequence[OffsetIndexEntry], offset: int) -> int:
    """Where to start reading the log for ``offset``: the position of the greatest entry
    whose offset is at most ``offset``, 0 if there is none.

    ``entries`` are sorted by offset (as every parsed or built index is). The batch that
    holds ``offset`` starts at or after the returned position; a reader scans forward from
    it, as Kafka does.
    """
    index = bisect_right(entries, offset, key=_entry_offset)
    return entries[index - 1].position if index else 0


def _entry_offset(entry: OffsetIndexEntry) -> int:
    return entry.offset


def build_offset_index(
    batches: Iterable[BatchHeader],
    base_offset: int,
    interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
    *,
    segment: str = "",
) -> list[OffsetIndexEntry]:
    """The offset index Kafka writes for a segment holding ``batches``.

    Kafka's rule (``LogSegment`` append and recovery, per batch since KAFKA-806): before a
    batch at position P is counted, if more than ``interval_bytes`` bytes were appended
    since the last entry (or since the segment's start), the entry (the batch's LAST offset,
    P) is added and the count restarts; then the batch's size is added. So the first batch
    never has an entry, and an entry's position is the start of the batch holding its
    offset. (Before Kafka 4.0, a follower's multi-batch append gave one entry: the append's
    largest offset at its first batch's position; ``check_offset_index`` accepts both.)

    ``batches`` are a whole segment's, in order, from position 0 with no gap (as
    ``iter_batches`` yields them); otherwise, or if an offset is out of an entry's reach of
    ``base_offset``, InvalidLogSegment.
    """
    return [
        OffsetIndexEntry(point.batch.last_offset, point.batch.position)
        for point in _walk(batches, base_offset, interval_bytes, segment)
        if point.indexed
    ]


def check_offset_index(
    entries: Iterable[OffsetIndexEntry], batches: Iterable[BatchHeader], *, segment: str = ""
) -> None:
    """Raise InvalidLogSegment, naming the segment, offset and position, if the offset index
    disagrees with the log whose batches (in order) are ``batches`` (see
    ``OffsetIndexCheck`` for the rule; this is it over a whole log at once)."""
    check = OffsetIndexCheck(entries, segment=segment)
    end_offset = -1
    for batch in batches:
        check.add(batch)
        end_offset = batch.last_offset
    check.finish(end_offset)


class OffsetIndexCheck:
    """The offset index checked against the log as the log's batches pass by, in memory
    O(1): the entries (sorted, as every index is) are merged with the batches by
    position, and one entry at a time is kept until its upper bound is known.

    Kafka's rule: each entry's position must be the start of a batch, and its offset must
    lie between that batch's last offset and the offset before the batch at the next
    entry's position (the log's end for the last entry). Kafka 4.x writes exactly the
    batch's last offset; older followers wrote the last offset of a multi-batch append
    starting there. Either way a lookup lands at or before the batch holding any offset.

    ``entries`` are read lazily (``iter_offset_index``) and checked for order as they
    come; ``add`` takes every batch in log order; ``finish(end_offset)`` after the last.
    Each raises InvalidLogSegment as soon as an entry is known to be wrong."""

    __slots__ = ("_entries", "_next", "_pending", "_previous", "_segment")

    def __init__(self, entries: Iterable[OffsetIndexEntry], *, segment: str = "") -> None:
        self._segment = segment
        self._entries = iter(entries)
        self._previous: OffsetIndexEntry | None = None
        #: The entry waiting for its upper bound, and the batch it points at.
        self._pending: tuple[OffsetIndexEntry, BatchHeader] | None = None
        self._next = self._take()

    def _take(self) -> OffsetIndexEntry | None:
        entry = next(self._entries, None)
        if entry is not None:
            _check_offset_entry(entry, self._previous, self._segment)
            self._previous = entry
        return entry

    def add(self, batch: BatchHeader) -> None:
        """The log's next batch."""
        entry = self._next
        while entry is not None and entry.position <= batch.position:
            if entry.position < batch.position:
                raise self._not_a_batch_start(entry)
            self._close(batch.base_offset - 1)
            self._pending = (entry, batch)
            entry = self._next = self._take()

    def finish(self, end_offset: int) -> None:
        """After the log's last batch, whose last offset is ``end_offset``."""
        if self._next is not None:
            raise self._not_a_batch_start(self._next)
        self._close(end_offset)

    def _close(self, upper: int) -> None:
        """Check the pending entry, whose next indexed batch starts at ``upper + 1``."""
        if self._pending is None:
            return
        entry, batch = self._pending
        self._pending = None
        if not batch.last_offset <= entry.offset <= upper:
            raise _invalid(
                f"index entry for offset {entry.offset} points at the batch at position {entry.position} "
                f"(offsets {batch.base_offset}..{batch.last_offset}); its offset must lie in "
                f"{batch.last_offset}..{upper}",
                segment=self._segment,
                position=entry.position,
                offset=entry.offset,
            )

    def _not_a_batch_start(self, entry: OffsetIndexEntry) -> InvalidLogSegment:
        return _invalid(
            f"index entry for offset {entry.offset} points at position {entry.position}, "
            "which is not the start of a batch",
            segment=self._segment,
            position=entry.position,
            offset=entry.offset,
        )


# --- time index --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class TimeIndexEntry:
    """A time index entry: every record with a timestamp above ``timestamp`` lies after
    ``offset`` (absolute)."""

    timestamp: int
    offset: int


def encode_time_index(entries: Iterable[TimeIndexEntry], base_offset: int, *, segment: str = "") -> bytes:
    """The ``.timeindex`` bytes for ``entries`` of the segment at ``base_offset``.

    Raises InvalidLogSegment for an offset not within 0..2**31-1 of the base offset,
    timestamps not strictly increasing or offsets decreasing.
    """
    out = bytearray()
    previous: TimeIndexEntry | None = None
    for entry in entries:
        relative = _relative(entry.offset, base_offset, segment, None)
        _check_time_entry(entry, previous, segment)
        out += _TIME_ENTRY.pack(entry.timestamp, relative)
        previous = entry
    return bytes(out)


def _check_time_entry(entry: TimeIndexEntry, previous: TimeIndexEntry | None, segment: str) -> None:
    """Raise InvalidLogSegment unless ``entry`` may follow ``previous`` in a time index."""
    problem = None
    if previous is not None and entry.timestamp <= previous.timestamp:
        problem = f"timestamp {entry.timestamp} not above the previous entry's {previous.timestamp}"
    elif previous is not None and entry.offset < previous.offset:
        problem = f"offset {entry.offset} below the previous entry's {previous.offset}"
    if problem is not None:
        raise _invalid(
            f"bad time index entry: {problem}", segment=segment, position=None, offset=entry.offset
        )


def parse_time_index(
    data: bytes | memoryview, base_offset: int, *, segment: str = ""
) -> list[TimeIndexEntry]:
    """The entries of a ``.timeindex`` file of the segment at ``base_offset``.

    Trailing all-zero entries after the first are preallocated space and dropped. Raises
    InvalidLogSegment for a length that is not a multiple of 12, a relative offset above
    2**31-1, timestamps not strictly increasing or offsets decreasing.
    """
    return list(iter_time_index(data, base_offset, segment=segment))


def iter_time_index(
    data: bytes | memoryview, base_offset: int, *, segment: str = ""
) -> Iterator[TimeIndexEntry]:
    """``parse_time_index`` one entry at a time (no list of entries is built). The length
    is checked at the call; each entry as it is reached."""
    count = _entry_count(data, TIME_INDEX_ENTRY_SIZE, "time index", segment)
    return _time_entries(memoryview(data)[: count * TIME_INDEX_ENTRY_SIZE], base_offset, segment)


def _time_entries(view: memoryview, base_offset: int, segment: str) -> Iterator[TimeIndexEntry]:
    previous: TimeIndexEntry | None = None
    for timestamp, relative in _TIME_ENTRY.iter_unpack(view):
        entry = TimeIndexEntry(timestamp, base_offset + relative)
        _relative(entry.offset, base_offset, segment, None)
        _check_time_entry(entry, previous, segment)
        yield entry
        previous = entry


def build_time_index(
    batches: Iterable[BatchHeader],
    base_offset: int,
    interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
    *,
    rolled: bool = True,
    segment: str = "",
) -> list[TimeIndexEntry]:
    """The time index Kafka writes for a segment holding ``batches``.

    Kafka's rule: it tracks the greatest batch ``maxTimestamp`` so far and the last offset
    of the first batch that reached it (starting from ``NO_TIMESTAMP`` at the base offset),
    updated before each batch is indexed. Whenever it adds an offset index entry (see
    ``build_offset_index``), it offers (max timestamp so far, its offset) to the time index,
    which keeps it only if the timestamp is above its last entry's (or above -1 when empty).
    When the segment is rolled (no longer active, which every segment copied to remote
    storage is), it offers the final (max timestamp, offset) once more under the same rule:
    ``rolled=True`` includes that entry, ``rolled=False`` gives an active segment's index.
    Errors as ``build_offset_index``.
    """
    entries: list[TimeIndexEntry] = []
    last_timestamp = NO_TIMESTAMP
    final: tuple[int, int] | None = None
    for point in _walk(batches, base_offset, interval_bytes, segment):
        final = (point.max_timestamp, point.offset_of_max_timestamp)
        if point.indexed and point.max_timestamp > last_timestamp:
            entries.append(TimeIndexEntry(point.max_timestamp, point.offset_of_max_timestamp))
            last_timestamp = point.max_timestamp
    if rolled and final is not None and final[0] > last_timestamp:
        entries.append(TimeIndexEntry(*final))
    return entries


# --- leader-epoch checkpoint -------------------------------------------------------------


def encode_leader_epoch_checkpoint(entries: Sequence[tuple[int, int]], *, segment: str = "") -> bytes:
    """The ``leader-epoch-checkpoint`` text for ``(epoch, start offset)`` entries.

    Raises InvalidLogSegment unless epochs and start offsets are non-negative and both
    strictly increase (Kafka's leader-epoch cache never holds anything else).
    """
    lines = [str(LEADER_EPOCH_CHECKPOINT_VERSION), str(len(entries))]
    previous: tuple[int, int] | None = None
    for number, (epoch, start_offset) in enumerate(entries):
        _check_epoch_entry(epoch, start_offset, previous, segment, line=number + 3, position=None)
        lines.append(f"{epoch} {start_offset}")
        previous = (epoch, start_offset)
    return "".join(line + "\n" for line in lines).encode("ascii")


def _check_epoch_entry(
    epoch: int,
    start_offset: int,
    previous: tuple[int, int] | None,
    segment: str,
    *,
    line: int,
    position: int | None,
) -> None:
    """Raise InvalidLogSegment unless the entry may follow ``previous`` in a checkpoint."""
    problem = None
    if not 0 <= epoch <= INT32_MAX or not 0 <= start_offset <= INT64_MAX:
        problem = f"epoch {epoch} or start offset {start_offset} out of range"
    elif previous is not None and epoch <= previous[0]:
        problem = f"epoch {epoch} not above the previous entry's {previous[0]}"
    elif previous is not None and start_offset <= previous[1]:
        problem = f"start offset {start_offset} not above the previous entry's {previous[1]}"
    if problem is not None:
        raise _invalid(
            f"leader-epoch checkpoint line {line}: {problem}",
            segment=segment,
            position=position,
            offset=start_offset,
            line=line,
        )


def parse_leader_epoch_checkpoint(data: bytes, *, segment: str = "") -> list[tuple[int, int]]:
    """The ``(epoch, start offset)`` entries of a ``leader-epoch-checkpoint`` file.

    A missing newline after the last line is tolerated (Kafka's reader tolerates it).
    Raises InvalidLogSegment (with ``line`` and the byte ``position`` of the line) for a
    version other than 0, a count that differs from the entries present, a line that is not
    the integers expected, or epochs or start offsets that do not strictly increase.
    """
    lines = _lines(data)
    version = _integers(lines, 0, 1, segment)[0] if lines else None
    if version != LEADER_EPOCH_CHECKPOINT_VERSION:
        raise _invalid(
            f"leader-epoch checkpoint version {version}, expected {LEADER_EPOCH_CHECKPOINT_VERSION}",
            segment=segment,
            position=0,
            offset=None,
            line=1,
        )
    count = _integers(lines, 1, 1, segment)[0]
    if count != len(lines) - 2:
        raise _invalid(
            f"leader-epoch checkpoint says {count} entries but holds {len(lines) - 2}",
            segment=segment,
            position=lines[1][0],
            offset=None,
            line=2,
        )
    entries: list[tuple[int, int]] = []
    for index in range(2, len(lines)):
        epoch, start_offset = _integers(lines, index, 2, segment)
        previous = entries[-1] if entries else None
        _check_epoch_entry(epoch, start_offset, previous, segment, line=index + 1, position=lines[index][0])
        entries.append((epoch, start_offset))
    return entries


def _lines(data: bytes) -> list[tuple[int, bytes]]:
    """``data``'s lines with the byte position of each; a final newline ends the last."""
    lines: list[tuple[int, bytes]] = []
    position = 0
    for text in data.split(b"\n"):
        lines.append((position, text))
        position += len(text) + 1
    if lines and lines[-1][1] == b"":
        lines.pop()
    return lines


def _integers(lines: list[tuple[int, bytes]], index: int, count: int, segment: str) -> list[int]:
    """The ``count`` space-separated non-negative integers of line ``index`` (0-based)."""
    position, text = lines[index] if index < len(lines) else (None, b"")
    words = text.split()
    if len(words) != count or not all(_DIGITS.fullmatch(word) for word in words):
        raise _invalid(
            f"leader-epoch checkpoint line {index + 1} is {text!r}, expected {count} non-negative integer(s)",
            segment=segment,
            position=position,
            offset=None,
            line=index + 1,
        )
    return [int(word) for word in words]
