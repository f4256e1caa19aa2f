"""System segments: append-only byte sequences whose layout is pinned in memory and
journaled (DESIGN.md §6; PDP-34 "The solution: Log Structured Snapshotting Metadata Store").

``SystemSegments`` writes and truncates the container's system segments through one
``SystemJournal``. The order of every change is data first, journal second:

* **append**: to the last chunk when the binding can append, this instance created that
  chunk in this boot, nothing failed on it, and it stays within ``rolling_bytes``;
  otherwise a new chunk (named like every chunk: container, segment, epoch, offset,
  random part) is created holding the data. Then an ``append`` or ``add`` record. A
  failed append taints the chunk (bytes past its recorded length are garbage), so the
  next append starts a new chunk. ``new_chunk=True`` forces a new chunk (a metadata
  snapshot starts one, so that truncation later drops whole chunks).
* **truncate**: a ``truncate`` record first; then the chunks wholly before the new start
  are deleted (an owner check first: a fenced instance deletes nothing). Once the record
  is durable the truncate has happened: a delete that fails is retried before the next
  change, not reported (the chunks are garbage either way; a boot removes them too).

Reads (``read_range``, a free function) take the layout, so restore reads a replayed
layout with the same code. All changes run under the journal's lock: one group.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from slts.bindings.base import ChunkHandle, ChunkStorage
from slts.journal import system_names
from slts.journal.journal import SystemJournal
from slts.journal.system_layout import ADD, APPEND, TRUNCATE, SystemSegmentLayout

from slts.errors import ChunkInvalidOffset, ChunkNotFound, ChunkStorageError, InvalidOffset, MetadataCorrupted

READ_PIECE_BYTES = 8 << 20


class SystemSegments:
    """Append, truncate and read the system segments of one container instance."""

    def __init__(self, journal: SystemJournal, rolling_bytes: int, fence_check: Callable[[], None]) -> None:
        assert rolling_bytes > 0
        self.journal = journal
        self.binding = journal.binding
        self.rolling_bytes = rolling_bytes
        self._fence_check = fence_check
        self._own: set[str] = set()  # chunks this instance created and may append to
        self._undeleted: set[str] = set()  # dropped by a durable truncate, delete failed: retried

    @property
    def lock(self) -> Any:
        return self.journal.lock

    def layout(self, segment: str) -> SystemSegmentLayout:
        """A copy of ``segment``'s current layout."""
        with self.lock:
            self.journal.ensure_ready()
            return self.journal.layout.segment(segment).copy()

    def append(
        self, segment: str, data: bytes, attrs: dict[str, int] | None = None, *, new_chunk: bool = False
    ) -> int:
        """Append ``data`` durably; return the segment offset it starts at.

        ``attrs`` are stored with the record. Raises ``ChunkStorageError`` (nothing
        recorded; an orphan chunk may remain and is removed at a later boot).
        """
        assert data, "appending nothing"
        with self.lock:
            self.journal.ensure_ready()
            self._retry_deletes()
            layout = self.journal.layout.segment(segment)
            offset, last = layout.length, layout.last_chunk
            extra = {"attrs": dict(attrs)} if attrs else {}
            if not new_chunk and self._appendable(last, len(data)):
                assert last is not None
                # Tainted from here until its record is durable: if the write or the record
                # fails, bytes past the recorded length may be there; never append again.
                self._own.discard(last.name)
                self.binding.write(self.binding.open_write(last.name), last.length, data)
                self.journal.write(
                    {
                        "k": APPEND,
                        "seg": segment,
                        "chunk": last.name,
                        "offset": offset,
                        "length": len(data),
                        **extra,
                    }
                )
                self._own.add(last.name)
                return offset
            else:
                name = system_names.system_chunk(
                    self.journal.container_id, segment, self.journal.epoch, offset
                )
                self.binding.create(name, data)
                self._own.add(name)
                record = {
                    "k": ADD,
                    "seg": segment,
                    "chunk": name,
                    "offset": offset,
                    "prev": last.name if last else None,
                    "length": len(data),
                }
            self.journal.write({**record, **extra})
            return offset

    def _retry_deletes(self) -> None:
        """Delete again the chunks whose delete failed after a durable truncate (lock held)."""
        for name in sorted(self._undeleted):
            try:
                self._fence_check()
                with contextlib.suppress(ChunkNotFound):
                    self.binding.delete(ChunkHandle(name, readonly=False))
            except ChunkStorageError:
                return  # still failing: next time
            self._undeleted.discard(name)

    def _appendable(self, last: Any, size: int) -> bool:
        return (
            self.binding.supports_append
            and last is not None
            and last.name in self._own
            and last.length + size <= self.rolling_bytes
        )

    def truncate(self, segment: str, offset: int, attrs: dict[str, int] | None = None) -> None:
        """Move ``segment``'s start to ``offset`` (``start <= offset <= length``) and delete
        the chunks wholly before it. ``attrs`` are stored with the record."""
        with self.lock:
            self.journal.ensure_ready()
            self._retry_deletes()
            layout = self.journal.layout.segment(segment)
            if not layout.start_offset <= offset <= layout.length:
                raise InvalidOffset(
                    f"truncate {segment!r} to {offset}: outside [{layout.start_offset}, {layout.length}]",
                    segment=segment,
                )
            chunks = layout.chunks
            holder = next((c for c in chunks if c.start <= offset < c.end), layout.last_chunk)
            dropped = [c.name for c in chunks if holder is not None and c.end <= holder.start]
            record: dict[str, Any] = {
                "k": TRUNCATE,
                "seg": segment,
                "chunk": holder.name if holder else "",
                "start": offset,
            }
            if attrs:
                record["attrs"] = dict(attrs)
            self.journal.write(record)
            if dropped:
                self._fence_check()
                for name in dropped:
                    self._own.discard(name)
                    self._undeleted.add(name)
                self._retry_deletes()

    def read(self, segment: str, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset + length)`` of ``segment`` (within its readable range)."""
        return read_range(self.binding, self.layout(segment), offset, offset + length)


def read_range(binding: ChunkStorage, layout: SystemSegmentLayout, start: int, stop: int) -> bytes:
    """Bytes ``[start, stop)`` of a system segment with ``layout``.

    Raises ``InvalidOffset`` outside ``[start_offset, length]``, ``MetadataCorrupted`` if
    a chunk holds fewer bytes than its layout says, ``ChunkNotFound`` if one is missing.
    """
    return b"".join(iter_range(binding, layout, start, stop))


def iter_range(
    binding: ChunkStorage,
    layout: SystemSegmentLayout,
    start: int,
    stop: int,
    piece_bytes: int = READ_PIECE_BYTES,
    *,
    views: bool = False,
) -> Iterator[bytes | memoryview]:
    """``read_range`` as pieces of at most ``piece_bytes``, for streaming large segments.

    ``views``: the pieces are read-only memoryviews (``ChunkStorage.read_view``): on a
    binding that maps its objects, each chunk's range is one view of the mapping, read
    without a copy (``piece_bytes`` does not apply: nothing is held in memory)."""
    if views:
        yield from _iter_range_views(binding, layout, start, stop, piece_bytes)
        return
    if not layout.start_offset <= start <= stop <= layout.length:
        raise InvalidOffset(
            f"system segment {layout.name!r}: range [{start}, {stop}) outside "
            f"[{layout.start_offset}, {layout.length})",
            segment=layout.name,
        )
    for chunk in layout.chunks:
        lo, hi = max(start, chunk.start), min(stop, chunk.end)
        if lo >= hi:
            continue
        handle = binding.open_read(chunk.name)
        while lo < hi:
            size = min(piece_bytes, hi - lo)
            data = binding.read(handle, lo - chunk.start, size)
            if len(data) != size:
                raise MetadataCorrupted(
                    f"system chunk {chunk.name!r} holds fewer bytes than its journaled length {chunk.length}",
                    chunk=chunk.name,
                )
            yield data
            lo += size


def _iter_range_views(
    binding: ChunkStorage, layout: SystemSegmentLayout, start: int, stop: int, piece_bytes: int
) -> Iterator[memoryview]:
    """``iter_range(..., views=True)``: the same checks and errors, memoryview pieces."""
    if not layout.start_offset <= start <= stop <= layout.length:
        raise InvalidOffset(
            f"system segment {layout.name!r}: range [{start}, {stop}) outside "
            f"[{layout.start_offset}, {layout.length})",
            segment=layout.name,
        )
    if binding.maps_reads:
        piece_bytes = max(piece_bytes, stop - start)
    for chunk in layout.chunks:
        lo, hi = max(start, chunk.start), min(stop, chunk.end)
        if lo >= hi:
            continue
        handle = ChunkHandle(chunk.name, readonly=True)
        while lo < hi:
            size = min(piece_bytes, hi - lo)
            try:
                data = binding.read_view(handle, lo - chunk.start, size)
            except ChunkInvalidOffset as exc:  # a mapping shorter than the range
                raise _short(chunk.name, chunk.length) from exc
            if len(data) != size:
                raise _short(chunk.name, chunk.length)
            yield data
            lo += size


def _short(chunk: str, length: int) -> MetadataCorrupted:
    return MetadataCorrupted(
        f"system chunk {chunk!r} holds fewer bytes than its journaled length {length}", chunk=chunk
    )
