"""Parsed offset indexes of remote segments, kept between fetches (Kafka's
``RemoteIndexCache`` for the offset index).

A fetch finds the byte position of an offset through the segment's offset index. Reading
and parsing the whole index on every fetch costs more than the fetch itself (a 1 GiB
segment's index has up to 262,144 entries), so each index is read and checked once
(``kafka_formats.parse_offset_index``: every entry validated) and kept as two compact
arrays (16 bytes per entry), least recently used first out when the cache holds more
than ``max_entries``. A remote segment never changes once COPY_SEGMENT_FINISHED and an
id is never reused, so an entry never goes stale; a deleted segment's entry ages out.
"""

from __future__ import annotations

import threading
import uuid
from array import array
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from slts.errors import InvalidArgument
from slts.remote import kafka_formats as kf

#: Entries kept by default: 64 MiB of arrays.
MAX_ENTRIES_DEFAULT = 4 << 20


@dataclass(frozen=True, slots=True)
class OffsetIndex:
    """One segment's offset index: ``offsets`` ascending, ``positions`` beside them."""

    offsets: array[int]
    positions: array[int]

    def position_for(self, offset: int) -> int:
        """Where to start reading the log for ``offset``: the position of the greatest
        entry at or below it, 0 if none (``kafka_formats.lookup_position``)."""
        index = bisect_right(self.offsets, offset)
        return self.positions[index - 1] if index else 0

    def bounds(self, offset: int) -> tuple[int, int | None, int | None]:
        """Where the batch holding ``offset`` can lie: ``(low, at, high)``, positions of
        the last entry below ``offset`` (0 if none), of the first entry at or above it and
        of the entry after that (None past the index's end).

        An entry holds the last offset of a batch that starts at its position (or, from an
        older follower, of a multi-batch append starting there), and the next entry's
        batch starts past it (``kafka_formats.OffsetIndexCheck``). So the batch holding
        ``offset`` lies in ``[low, high)`` (``high`` None: up to the log's end); when every
        batch has its entry (batches above ``index.interval.bytes``) it is the one at
        ``at``."""
        index = bisect_left(self.offsets, offset)
        positions = self.positions
        count = len(positions)
        low = positions[index - 1] if index else 0
        at = positions[index] if index < count else None
        high = positions[index + 1] if index + 1 < count else None
        return low, at, high


class OffsetIndexCache:
    """Thread-safe LRU of ``OffsetIndex`` by remote segment id."""

    def __init__(self, max_entries: int = MAX_ENTRIES_DEFAULT) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 0:
            raise InvalidArgument(f"max_entries must be a non-negative integer, got {max_entries!r}")
        self.max_entries = max_entries
        self._indexes: OrderedDict[uuid.UUID, OffsetIndex] = OrderedDict()
        self._entries = 0
        self._lock = threading.Lock()

    def get(
        self, segment_id: uuid.UUID, base_offset: int, load: Callable[[], bytes], *, segment: str = ""
    ) -> OffsetIndex:
        """The index of ``segment_id``; on a miss ``load()`` returns its bytes, which are
        parsed and checked (``InvalidLogSegment`` naming ``segment``: nothing is kept)."""
        with self._lock:
            found = self._indexes.get(segment_id)
            if found is not None:
                self._indexes.move_to_end(segment_id)
                return found
        entries = kf.parse_offset_index(load(), base_offset, segment=segment)
        index = OffsetIndex(
            array("q", (e.offset for e in entries)), array("q", (e.position for e in entries))
        )
        with self._lock:
            if segment_id not in self._indexes:
                self._indexes[segment_id] = index
                self._entries += len(entries)
            while self._entries > self.max_entries and self._indexes:
                _, evicted = self._indexes.popitem(last=False)
                self._entries -= len(evicted.offsets)
            assert self._entries >= 0, self._entries
        return index

    def __len__(self) -> int:
        """How many segments' indexes are kept."""
        return len(self._indexes)
