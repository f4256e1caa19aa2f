"""Read handles of offloaded objects: the shape of the source ledger's read handle
(``ledger_id``, ``last_entry_id``, ``length``, ``closed``, ``metadata``, ``read``).

``OffloadedLedger`` reads a ledger offloaded whole (PIP-17): the index is read once; a
read finds the block of its first entry by binary search in the index, checks the
block's header, and walks the framed entries with ranged reads of at least
``read_ahead_bytes``, continuing where the previous read stopped (sequential readers read
each byte once).

``StreamingLedgerHandle`` reads one ledger across the streaming segments (PIP-76) that
hold its entries, checking each block's header against the segment's record and each
entry id.
"""

from __future__ import annotations

from collections.abc import Iterator

from slts.errors import EntryOutOfRange, InvalidOffloadObject
from slts.offload import formats
from slts.offload.ledger_metadata import LedgerMetadata
from slts.offload.ledgers import check_entry_range
from slts.offload.names import data_name, segment_name
from slts.offload.records import OffloadRecord, StreamSegmentRecord, StreamState
from slts.storage.chunked import ChunkedSegmentStorage


class OffloadedLedger:
    """A read handle of an offloaded ledger (the source's shape: ``ledger_id``,
    ``last_entry_id``, ``length``, ``closed``, ``metadata``, ``read``)."""

    def __init__(
        self,
        storage: ChunkedSegmentStorage,
        record: OffloadRecord,
        index: formats.OffloadIndex,
        metadata: LedgerMetadata,
        *,
        read_ahead_bytes: int,
    ) -> None:
        self._storage = storage
        self._read_ahead = read_ahead_bytes
        self._align = self._storage.config.checksum_block_bytes
        self._record = record
        self._index = index
        self._metadata = metadata
        self.name = data_name(record.ledger_id, record.id)
        self._segment = self._storage.open_read(self.name)
        self._buffer_start = 0
        self._buffer = memoryview(b"")
        #: (entry id, byte position) where the last read stopped: a sequential reader goes on there.
        self._resume: tuple[int, int] | None = None

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
        return True

    @property
    def metadata(self) -> LedgerMetadata:
        return self._metadata

    def read(self, first: int, last: int) -> list[bytes]:
        """Entries ``first..last`` inclusive. Raises ``EntryOutOfRange``,
        ``InvalidArgument``, ``InvalidOffloadObject`` (a block header or entry framing that
        does not parse: the data object is damaged), storage errors."""
        first, last = check_entry_range(self, first, last)
        entries: list[bytes] = []
        for entry_id, payload in self._walk(first):
            entries.append(payload)
            if entry_id == last:
                break
        assert len(entries) == last - first + 1, (first, last, len(entries))
        return entries

    def _walk(self, first: int) -> Iterator[tuple[int, bytes]]:
        """(entry id, payload) from ``first`` on, across blocks, ids without a gap."""
        blocks = self._index.entries
        number = self._index.block_for(first)
        start, block_end = self._bounds(number)
        if self._resume is not None and self._resume[0] == first and start < self._resume[1] < block_end:
            expected, position = self._resume  # a sequential reader: on where the last read stopped
        else:
            expected, position = self._enter_block(number, blocks[number].entry_id)
        while True:
            if position + formats.ENTRY_HEADER_SIZE <= block_end:
                length, entry_id = formats.parse_entry_header(self._view(position, formats.ENTRY_HEADER_SIZE))
            else:
                length, entry_id = -1, -1  # the block is full to its end
            if length < 0:  # padding: the next block, which must go on with the next entry
                number += 1
                if number == len(blocks):
                    return
                _, block_end = self._bounds(number)
                expected, position = self._enter_block(number, expected)
                continue
            end = position + formats.ENTRY_HEADER_SIZE + length
            if entry_id != expected or end > block_end:
                raise InvalidOffloadObject(
                    f"offload object {self.name!r} at byte {position}: entry {entry_id} of {length} bytes"
                    f" where entry {expected} was expected within the block ending at {block_end}",
                    object=self.name,
                    offset=position,
                )
            if entry_id >= first:
                payload = bytes(self._view(position + formats.ENTRY_HEADER_SIZE, length))
                self._resume = (entry_id + 1, end)
                yield entry_id, payload
            expected, position = entry_id + 1, end

    def _bounds(self, number: int) -> tuple[int, int]:
        """Where block ``number`` starts and ends in the data object (from the index)."""
        blocks = self._index.entries
        end = blocks[number + 1].offset if number + 1 < len(blocks) else self._index.data_object_length
        return blocks[number].offset, end

    def _enter_block(self, number: int, expected: int) -> tuple[int, int]:
        """Check block ``number``'s header against the index and ``expected`` (the entry id
        it must begin with); return (that id, the position of its first entry)."""
        entry = self._index.entries[number]
        start, end = self._bounds(number)
        header = formats.parse_block_header(
            self._view(start, formats.HEADER_SIZE), name=self.name, offset=start
        )
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
        return entry.entry_id, start + formats.HEADER_SIZE

    def _view(self, position: int, length: int) -> memoryview:
        """``length`` bytes of the data object at ``position`` (valid until the next call),
        from the read-ahead buffer or a ranged read of at least ``read_ahead_bytes``."""
        offset = position - self._buffer_start
        if offset >= 0 and offset + length <= len(self._buffer):
            return self._buffer[offset : offset + length]
        data_end = self._index.data_object_length
        if position + length > data_end:
            raise InvalidOffloadObject(
                f"offload object {self.name!r} at byte {position}: {length} bytes asked past its end",
                object=self.name,
                offset=position,
            )
        # On the SLTS checksum blocks' grid (the offloader's writes keep chunks on it), so
        # the storage verifies whole blocks and hands them over without cutting a copy.
        align = self._align
        start = position - position % align
        end = min(data_end, -(-max(position + length, start + self._read_ahead) // align) * align)
        self._buffer = memoryview(self._storage.read(self._segment, start, end - start))
        self._buffer_start = start
        return self._buffer[position - start : position - start + length]


class StreamingLedgerHandle:
    """A read handle of one ledger across streaming segments (the source's shape)."""

    def __init__(
        self,
        storage: ChunkedSegmentStorage,
        managed_ledger: str,
        ledger_id: int,
        blocks: list[tuple[StreamSegmentRecord, list[int]]],
    ) -> None:
        self._storage = storage
        self._managed_ledger = managed_ledger
        self._ledger_id = ledger_id
        self._blocks = blocks
        self._first = blocks[0][1][1] if blocks else 0
        self._last = blocks[-1][1][5] if blocks else -1
        self._length = sum(
            segment.ledgers[ledger_id][1] for segment in {s.sequence: s for s, _ in blocks}.values()
        )

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
        return all(segment.state == StreamState.COMPLETE for segment, _ in self._blocks)

    @property
    def metadata(self) -> LedgerMetadata:
        return LedgerMetadata(last_entry_id=self._last, length=self._length, closed=self.closed)

    def read(self, first: int, last: int) -> list[bytes]:
        """Entries ``first..last`` in order, across segments. Raises ``EntryOutOfRange``
        (outside what was offloaded), ``InvalidOffloadObject`` (damaged blocks)."""
        first, last = check_entry_range(self, first, last)
        if first < self._first:
            raise EntryOutOfRange(
                f"ledger {self._ledger_id}: entries before {self._first} were not offloaded",
                ledger=self._ledger_id,
                first=first,
                last=last,
            )
        storage = self._storage
        entries: list[bytes] = []
        expected = first
        for segment, (_, block_first, _, offset, length, block_last) in self._blocks:
            if block_last < first or block_first > last:
                continue
            name = segment_name(self._managed_ledger, segment.id)
            block = storage.read(storage.open_read(name), offset, length)
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
            for entry_id, payload in block_entries(block, header, name=name, offset=offset):
                if first <= entry_id <= last:
                    if entry_id != expected:
                        raise InvalidOffloadObject(
                            f"offload object {name!r}: entry {entry_id} where {expected} was expected",
                            object=name,
                            offset=offset,
                        )
                    entries.append(payload)
                    expected += 1
        assert len(entries) == last - first + 1, (first, last, len(entries))
        return entries


def block_entries(
    block: bytes, header: formats.StreamingBlockHeader, *, name: str, offset: int
) -> list[tuple[int, bytes]]:
    """The (entry id, payload) pairs of one whole streaming block, in order, ids following
    one another from the header's; ``InvalidOffloadObject`` for a block cut short, an entry
    past the block's end, or a gap."""
    if len(block) < header.block_length:
        raise InvalidOffloadObject(
            f"offload object {name!r} at byte {offset}: a block of {header.block_length} bytes"
            f" holds {len(block)}",
            object=name,
            offset=offset,
        )
    view = memoryview(block)
    entries: list[tuple[int, bytes]] = []
    position = formats.HEADER_SIZE
    while position + formats.ENTRY_HEADER_SIZE <= header.block_length:
        length, entry_id = formats.parse_entry_header(view[position:])
        if length < 0:
            break
        end = position + formats.ENTRY_HEADER_SIZE + length
        if end > header.block_length or entry_id != header.first_entry_id + len(entries):
            raise InvalidOffloadObject(
                f"offload object {name!r} at byte {offset + position}: entry {entry_id} of {length} bytes",
                object=name,
                offset=offset + position,
            )
        entries.append((entry_id, bytes(view[position + formats.ENTRY_HEADER_SIZE : end])))
        position = end
    if not entries:
        raise InvalidOffloadObject(
            f"offload object {name!r} at byte {offset}: a block without entries", object=name, offset=offset
        )
    return entries
