"""Read handles of offloaded objects: the shape of the source ledger's read handle
(``ledger_id``, ``last_entry_id``, ``length``, ``closed``, ``metadata``, ``read``), plus
``close`` (and use as a context manager).

``OffloadedLedger`` reads a ledger offloaded whole (PIP-17); ``StreamingLedgerHandle``
reads one ledger across the streaming segments (PIP-76) that hold its entries.

What both hand out, and how:

- **Entries.** ``read`` returns a list of bytes-like payloads cut from the bytes the
  handle read with ``read_view`` (on the filesystem binding, the chunk file's own pages,
  ``slts.bindings.mapped_reads``). With the compiled framer (built at install, the
  default) every payload is a ``Payload``: a read-only view, no copy, made for the cost of
  a small object and not tracked by the garbage collector (as Pulsar hands out slices of
  the buffer it read). Without it (``slts.offload.framing``), a payload of up to 4 KiB is
  a ``bytes`` copy (one C call copies a run of them), a larger one a read-only
  ``memoryview`` slice. A view compares equal to (and hashes as) the ``bytes`` of the
  same payload and works wherever a bytes-like object does; it keeps what it was cut
  from alive (the range read, or the chunk's mapping, even once the object is deleted):
  ``bytes(entry)`` keeps the payload alone. An entry of a PIP-17 ledger that straddles
  two ranges read is one ``bytes`` copy.
- **A bounded cache per handle.** The entries of a range read are parsed once (frames
  checked, ``slts.offload.framing``) and kept, with their views, in a least-recently-used
  cache of ``cache_ranges`` ranges (PIP-17) or ``cache_blocks`` whole blocks (PIP-76). A
  read served from the cache reads nothing; a streaming block is never read again while
  the handle holds it.
- **Read-ahead.** PIP-17: a range starts on the SLTS checksum grid and holds at least
  ``read_ahead_bytes`` (Pulsar's ``readBufferSize``); each range that goes on where the
  last one stopped is twice as large, up to ``read_ahead_max_bytes`` (by default 8 MiB
  where ranges are views of mapped chunk files, which cost no memory to hold, else 2 MiB:
  the cache then holds at most 8 MiB of copies); a read elsewhere
  starts over at ``read_ahead_bytes``. A range goes on exactly after the last one (the
  frame cut by a range's end is completed from the next), so a sequential reader reads
  every stored byte once. PIP-76: a block (at least 5 MiB) is the unit read.
- **Checks.** Every block header against the index (PIP-17) or the segment's record
  (PIP-76), every entry id against the one expected, every frame within its block, the
  block's entry count against the index or record: damaged objects raise
  ``InvalidOffloadObject``; no read returns wrong bytes.
- **Threads.** A handle may be shared: ``read`` and ``close`` hold the handle's lock, so
  reads of one handle run one at a time (as Pulsar's run on one executor thread per
  ledger) and always see a consistent cache.
- **Close.** ``close()`` drops the cache and the handle's buffers (views already handed
  out stay valid: they hold their own buffer); a later ``read`` raises
  ``OffloadHandleClosed``. Closing again does nothing.
- **Objects deleted under an open handle.** A read that finds its object gone raises
  ``OffloadNotFound`` (Pulsar: ``NoSuchLedgerExistsException``).
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import threading
from types import TracebackType
from typing import Self

from slts.errors import (
    ChunkNotFound,
    EntryOutOfRange,
    InvalidOffloadObject,
    OffloadHandleClosed,
    OffloadNotFound,
    SegmentNotFound,
)
from slts.offload import formats
from slts.offload.framing import HEADER_BYTES, Runs, parse_frames
from slts.offload.ledger_metadata import LedgerMetadata
from slts.offload.ledgers import Entry, check_entry_range
from slts.offload.names import data_name, segment_name
from slts.offload.records import OffloadRecord, StreamSegmentRecord, StreamState
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.types import SegmentHandle

#: Ranges (PIP-17) a handle keeps parsed.
CACHE_RANGES_DEFAULT = 4
#: Whole blocks (PIP-76) a handle keeps parsed.
CACHE_BLOCKS_DEFAULT = 4
#: The largest range a sequential PIP-17 reader's read-ahead grows to: ranges read as views
#: of the chunk files' pages (``read_views_mapped``) cost no memory to hold, so they grow
#: further (fewer reads, each with its fixed cost) than copies, which the cache holds.
READ_AHEAD_MAX_BYTES_MAPPED = 8 << 20
READ_AHEAD_MAX_BYTES_COPIED = 2 << 20


class _Closable:
    """``close`` and the context-manager protocol over ``_lock``, ``_closed`` and
    ``_release``."""

    _lock: threading.Lock
    _closed: bool
    name: str

    def _release(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the handle holds (cache, buffers); later reads raise
        ``OffloadHandleClosed``. Idempotent; entries already read stay valid."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._release()

    def _check_open(self) -> None:
        if self._closed:
            raise OffloadHandleClosed(f"the read handle of {self.name!r} is closed", object=self.name)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


def _gone(storage: ChunkedSegmentStorage, name: str, error: Exception) -> Exception:
    """The error for a read of object ``name`` that raised ``error`` (a segment or chunk
    not found): ``OffloadNotFound`` if the object is deleted, else ``error`` itself."""
    if isinstance(error, SegmentNotFound) or not storage.exists(name):
        return OffloadNotFound(f"offload object {name!r} was deleted under the read handle", object=name)
    return error


@dataclasses.dataclass(frozen=True, slots=True)
class _Cursor:
    """Where the walk of a PIP-17 data object goes on: block ``number``, object position,
    the entry id expected there, and whether the position is the block's header."""

    number: int
    position: int
    expected: int
    at_header: bool


@dataclasses.dataclass(frozen=True, slots=True)
class _Range:
    """A range read of a PIP-17 data object, parsed: its bytes, where the payloads of
    entries ``first..`` lie in them, the cursor after them and the bytes read past it
    (``tail``, for the next range)."""

    first: int
    count: int
    buffer: memoryview
    runs: Runs
    after: _Cursor
    tail: memoryview
    end: int  # the object position where the bytes read end


class OffloadedLedger(_Closable):
    """A read handle of an offloaded ledger (the source's shape, plus ``close``); see the
    module doc for views, cache, read-ahead, threads and close."""

    def __init__(
        self,
        storage: ChunkedSegmentStorage,
        record: OffloadRecord,
        index: formats.OffloadIndex,
        metadata: LedgerMetadata,
        *,
        read_ahead_bytes: int,
        read_ahead_max_bytes: int | None = None,
        cache_ranges: int = CACHE_RANGES_DEFAULT,
    ) -> None:
        assert read_ahead_bytes > 0 and cache_ranges > 0, (read_ahead_bytes, cache_ranges)
        self._storage = storage
        self._read_ahead = read_ahead_bytes
        if read_ahead_max_bytes is None:
            mapped = storage.read_views_mapped
            read_ahead_max_bytes = READ_AHEAD_MAX_BYTES_MAPPED if mapped else READ_AHEAD_MAX_BYTES_COPIED
        self._read_ahead_max = max(read_ahead_bytes, read_ahead_max_bytes)
        self._ahead = read_ahead_bytes
        self._align = storage.config.checksum_block_bytes
        self._record = record
        self._index = index
        self._metadata = metadata
        self.name = data_name(record.ledger_id, record.id)
        self._segment: SegmentHandle | None = storage.open_read(self.name)
        self._lock = threading.Lock()
        self._closed = False
        self._capacity = cache_ranges
        #: Parsed ranges by first entry id, least recently used first.
        self._ranges: collections.OrderedDict[int, _Range] = collections.OrderedDict()
        self._last_loaded: _Range | None = None

    @property
    def ledger_id(self) -> int:
        return self._record.ledger_id

    @property
    def last_entry_id(self) -> int:
        return self._record.entries - 1

    @property
    def length(self) -> int:
        return self._record.length

    @property
    def closed(self) -> bool:
        """The ledger is closed (always: only closed ledgers are offloaded); not the handle."""
        return True

    @property
    def metadata(self) -> LedgerMetadata:
        return self._metadata

    @property
    def cached_bytes(self) -> int:
        """Bytes of the data object the handle holds in its cache (0 once closed)."""
        with self._lock:
            return sum(len(span.buffer) for span in self._ranges.values())

    def read(self, first: int, last: int) -> list[Entry]:
        """Entries ``first..last`` inclusive, as views (module doc). Raises
        ``EntryOutOfRange``, ``InvalidArgument``, ``OffloadHandleClosed``,
        ``OffloadNotFound`` (the data object was deleted), ``InvalidOffloadObject`` (a
        block header or entry framing that does not parse or agree: the data object is
        damaged), storage errors."""
        with self._lock:
            self._check_open()
            first, last = check_entry_range(self, first, last)
            entries: list[Entry] = []
            entry = first
            while entry <= last:
                span = self._range_holding(entry)
                entry = span.runs.payloads(span.buffer, entry, last, entries)
            if len(entries) != last - first + 1:  # not an assert: wrong entries must not leave
                raise InvalidOffloadObject(
                    f"offload object {self.name!r}: a read of {first}..{last} gathered"
                    f" {len(entries)} entries",
                    object=self.name,
                )
            return entries

    def _release(self) -> None:
        self._ranges.clear()
        self._last_loaded = None
        self._segment = None

    def _range_holding(self, entry: int) -> _Range:
        """The parsed range holding ``entry``: from the cache, else read (and cached)
        from the nearest known cursor before it."""
        for span in reversed(self._ranges.values()):
            if span.first <= entry < span.first + span.count:
                self._ranges.move_to_end(span.first)
                return span
        number = self._index.block_for(entry)
        start: _Range | None = None
        for span in self._ranges.values():
            after = span.after
            if (
                after.number == number
                and after.expected <= entry
                and (start is None or after.expected > start.after.expected)
            ):
                start = span
        if start is None:
            block = self._index.entries[number]
            cursor, tail, tail_end = _Cursor(number, block.offset, block.entry_id, True), memoryview(b""), 0
            self._ahead = self._read_ahead
        else:
            cursor, tail, tail_end = start.after, start.tail, start.end
            if start is self._last_loaded:  # a sequential reader: read further ahead
                self._ahead = min(self._ahead * 2, self._read_ahead_max)
        while True:
            span = self._load(cursor, tail, tail_end)
            self._ranges[span.first] = span
            self._ranges.move_to_end(span.first)
            while len(self._ranges) > self._capacity:
                self._ranges.popitem(last=False)
            self._last_loaded = span
            if entry < span.first + span.count:
                return span
            cursor, tail, tail_end = span.after, span.tail, span.end

    def _range_start(self, cursor: _Cursor, tail: memoryview, tail_end: int) -> int:
        """Where the range read after ``cursor`` begins: after ``tail`` (the bytes from the
        cursor on, already read, ending at ``tail_end``), else on the grid before it."""
        if len(tail) and tail_end == cursor.position + len(tail):
            return tail_end
        return cursor.position - cursor.position % self._align

    def _range_end(self, start: int, position: int, ahead: int) -> int:
        """Where a range read from ``start`` for the cursor at ``position`` ends: ``ahead``
        bytes on, and past the next block and frame headers, on the grid (or the end)."""
        want = max(ahead, position + formats.HEADER_SIZE + HEADER_BYTES - start)
        return min(self._index.data_object_length, -(-(start + want) // self._align) * self._align)

    def _load(self, cursor: _Cursor, tail: memoryview, tail_end: int) -> _Range:
        """Read the range after ``cursor`` (``tail``: the bytes from the cursor's position
        to ``tail_end`` already read) and parse what it completes; at least one entry."""
        data_end = self._index.data_object_length
        runs = Runs()
        while True:
            start = self._range_start(cursor, tail, tail_end)
            if not (len(tail) and tail_end == cursor.position + len(tail)):
                tail = memoryview(b"")
            if start >= data_end and not len(tail):
                raise InvalidOffloadObject(
                    f"offload object {self.name!r} at byte {cursor.position}: entry {cursor.expected}"
                    f" lies past the object's end {data_end}",
                    object=self.name,
                    offset=cursor.position,
                )
            end = self._range_end(start, cursor.position, self._ahead)
            buffer = self._fetch(start, end - start) if end > start else memoryview(b"")
            cursor, rest = self._parse(cursor, tail, buffer, start, runs)
            if len(runs):
                return _Range(runs.first, len(runs), buffer, runs, cursor, rest, end)
            if end >= data_end:  # not an assert: a damaged object must not loop
                raise InvalidOffloadObject(
                    f"offload object {self.name!r} at byte {cursor.position}: entry {cursor.expected}"
                    f" is cut by the object's end {data_end}",
                    object=self.name,
                    offset=cursor.position,
                )
            # Nothing completed (a frame larger than the range): go on with all of it as the tail.
            tail, tail_end = memoryview(rest.tobytes()), end
            self._ahead = max(self._ahead, end - cursor.position)

    def _parse(
        self, cursor: _Cursor, head: memoryview, buffer: memoryview, start: int, runs: Runs
    ) -> tuple[_Cursor, memoryview]:
        """Walk the frames of ``head`` (the bytes before object position ``start``) and
        ``buffer`` (from ``start``) from ``cursor``; return the cursor after the last whole
        frame (the frames added to ``runs``) and the bytes from the cursor on."""
        blocks = self._index.entries
        head_start = start - len(head)
        end = start + len(buffer)
        number, position = cursor.number, cursor.position
        expected, at_header = cursor.expected, cursor.at_header
        assert head_start == position or not len(head), (head_start, position)

        def piece(at: int, size: int) -> bytes | memoryview:
            if at >= start:
                return buffer[at - start : at - start + size]
            if at + size <= start:
                return head[at - head_start : at - head_start + size]
            return head[at - head_start :].tobytes() + buffer[: at + size - start].tobytes()

        while True:
            block_end = self._bounds(number)[1]
            block_last = blocks[number + 1].entry_id - 1 if number + 1 < len(blocks) else self.last_entry_id
            if at_header:
                if position + formats.HEADER_SIZE > end:
                    break
                try:
                    self._check_header(number, piece(position, formats.HEADER_SIZE), expected)
                except InvalidOffloadObject:
                    if not len(runs):
                        raise
                    break  # the entries before the damage are sound; a read past them raises
                position, at_header = position + formats.HEADER_SIZE, False
            if expected <= block_last and position < start:  # a frame begun in the head
                if position + HEADER_BYTES > end:
                    break
                length, entry_id = formats.parse_entry_header(piece(position, HEADER_BYTES))
                if entry_id != expected or length < 0 or position + HEADER_BYTES + length > block_end:
                    raise InvalidOffloadObject(
                        f"offload object {self.name!r} at byte {position}: entry {entry_id} of"
                        f" {length} bytes where entry {expected} was expected within the block"
                        f" ending at byte {block_end}",
                        object=self.name,
                        offset=position,
                    )
                if position + HEADER_BYTES + length > end:
                    break
                runs.add_extra(expected, piece(position + HEADER_BYTES, length))
                position, expected = position + HEADER_BYTES + length, expected + 1
                continue
            if position >= start:
                frames = parse_frames(
                    buffer,
                    position - start,
                    len(buffer),
                    block_end - start,
                    expected,
                    block_last - expected + 1,
                    runs,
                    name=self.name,
                    base=start,
                )
                position, expected = start + frames.position, expected + frames.found
                if frames.error is not None and not len(runs):
                    raise frames.error
                if not frames.done:
                    break  # the bytes end, or damage: a read past the entries before it raises
            if number + 1 == len(blocks):
                break
            number, position, at_header = number + 1, block_end, True
            assert blocks[number].offset == block_end, (number, block_end)
        after = _Cursor(number, position, expected, at_header)
        if position >= end:
            rest = memoryview(b"")
        elif position >= start:
            rest = buffer[position - start :]
        else:
            rest = memoryview(head[position - head_start :].tobytes() + buffer.tobytes())
        return after, rest

    def _check_header(self, number: int, data: bytes | memoryview, expected: int) -> None:
        """Check block ``number``'s header against the index and ``expected`` (the entry
        id the block must begin with)."""
        entry = self._index.entries[number]
        start, end = self._bounds(number)
        header = formats.parse_block_header(data, name=self.name, offset=start)
        if (
            header.first_entry_id != entry.entry_id
            or entry.entry_id != expected
            or start + header.block_length != end
        ):
            raise InvalidOffloadObject(
                f"offload object {self.name!r} at byte {start}: the block header says first entry"
                f" {header.first_entry_id} and {header.block_length} bytes, the index {entry.entry_id}"
                f" and {end - start}, the entries before it lead to {expected}",
                object=self.name,
                offset=start,
            )

    def _bounds(self, number: int) -> tuple[int, int]:
        """Where block ``number`` starts and ends in the data object (from the index)."""
        blocks = self._index.entries
        end = blocks[number + 1].offset if number + 1 < len(blocks) else self._index.data_object_length
        return blocks[number].offset, end

    def _fetch(self, start: int, size: int) -> memoryview:
        """Bytes ``[start, start+size)`` of the data object, a view (``read_view``: of the
        chunk's own pages where the binding maps them); ``OffloadNotFound`` if deleted."""
        assert self._segment is not None
        try:
            return self._storage.read_view(self._segment, start, size)
        except (SegmentNotFound, ChunkNotFound) as error:
            raise _gone(self._storage, self.name, error) from error


class StreamingLedgerHandle(_Closable):
    """A read handle of one ledger across streaming segments (the source's shape, plus
    ``close``); see the module doc for views, cache, threads and close."""

    def __init__(
        self,
        storage: ChunkedSegmentStorage,
        managed_ledger: str,
        ledger_id: int,
        blocks: list[tuple[StreamSegmentRecord, list[int]]],
        *,
        cache_blocks: int = CACHE_BLOCKS_DEFAULT,
    ) -> None:
        assert cache_blocks > 0, cache_blocks
        self._storage = storage
        self._managed_ledger = managed_ledger
        self._ledger_id = ledger_id
        self._blocks = blocks
        self._firsts = [row[1] for _, row in blocks]
        self._first = blocks[0][1][1] if blocks else 0
        self._last = blocks[-1][1][5] if blocks else -1
        self._length = sum(
            segment.ledgers[ledger_id][1] for segment in {s.sequence: s for s, _ in blocks}.values()
        )
        self.name = f"{managed_ledger}: ledger {ledger_id}"
        self._lock = threading.Lock()
        self._closed = False
        self._capacity = cache_blocks
        #: Parsed blocks by position in ``blocks``, least recently used first.
        self._cache: collections.OrderedDict[int, tuple[memoryview, Runs]] = collections.OrderedDict()
        self._handles: dict[int, SegmentHandle] = {}

    @property
    def ledger_id(self) -> int:
        return self._ledger_id

    @property
    def first_entry_id(self) -> int:
        """The first entry offloaded (a ledger offloaded from its middle starts later)."""
        return self._first

    @property
    def last_entry_id(self) -> int:
        return self._last

    @property
    def length(self) -> int:
        return self._length

    @property
    def closed(self) -> bool:
        """Every segment holding the ledger is complete (the ledger's state, not the handle's)."""
        return all(segment.state == StreamState.COMPLETE for segment, _ in self._blocks)

    @property
    def metadata(self) -> LedgerMetadata:
        return LedgerMetadata(last_entry_id=self._last, length=self._length, closed=self.closed)

    @property
    def cached_bytes(self) -> int:
        """Bytes of blocks the handle holds in its cache (0 once closed)."""
        with self._lock:
            return sum(len(view) for view, _ in self._cache.values())

    def read(self, first: int, last: int) -> list[Entry]:
        """Entries ``first..last`` in order, across segments, as views (module doc).
        Raises ``EntryOutOfRange`` (outside what was offloaded), ``InvalidArgument``,
        ``OffloadHandleClosed``, ``OffloadNotFound`` (a segment was deleted),
        ``InvalidOffloadObject`` (damaged blocks)."""
        with self._lock:
            self._check_open()
            first, last = check_entry_range(self, first, last)
            if first < self._first:
                raise EntryOutOfRange(
                    f"ledger {self._ledger_id}: entries before {self._first} were not offloaded",
                    ledger=self._ledger_id,
                    first=first,
                    last=last,
                )
            entries: list[Entry] = []
            entry = first
            number = bisect.bisect_right(self._firsts, first) - 1
            while entry <= last:
                block_first = self._firsts[number]
                if block_first > entry:
                    segment, row = self._blocks[number]
                    name = segment_name(self._managed_ledger, segment.id)
                    raise InvalidOffloadObject(
                        f"offload object {name!r} at byte {row[3]}: its block begins with entry"
                        f" {block_first} where {entry} was expected",
                        object=name,
                        offset=row[3],
                    )
                buffer, runs = self._block(number)
                entry = runs.payloads(buffer, entry, last, entries)
                number += 1
            if len(entries) != last - first + 1:  # not an assert: wrong entries must not leave
                raise InvalidOffloadObject(
                    f"{self.name}: a read of {first}..{last} gathered {len(entries)} entries",
                    object=self.name,
                )
            return entries

    def _release(self) -> None:
        self._cache.clear()
        self._handles.clear()

    def _block(self, number: int) -> tuple[memoryview, Runs]:
        """The bytes of block ``number`` and where its payloads lie in them (from the
        cache, else read whole and checked)."""
        cached = self._cache.get(number)
        if cached is not None:
            self._cache.move_to_end(number)
            return cached
        segment, (_, block_first, _, offset, length, block_last) = self._blocks[number]
        name = segment_name(self._managed_ledger, segment.id)
        block = self._read_block(number)
        header = formats.parse_streaming_block_header(block, name=name, offset=offset)
        if (header.ledger_id, header.first_entry_id, header.block_length) != (
            self._ledger_id,
            block_first,
            length,
        ):
            raise InvalidOffloadObject(
                f"offload object {name!r} at byte {offset}: the block header says ledger"
                f" {header.ledger_id} from entry {header.first_entry_id} in {header.block_length} bytes,"
                f" the segment's record ledger {self._ledger_id} from {block_first} in {length}",
                object=name,
                offset=offset,
            )
        runs = Runs()
        frames = parse_frames(
            block,
            formats.HEADER_SIZE,
            length,
            length,
            block_first,
            block_last - block_first + 1,
            runs,
            name=name,
            base=offset,
        ).checked()
        assert frames.done, (name, offset)
        self._cache[number] = block, runs
        while len(self._cache) > self._capacity:
            self._cache.popitem(last=False)
        return block, runs

    def _segment_handle(self, number: int) -> tuple[str, SegmentHandle]:
        """The name and a read handle of the segment holding block ``number``."""
        segment = self._blocks[number][0]
        name = segment_name(self._managed_ledger, segment.id)
        handle = self._handles.get(segment.sequence)
        if handle is None:
            try:
                handle = self._handles[segment.sequence] = self._storage.open_read(name)
            except SegmentNotFound as error:
                raise _gone(self._storage, name, error) from error
        return name, handle

    def _read_block(self, number: int) -> memoryview:
        """Block ``number``'s bytes, a view as ``_fetch``'s (``OffloadNotFound`` if its
        segment was deleted)."""
        name, handle = self._segment_handle(number)
        _, _, _, offset, length, _ = self._blocks[number][1]
        try:
            return self._storage.read_view(handle, offset, length)
        except (SegmentNotFound, ChunkNotFound) as error:
            raise _gone(self._storage, name, error) from error
