"""A partition's remote metadata in memory, checked against the store before each use:
what a fetch asks the RLMM (the log start offset, the segment holding an offset) without
a read transaction when nothing changed.

A fetch asks two things of the RLMM: the partition's log start offset and the
COPY_SEGMENT_FINISHED segment holding its offset. Answered from LMDB they cost a read
transaction each, a ``floor`` in the epoch's offset map and a segment record decoded,
several times a fetch's own read of the bytes. Yet a partition's remote metadata changes
only when a segment finishes copying or starts or finishes deleting, when retention moves
the log start offset, and when the partition is marked or forgotten; every such commit
writes the partition's record (``slts.remote.rlmm``), and a record's version is the
store-wide sequence of the commit that wrote it, never reused (no ABA, even after the
partition is forgotten and added again).

So a ``PartitionView`` is the partition's record at one version, plus what lookups learned
at that version: per leader epoch, intervals ``[start, next start)`` of the epoch's offset
map, each the range of offsets whose ``floor`` is the entry at ``start`` (whose segment is
kept with it). A lookup inside a learned interval is a ``bisect``; outside, it reads the
map in one snapshot (the floor entry, the entry after it, the segment) and learns the
interval, if the snapshot still holds the view's version.

Invariants:

* A view is served only if the partition record's version in the store equals the view's
  version as of a moment after the caller's call began (``PartitionViews.view``): the
  store's change marker unchanged since the view was last checked (no commit by anyone
  since), or else one read of the record (the metadata cache drops what other processes
  changed). A stale view is never served across another instance's or process's commit.
* Everything a view holds was read at its version: an interval is learned only from a
  snapshot whose partition record has that version.
* Intervals of one epoch do not overlap and each maps exactly the offsets whose floor
  entry is its start; a lookup answers as ``RemoteLogMetadataManager.segment_for_offset``
  (the general path) would at the view's version (tests compare both under random
  operations).
* A partition marked for deletion is not viewed: forgetting a large partition deletes its
  offset maps in several commits before its record (``rlmm.FORGET_COMMIT_ITEMS``), so its
  record's version does not cover them. Its lookups go to the store.
* Bounded: at most ``VIEWS_MAX`` views (all dropped when full), at most
  ``INTERVALS_MAX`` intervals per view (an epoch's intervals dropped when its table is
  full), and about ``INTERVALS_TOTAL_MAX`` in all (every view dropped when they pass it:
  each interval keeps a segment's metadata, about half a KiB).
"""

from __future__ import annotations

import threading
from bisect import bisect_right

from slts.metadata.schema import REMOTE_EPOCHS, REMOTE_PARTITIONS, REMOTE_SEGMENTS
from slts.metadata.store import MetadataStore, ReadView, prefix_stop
from slts.remote import keys
from slts.remote.records import OFFSET_MAX, RemoteLogSegmentMetadata, RemotePartitionRecord, TopicPartition

#: Partitions viewed at once by one RLMM (all views are dropped when one more is needed).
VIEWS_MAX = 4096
#: Intervals learned per view (an epoch's are dropped when its table would pass it).
INTERVALS_MAX = 4096
#: Intervals learned by all the views of one RLMM (all views are dropped past it).
INTERVALS_TOTAL_MAX = 65536


class _Budget:
    """The intervals learned by the views of one ``PartitionViews``."""

    __slots__ = ("learned", "lock")

    def __init__(self) -> None:
        self.learned = 0
        self.lock = threading.Lock()

    def add(self, count: int) -> None:
        with self.lock:
            self.learned += count


class StaleView(Exception):
    """A view's record changed in the store under a lookup (internal: the RLMM looks again
    through a fresh view or the store)."""


class _Intervals:
    """One epoch's learned intervals, replaced whole on each change (copy on write:
    lookups read them without a lock): ``[starts[i], nexts[i])`` are the offsets whose
    floor entry is ``segments[i]``'s, of which those below ``ends[i]`` lie in its part of
    the epoch (the lookup's answer; the rest have none)."""

    __slots__ = ("ends", "nexts", "segments", "starts")

    def __init__(
        self, starts: list[int], nexts: list[int], ends: list[int], segments: list[RemoteLogSegmentMetadata]
    ) -> None:
        assert len(starts) == len(nexts) == len(ends) == len(segments)
        self.starts, self.nexts, self.ends, self.segments = starts, nexts, ends, segments


_EMPTY = _Intervals([], [], [], [])


class PartitionView:
    """``tp``'s partition record at ``version``, and the offset-map intervals learned at it."""

    __slots__ = (
        "_budget",
        "_epochs",
        "_learned",
        "_lock",
        "_spans",
        "_store",
        "key",
        "marker",
        "record",
        "tp",
        "version",
    )

    def __init__(
        self,
        store: MetadataStore,
        tp: TopicPartition,
        key: bytes,
        record: RemotePartitionRecord,
        version: int,
        marker: object,
        budget: _Budget,
    ) -> None:
        self._store = store
        self._budget = budget
        self.tp, self.key, self.record, self.version = tp, key, record, version
        #: The store's change marker when the view was last found current.
        self.marker = marker
        self._epochs: dict[int, _Intervals] = {}
        self._learned = 0
        self._lock = threading.Lock()
        #: (epoch, lowest start, highest offset) of every epoch, newest first.
        self._spans = sorted(
            (
                (epoch, record.lowest_offsets[epoch], highest)
                for epoch, highest in record.highest_offsets.items()
            ),
            reverse=True,
        )

    def segment_for_offset(
        self, offset: int, leader_epoch: int | None = None
    ) -> RemoteLogSegmentMetadata | None:
        """``RemoteLogMetadataManager.segment_for_offset`` at the view's version (arguments
        checked by the caller). Raises ``StaleView`` if a lookup it had to make in the
        store found the record changed."""
        if leader_epoch is not None:
            return self._in_epoch(leader_epoch, offset)
        for epoch, lowest, highest in self._spans:  # the epochs whose copied range can hold it
            if lowest <= offset <= highest:
                found = self._in_epoch(epoch, offset)
                if found is not None:
                    return found
        return None

    def _in_epoch(self, epoch: int, offset: int) -> RemoteLogSegmentMetadata | None:
        """The segment of ``epoch``'s map entry with the greatest start <= ``offset``, if
        ``offset`` lies in that segment's part of the epoch."""
        table = self._epochs.get(epoch, _EMPTY)
        at = bisect_right(table.starts, offset) - 1
        if at >= 0 and offset < table.nexts[at]:
            return table.segments[at] if offset < table.ends[at] else None
        with self._store.snapshot() as view:
            stored = view.get(REMOTE_PARTITIONS, self.key)
            if stored is None or stored.version != self.version:
                raise StaleView(self.tp)
            found = floor_entry(view, self.tp, epoch, offset)
        if found is None:
            return None
        start, following, segment = found
        end = min(following, segment.epoch_end_offset(epoch) + 1)
        self._learn(epoch, start, following, end, segment)
        return segment if offset < end else None

    def _learn(
        self, epoch: int, start: int, following: int, end: int, segment: RemoteLogSegmentMetadata
    ) -> None:
        with self._lock:
            table = self._epochs.get(epoch, _EMPTY)
            at = bisect_right(table.starts, start)
            if at and table.starts[at - 1] == start:
                return  # another thread learned it
            learned = self._learned
            if learned >= INTERVALS_MAX:
                learned -= len(table.starts)
                table = _EMPTY
                at = 0
                if learned >= INTERVALS_MAX:  # the other epochs hold them all
                    self._epochs.clear()
                    learned = 0
            self._epochs[epoch] = _Intervals(
                [*table.starts[:at], start, *table.starts[at:]],
                [*table.nexts[:at], following, *table.nexts[at:]],
                [*table.ends[:at], end, *table.ends[at:]],
                [*table.segments[:at], segment, *table.segments[at:]],
            )
            learned += 1
            assert 0 < learned <= INTERVALS_MAX, learned
            self._budget.add(learned - self._learned)
            self._learned = learned


class PartitionViews:
    """The views of one RLMM's partitions (see module doc); thread-safe."""

    def __init__(self, store: MetadataStore) -> None:
        self._store = store
        self._views: dict[TopicPartition, PartitionView] = {}
        self._budget = _Budget()

    def view(self, tp: TopicPartition) -> PartitionView | None:
        """``tp``'s current view; None if the partition is unknown or marked for deletion
        (its lookups go to the store). The store's change marker is read first: a view
        checked at an equal marker is current (no commit since); otherwise the record's
        version decides, read after the marker (so any later commit moves the marker
        again, and the next call checks again)."""
        marker = self._store.change_marker
        if self._budget.learned > INTERVALS_TOTAL_MAX:
            self._drop_all()
        known = self._views.get(tp)
        if known is not None and known.marker == marker:
            return known
        key = keys.partition_key(tp)
        stored = self._store.get(REMOTE_PARTITIONS, key)
        if stored is None:
            self._views.pop(tp, None)
            return None
        if known is not None and known.version == stored.version:
            known.marker = marker
            return known
        record = RemotePartitionRecord.decode(stored.value)
        if record.delete_state is not None:
            self._views.pop(tp, None)
            return None
        fresh = PartitionView(self._store, tp, key, record, stored.version, marker, self._budget)
        if len(self._views) >= VIEWS_MAX:
            self._drop_all()
        self._views[tp] = fresh
        return fresh

    def forget(self, tp: TopicPartition) -> None:
        """Drop ``tp``'s view (it was found stale)."""
        self._views.pop(tp, None)

    def _drop_all(self) -> None:
        """Drop every view and start a new count (a view a lookup still holds counts in
        the old one until it is let go). Views dropped one by one stay counted: the count
        errs towards dropping sooner."""
        self._views.clear()
        self._budget = _Budget()

    def __len__(self) -> int:
        return len(self._views)


def floor_entry(
    view: ReadView, tp: TopicPartition, epoch: int, offset: int
) -> tuple[int, int, RemoteLogSegmentMetadata] | None:
    """(start, next start, segment) of the entry of ``epoch``'s offset map whose start is
    the greatest <= ``offset`` (next start: the following entry's, ``OFFSET_MAX + 1`` if
    none), or None."""
    prefix = keys.epoch_prefix(tp, epoch)
    entry = view.floor(REMOTE_EPOCHS, keys.epoch_key(tp, epoch, offset), lowest=prefix)
    if entry is None:
        return None
    following = view.scan(REMOTE_EPOCHS, entry[0] + b"\x00", prefix_stop(prefix), limit=1)
    stored = view.get(REMOTE_SEGMENTS, entry[1].value)
    assert stored is not None, f"the offset map of {tp} epoch {epoch} names a forgotten segment"
    start = keys.epoch_key_offset(entry[0])
    after = keys.epoch_key_offset(following[0][0]) if following else OFFSET_MAX + 1
    assert start < after, (start, after)
    return start, after, RemoteLogSegmentMetadata.decode(stored.value)
