"""Resolved layouts: the chunk extents reads have resolved, per segment, for one version
of the segment's record, so that a read of a known range costs one validating record
read and a binary search instead of an index seek and a chunk record per chunk.

Every change of a segment's chunk list, chunk lengths or offset index commits the
segment's record at a new version, and versions are never reused (``EngineContext.version``).
So the extents read while the record stood at version V are the layout at V, exactly,
for as long as the record stays at V: a read that finds the record at V (its one
validating read, through the metadata cache, which notices commits of other processes)
may use them without reading the index or the chunk records again. A record at any other
version makes the segment's extents unusable; they are replaced by the next ones learned.

The validating read itself is skipped while nothing at all was committed: the metadata
store's change marker (``MetadataStore.change_marker``: LMDB's last transaction id, read
without a transaction) differs after any commit by anyone. A ``find`` that confirmed
version V after reading marker M records M; a later read that finds the marker still at
M (``find_unchanged``) knows the record is still at V, since any commit after M, the
version read included, would have moved it. Learning extents at a new version, or
advancing them past an append, forgets the marker until the next confirmation.

An owner's own append is the one change that keeps extents: it only adds bytes past the
old end (to the last chunk, and in new chunks after it), so every extent but the last
chunk's is the same at the new version (``advance``). Readers tailing a segment that is
being written keep their resolved extents instead of resolving them afresh per append.

Invariants (asserted; cited by ``tests/storage/test_resolved_layouts.py``):

1. **Exact.** Extents are only ever added for the version they were read at (``learn``
   is given the version the read validated), and found only for that same version,
   or at the change marker read before that version was confirmed (no commit since).
2. **Ordered, disjoint.** Per segment, extents are sorted by start offset and do not
   overlap; each is ``(start, chunk record)`` covering ``[start, start + chunk.length)``.
3. **Bounded.** The extents of all segments together never exceed ``capacity``; the
   least recently used segment's extents go first.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Sequence

from slts.errors import InvalidArgument
from slts.metadata.records import ChunkRecord, SegmentRecord

#: One resolved extent: a chunk and the segment offset it starts at.
Extent = tuple[int, ChunkRecord]


class _Layout:
    """The extents known of one segment at one version of its record."""

    __slots__ = ("chunks", "marker", "record", "starts", "version")

    def __init__(self, version: int, record: SegmentRecord) -> None:
        self.version = version
        self.record = record
        #: The store's change marker read before ``version`` was last confirmed current
        #: (None: not confirmed since it was learned or advanced).
        self.marker: object = None
        self.starts: list[int] = []
        self.chunks: list[ChunkRecord] = []

    def find(self, offset: int, end: int) -> list[Extent] | None:
        """The known extents covering ``[offset, end)`` (``offset < end``) without a gap,
        or None if some of it is not known."""
        starts, chunks = self.starts, self.chunks
        at = bisect.bisect_right(starts, offset) - 1
        if at < 0 or starts[at] + chunks[at].length <= offset:
            return None
        found: list[Extent] = []
        position = starts[at]
        while True:
            chunk = chunks[at]
            found.append((position, chunk))
            position += chunk.length
            if position >= end:
                return found
            at += 1
            if at == len(starts) or starts[at] != position:
                return None  # a gap: the next chunk is not known

    def add(self, extents: Sequence[Extent]) -> int:
        """Add ``extents`` not known yet (empty chunks hold no byte to find: left out);
        returns how many were added."""
        added = 0
        for start, chunk in extents:
            if not chunk.length:
                continue
            at = bisect.bisect_left(self.starts, start)
            if at < len(self.starts) and self.starts[at] == start:
                assert self.chunks[at].name == chunk.name, (start, self.chunks[at].name, chunk.name)
                continue
            assert at == 0 or self.starts[at - 1] + self.chunks[at - 1].length <= start, (at, start)
            assert at == len(self.starts) or start + chunk.length <= self.starts[at], (at, start)
            self.starts.insert(at, start)
            self.chunks.insert(at, chunk)
            added += 1
        return added

    def drop_last(self, end: int) -> int:
        """Forget the extent that ends at ``end`` or later (the last chunk, which an
        append grows); returns how many extents were dropped."""
        dropped = 0
        while self.starts and self.starts[-1] + self.chunks[-1].length >= end:
            self.starts.pop()
            self.chunks.pop()
            dropped += 1
        return dropped


class ResolvedLayouts:
    """Extents resolved by reads, per segment and record version (see module doc);
    thread-safe. ``capacity``: most extents kept, all segments together."""

    def __init__(self, capacity: int) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise InvalidArgument(f"capacity must be an integer >= 1, got {capacity!r}")
        self.capacity = capacity
        self._layouts: OrderedDict[str, _Layout] = OrderedDict()
        self._extents = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        """How many extents are kept (never more than ``capacity``)."""
        return self._extents

    def find(
        self, name: str, version: int, offset: int, length: int, marker: object = None
    ) -> tuple[SegmentRecord, list[Extent]] | None:
        """Segment ``name``'s record at ``version`` and the extents covering ``[offset,
        offset + length)`` (none for ``length`` 0), if the record read at ``version`` was
        learned and every chunk of the range is known; else None.

        ``marker``: the store's change marker, read before ``version`` was: a layout at
        ``version`` keeps it, so ``find_unchanged`` at that marker needs no version."""
        with self._lock:
            layout = self._layouts.get(name)
            if layout is None or layout.version != version:
                self.misses += 1
                return None
            if marker is not None:
                layout.marker = marker
            return self._found(name, layout, offset, length)

    def find_unchanged(
        self, name: str, marker: object, offset: int, length: int
    ) -> tuple[SegmentRecord, list[Extent]] | None:
        """``find`` at the version last confirmed at ``marker``, the store's change
        marker read now: equal markers mean no commit landed since that confirmation, so
        that version is the record's still. None if the marker moved (or was never
        confirmed) or the range is not known (not counted as a miss: the caller asks
        ``find`` next, with the version)."""
        with self._lock:
            layout = self._layouts.get(name)
            if layout is None or layout.marker is None or layout.marker != marker:
                return None
            return self._found(name, layout, offset, length, count_miss=False)

    def _found(
        self, name: str, layout: _Layout, offset: int, length: int, count_miss: bool = True
    ) -> tuple[SegmentRecord, list[Extent]] | None:
        """``layout``'s extents covering the range, counted as a hit (or a miss). Lock held."""
        found = layout.find(offset, offset + length) if length else []
        if found is None:
            self.misses += count_miss
            return None
        self._layouts.move_to_end(name)
        self.hits += 1
        return layout.record, found

    def continues(self, name: str, version: int, offset: int) -> bool:
        """Whether a known extent of segment ``name`` at ``version`` ends at ``offset``: a
        read that starts there has walked off what earlier reads resolved (a sequential
        reader, most likely; the engine resolves some chunks past it then)."""
        with self._lock:
            layout = self._layouts.get(name)
            if layout is None or layout.version != version:
                return False
            at = bisect.bisect_left(layout.starts, offset) - 1
            return at >= 0 and layout.starts[at] + layout.chunks[at].length == offset

    def learn(
        self,
        name: str,
        version: int,
        record: SegmentRecord,
        extents: Sequence[Extent],
        marker: object = None,
    ) -> None:
        """Keep ``extents`` of segment ``name``, read while its record stood at
        ``version`` (``record``): the caller checked that no commit of the segment
        landed between reading the record and reading the extents. ``marker``: as
        ``find``'s, the store's change marker read before that check's version read."""
        assert record.name == name, (record.name, name)
        with self._lock:
            layout = self._layouts.get(name)
            if layout is None or layout.version != version:
                if layout is not None:
                    self._extents -= len(layout.starts)
                layout = _Layout(version, record)
                self._layouts[name] = layout
            if marker is not None:
                layout.marker = marker
            self._layouts.move_to_end(name)
            self._extents += layout.add(extents)
            self._evict()

    def advance(self, name: str, old_version: int, new_version: int, record: SegmentRecord) -> None:
        """Segment ``name`` went from ``old_version`` to ``new_version`` (``record``) by
        an append alone (bytes past the old end; no chunk before the last one changed):
        its extents but the last chunk's stay known at the new version. A layout at any
        other version is forgotten."""
        with self._lock:
            layout = self._layouts.get(name)
            if layout is None:
                return
            if layout.version != old_version:
                self._forget(name)
                return
            assert record.start_offset >= layout.record.start_offset, (record, layout.record)
            self._extents -= layout.drop_last(layout.record.length)
            layout.version, layout.record, layout.marker = new_version, record, None

    def forget(self, name: str) -> None:
        """Drop segment ``name``'s extents (it changed, or is gone)."""
        with self._lock:
            self._forget(name)

    def clear(self) -> None:
        """Drop every segment's extents."""
        with self._lock:
            self._layouts.clear()
            self._extents = 0

    def _forget(self, name: str) -> None:
        layout = self._layouts.pop(name, None)
        if layout is not None:
            self._extents -= len(layout.starts)

    def _evict(self) -> None:
        while self._extents > self.capacity and self._layouts:
            _, layout = self._layouts.popitem(last=False)
            self._extents -= len(layout.starts)
        assert 0 <= self._extents <= self.capacity, (self._extents, self.capacity)
