"""The remote log metadata manager (KIP-405 RLMM) on the container's metadata store.

Kafka keeps this metadata in an internal topic and rebuilds a cache from it; SLTS keeps
it in tables of the container's own metadata store (``slts/remote/keys.py``), so:

* every change is one atomic, conditional commit through the instance's ownership (but
  forgetting a huge partition, see below): a fenced instance changes nothing
  (``Fenced``), a read-only one neither (``ReadOnlyInstance``), and an illegal state
  change raises ``IllegalStateTransition`` with nothing changed;
* it is strongly consistent: a lookup after a change returns sees it, from this instance
  and from a read-only *follower* instance on the same store;
* it is part of the metadata log and snapshots on tier-2, so ``slts restore`` brings it
  back with the segments it describes.

Semantics follow Kafka's implementation (``RemoteLogMetadataCache``,
``RemoteLogLeaderEpochState``, ``RemotePartitionMetadataStore``), not only the early KIP
text; where SLTS does more, Kafka's cases still hold:

* ``add_segment`` takes COPY_SEGMENT_STARTED records only and ``update_segment`` never
  takes COPY_SEGMENT_STARTED (``InvalidArgument``, whatever the segment's state). Every
  other change follows ``records.is_legal``; Kafka drops an illegal change silently, SLTS
  raises ``IllegalStateTransition``; in both nothing changed.
* ``segment_for_offset`` sees COPY_SEGMENT_FINISHED segments only; a segment mid-copy or
  mid-delete is invisible to readers.
* Per leader epoch, an offset map from the epoch's first offset in a segment to the
  segment. When a segment finishes copying, the entries of its epochs that start at or
  after its epoch start are dropped if it reaches at least as far as the epoch's highest
  copied offset (a new leader re-uploaded a superset after a leader change); otherwise it
  only takes its own start's entry. The dropped segments stay listed, so that retention
  deletes them. Under an epoch, the segment for an offset is the map's floor entry, if
  the offset is within that segment's part of the epoch (else none: no other entry is
  tried).
* ``highest_offset_for_epoch`` is the highest offset ever copied in that epoch; deletes do
  not lower it.
* Listings return every segment not DELETE_SEGMENT_FINISHED (STARTED, DELETE_STARTED and
  superseded ones included, so that cleanup can find them), sorted by start offset (ties
  by id); with a leader epoch, those that hold the epoch (Kafka lists the same, except a
  segment whose map entry a shorter upload at the same epoch start replaced).
* Every lookup of a partition (``segment_for_offset``, ``earliest_offset``,
  ``log_start_offset``, ``highest_offset_for_epoch``, ``highest_offset``,
  ``leader_epochs``, ``list_segments``, ``delete_state``) raises ``RemoteSegmentNotFound``
  naming the partition if no segment of it was ever added or the partition was forgotten
  (Kafka's "no resource found for partition"); ``has_partition`` asks first.
* DELETE_PARTITION_FINISHED forgets the partition whatever remains of it: its segment
  records, offset maps, listing entries and its own record, in one commit (in several of
  at most ``FORGET_COMMIT_ITEMS`` for a huge partition, the partition record last: a
  repeat after a crash carries on). Its name can be used again.

Offset lookups are O(log n): one ``floor`` in the given epoch's map or, without an epoch,
one per epoch whose copied range (lowest start to highest offset, kept in the partition
record) spans the offset: one in a clean lineage, a few after unclean elections.

A fetch asks through ``view(tp)`` and ``segment_in_view`` instead
(``slts.remote.partition_views``): the partition record and the offset-map intervals
lookups learned, kept in memory while the store's change marker, else the record's
version, says nothing changed; the answers are the same, a stale view is never served.

Two start offsets:

* ``log_start_offset`` is the stored floor of the remote log: set by the first segment
  copied, moved forward only (``move_log_start_offset``: retention moves it before it
  deletes), never back; None before any copy.
* ``earliest_offset`` is where the remote log can be read from: the log start offset if a
  readable offset lies at or after it, i.e. some epoch's last map entry (a
  COPY_SEGMENT_FINISHED segment that lookups resolve to) reaches it within that epoch;
  else None (nothing remote to read: every segment was deleted, or all end below it).
  One ``floor`` per epoch whose highest copied offset reaches the log start offset.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from slts.errors import IllegalStateTransition, InvalidArgument, ReadOnlyInstance, RemoteSegmentNotFound
from slts.metadata.schema import REMOTE_EPOCHS, REMOTE_OFFSETS, REMOTE_PARTITIONS, REMOTE_SEGMENTS
from slts.metadata.store import Delete, Expect, Operation, Put, ReadView, prefix_stop, scan_all
from slts.remote import keys
from slts.remote.partition_views import PartitionView, PartitionViews, StaleView
from slts.remote.records import (
    OFFSET_MAX,
    PartitionDeleteState,
    RemoteLogSegmentMetadata,
    RemotePartitionRecord,
    SegmentState,
    TopicPartition,
    check_epoch,
    check_offset,
    check_partition_transition,
    check_transition,
)
from slts.storage.chunked import ChunkedSegmentStorage

#: Entries read per page of a streamed listing (each page is one consistent read).
LIST_PAGE = 256
#: Decoded partition records kept (see ``_partition``); the memo is cleared when full.
DECODED_PARTITIONS_MAX = 4096
#: The most records one commit of DELETE_PARTITION_FINISHED deletes (a partition with more
#: is forgotten in several commits, its own record last).
FORGET_COMMIT_ITEMS = 30_000


@dataclass(frozen=True, slots=True)
class _Partition:
    """A partition record as read (None: never seen) with its version (0: absent)."""

    record: RemotePartitionRecord | None
    version: int


class RemoteLogMetadataManager:
    """KIP-405's RLMM for the container of ``storage`` (an owner or a read-only instance).

    Thread-safe: changes of one partition are serialised by a lock and, across
    processes, by conditional commits (a lost race is retried, at most
    ``commit_retries_max`` times).
    """

    def __init__(self, storage: ChunkedSegmentStorage) -> None:
        if not isinstance(storage, ChunkedSegmentStorage):
            raise InvalidArgument(f"{storage!r} is not a ChunkedSegmentStorage")
        self._ctx = storage.context
        self._store = storage.context.store
        self._decoded: dict[bytes, tuple[bytes, RemotePartitionRecord]] = {}
        self._views = PartitionViews(self._store)

    # -- changes ---------------------------------------------------------------------------------

    def add_segment(self, metadata: RemoteLogSegmentMetadata) -> None:
        """Record a new upload in COPY_SEGMENT_STARTED (``records.new_segment_metadata``).

        Idempotent for the identical record. Raises ``InvalidArgument`` (not a
        COPY_SEGMENT_STARTED record), ``IllegalStateTransition`` (the id exists with other
        content or state, or the partition is marked for deletion), ``Fenced``,
        ``ReadOnlyInstance``. Nothing changes on error.
        """
        if not isinstance(metadata, RemoteLogSegmentMetadata):
            raise InvalidArgument(f"{metadata!r} is not a RemoteLogSegmentMetadata")
        if metadata.state != SegmentState.COPY_SEGMENT_STARTED:
            raise InvalidArgument(
                f"remote segment {metadata.id} of {metadata.topic_partition}: a new segment is added "
                f"in COPY_SEGMENT_STARTED, not {SegmentState(metadata.state).name}"
            )
        tp = metadata.topic_partition

        def attempt() -> None:
            with self._store.snapshot() as view:
                existing = view.get(REMOTE_SEGMENTS, metadata.segment_id)
                partition = self._partition(view, tp)
            if existing is not None:
                self._check_writer()
                if RemoteLogSegmentMetadata.decode(existing.value) == metadata:
                    return
                raise IllegalStateTransition(
                    f"remote segment {metadata.id} of {tp} exists with other content or state",
                    segment=str(metadata.id),
                    partition=str(tp),
                )
            self._check_not_deleted(tp, partition)
            ops: list[Operation] = [
                Put(REMOTE_SEGMENTS, metadata.segment_id, metadata.encode()),
                Put(REMOTE_OFFSETS, keys.offsets_key(tp, metadata.start_offset, metadata.segment_id), b""),
            ]
            if partition.record is None:
                ops.append(Put(REMOTE_PARTITIONS, keys.partition_key(tp), _new_partition(tp).encode()))
            self._ctx.ownership.commit(
                ops,
                [
                    Expect(REMOTE_SEGMENTS, metadata.segment_id, 0),
                    Expect(REMOTE_PARTITIONS, keys.partition_key(tp), partition.version),
                ],
            )

        with self._ctx.locks.exclusive(_lock_name(tp)):
            self._ctx.retry_conflicts(attempt)

    def update_segment(
        self,
        segment_id: uuid.UUID,
        state: SegmentState,
        *,
        event_timestamp_ms: int | None = None,
        custom_metadata: bytes | None = None,
    ) -> RemoteLogSegmentMetadata:
        """Move segment ``segment_id`` to ``state``; return its new metadata.

        COPY_SEGMENT_FINISHED makes it visible to offset lookups (superseding, per epoch,
        the segments it covers), DELETE_SEGMENT_STARTED hides it again, and
        DELETE_SEGMENT_FINISHED forgets it. A change to the current state changes nothing
        (retries are safe). Raises ``InvalidArgument`` (also for COPY_SEGMENT_STARTED,
        whatever the segment's state: a segment enters it through ``add_segment`` only),
        ``RemoteSegmentNotFound``, ``IllegalStateTransition`` (state unchanged),
        ``Fenced``, ``ReadOnlyInstance``.
        """
        if not isinstance(segment_id, uuid.UUID):
            raise InvalidArgument(f"segment id {segment_id!r} is not a uuid.UUID")
        if not isinstance(state, SegmentState):
            raise InvalidArgument(f"state {state!r} is not a SegmentState")
        if state == SegmentState.COPY_SEGMENT_STARTED:
            raise InvalidArgument(
                f"remote segment {segment_id}: no update to COPY_SEGMENT_STARTED "
                "(add_segment records a new upload)"
            )
        if event_timestamp_ms is not None and (
            isinstance(event_timestamp_ms, bool)
            or not isinstance(event_timestamp_ms, int)
            or event_timestamp_ms < 0
        ):
            raise InvalidArgument(f"event timestamp {event_timestamp_ms!r} is not a time in ms")
        if custom_metadata is not None and not isinstance(custom_metadata, bytes):
            raise InvalidArgument("custom metadata must be bytes")
        current = self.segment(segment_id)
        tp = current.topic_partition

        def attempt() -> RemoteLogSegmentMetadata:
            with self._store.snapshot() as view:
                stored = view.get(REMOTE_SEGMENTS, segment_id.bytes)
                if stored is None:
                    raise RemoteSegmentNotFound(f"no remote segment {segment_id}", segment=str(segment_id))
                existing = RemoteLogSegmentMetadata.decode(stored.value)
                check_transition(existing.segment_state, state, what=f"remote segment {segment_id} of {tp}")
                if existing.state == state:
                    self._check_writer()
                    return existing
                changes: dict[str, object] = {"state": int(state)}
                if event_timestamp_ms is not None:
                    changes["event_timestamp_ms"] = event_timestamp_ms
                if custom_metadata is not None:
                    changes["custom_metadata"] = custom_metadata
                updated = existing.replace(**changes)
                partition = self._partition(view, tp)
                assert partition.record is not None, f"segment {segment_id} has no partition record"
                ops, record = _state_change_ops(view, updated, partition.record)
            ops.append(Put(REMOTE_PARTITIONS, keys.partition_key(tp), record.encode()))
            self._ctx.ownership.commit(
                ops,
                [
                    Expect(REMOTE_SEGMENTS, segment_id.bytes, stored.version),
                    Expect(REMOTE_PARTITIONS, keys.partition_key(tp), partition.version),
                ],
            )
            return updated

        with self._ctx.locks.exclusive(_lock_name(tp)):
            return self._ctx.retry_conflicts(attempt)

    def move_log_start_offset(self, tp: TopicPartition, offset: int) -> int:
        """Move ``tp``'s remote log start offset forward to ``offset`` (never back); return
        the start offset now in force. Retention calls this before it deletes segments,
        so that no reader is sent to a segment being deleted. Raises
        ``RemoteSegmentNotFound`` (unknown partition), ``InvalidArgument``, ``Fenced``,
        ``ReadOnlyInstance``."""
        _check_partition(tp)
        check_offset(offset, f"{tp}: log start offset")

        def attempt() -> int:
            with self._store.snapshot() as view:
                partition = self._partition(view, tp)
            record = self._known(tp, partition)
            self._check_writer()
            if record.log_start_offset is not None and record.log_start_offset >= offset:
                return record.log_start_offset
            self._ctx.ownership.commit(
                [
                    Put(
                        REMOTE_PARTITIONS,
                        keys.partition_key(tp),
                        record.replace(log_start_offset=offset).encode(),
                    )
                ],
                [Expect(REMOTE_PARTITIONS, keys.partition_key(tp), partition.version)],
            )
            return offset

        with self._ctx.locks.exclusive(_lock_name(tp)):
            return self._ctx.retry_conflicts(attempt)

    def mark_partition(self, tp: TopicPartition, state: PartitionDeleteState) -> None:
        """Move ``tp``'s deletion marker to ``state`` (MARKED -> STARTED -> FINISHED; a
        repeat of MARKED or STARTED changes nothing). While marked, no segment may be
        added. FINISHED forgets the partition whatever remains of it (Kafka's rule: the
        caller deletes the segments' data first): every segment record, offset-map and
        listing entry of it, and its own record, so that every lookup of it raises
        ``RemoteSegmentNotFound`` and its name may be used again. One commit, or for a
        partition of more than ``FORGET_COMMIT_ITEMS`` records several (offset maps
        first, then segments with their listing entries, the partition record last); a
        repeat after a crash between them carries on. Raises ``IllegalStateTransition``,
        ``RemoteSegmentNotFound`` (unknown or forgotten partition), ``InvalidArgument``,
        ``Fenced``, ``ReadOnlyInstance``."""
        _check_partition(tp)
        if not isinstance(state, PartitionDeleteState):
            raise InvalidArgument(f"state {state!r} is not a PartitionDeleteState")
        key = keys.partition_key(tp)
        finish = state == PartitionDeleteState.DELETE_PARTITION_FINISHED

        def attempt() -> None:
            while True:
                with self._store.snapshot() as view:
                    partition = self._partition(view, tp)
                    record = self._known(tp, partition)
                    current = (
                        None if record.delete_state is None else PartitionDeleteState(record.delete_state)
                    )
                    check_partition_transition(current, state, what=f"remote partition {tp}")
                    ops, complete = _forget_ops(view, tp) if finish else ([], True)
                self._check_writer()
                if current == state:
                    return
                if not finish:
                    ops.append(Put(REMOTE_PARTITIONS, key, record.replace(delete_state=int(state)).encode()))
                elif complete:
                    ops.append(Delete(REMOTE_PARTITIONS, key))
                self._ctx.ownership.commit(ops, [Expect(REMOTE_PARTITIONS, key, partition.version)])
                if complete:
                    return

        with self._ctx.locks.exclusive(_lock_name(tp)):
            self._ctx.retry_conflicts(attempt)

    # -- lookups ---------------------------------------------------------------------------------

    def segment(self, segment_id: uuid.UUID) -> RemoteLogSegmentMetadata:
        """The metadata of ``segment_id`` (any state but DELETE_SEGMENT_FINISHED, which is
        forgotten). Raises ``RemoteSegmentNotFound``, ``InvalidArgument``."""
        if not isinstance(segment_id, uuid.UUID):
            raise InvalidArgument(f"segment id {segment_id!r} is not a uuid.UUID")
        stored = self._store.get(REMOTE_SEGMENTS, segment_id.bytes)
        if stored is None:
            raise RemoteSegmentNotFound(f"no remote segment {segment_id}", segment=str(segment_id))
        return RemoteLogSegmentMetadata.decode(stored.value)

    def has_partition(self, tp: TopicPartition) -> bool:
        """Whether ``tp`` is known: a segment of it was added and the partition was not
        forgotten since (DELETE_PARTITION_FINISHED). Raises ``InvalidArgument``."""
        _check_partition(tp)
        return self._store.get(REMOTE_PARTITIONS, keys.partition_key(tp)) is not None

    def segment_for_offset(
        self, tp: TopicPartition, offset: int, leader_epoch: int | None = None
    ) -> RemoteLogSegmentMetadata | None:
        """The COPY_SEGMENT_FINISHED segment of ``tp`` holding ``offset``, or None.

        With ``leader_epoch``: Kafka's lookup, the floor entry of that epoch's offset map,
        if ``offset`` is within that segment's part of the epoch (else None: below the
        map's first entry, or past the floor segment's end in that epoch). Without: the
        newest epoch whose map has a segment with ``offset`` in that epoch's range (after
        a leader change, the new leader's upload wins), trying only the epochs whose
        copied range (lowest start .. highest offset) spans ``offset``: O(log n) per such
        epoch, usually one. Does not check the log start offset (``earliest_offset``): the
        remote log manager does. Raises ``RemoteSegmentNotFound`` (unknown partition),
        ``InvalidArgument``.
        """
        _check_partition(tp)
        check_offset(offset, f"{tp}: offset")
        if leader_epoch is not None:
            check_epoch(leader_epoch)
        with self._store.snapshot() as view:
            record = self._known(tp, self._partition(view, tp))
            epochs: Sequence[int] = (
                [leader_epoch] if leader_epoch is not None else _epochs_spanning(record, offset)
            )
            for epoch in epochs:
                found = _floor_segment(view, tp, epoch, offset)
                if found is not None and offset <= found.epoch_end_offset(epoch):
                    return found
        return None

    def view(self, tp: TopicPartition) -> PartitionView | None:
        """``tp``'s record and lookups in memory, current as of this call
        (``slts.remote.partition_views``: checked by the store's change marker, else by the
        record's version); None if the partition is unknown or marked for deletion (ask
        the store). A fetch takes its log start offset from ``view.record`` and its
        segments from ``segment_in_view``. Raises ``InvalidArgument``."""
        _check_partition(tp)
        return self._views.view(tp)

    def segment_in_view(
        self, view: PartitionView, offset: int, leader_epoch: int | None = None
    ) -> RemoteLogSegmentMetadata | None:
        """``segment_for_offset`` answered by ``view`` (arguments checked by the caller):
        from what it learned, else from one snapshot at its version; if that version is
        gone from the store meanwhile, from the store as it is now (``RemoteSegmentNotFound``
        if the partition was forgotten)."""
        try:
            return view.segment_for_offset(offset, leader_epoch)
        except StaleView:
            self._views.forget(view.tp)
            return self.segment_for_offset(view.tp, offset, leader_epoch)

    def is_referenced(self, metadata: RemoteLogSegmentMetadata) -> bool:
        """Whether a COPY_SEGMENT_FINISHED segment still serves lookups under any of its
        epochs (False: a later upload superseded it everywhere, it is not finished, or
        its partition was forgotten). Raises ``InvalidArgument``."""
        if not isinstance(metadata, RemoteLogSegmentMetadata):
            raise InvalidArgument(f"{metadata!r} is not a RemoteLogSegmentMetadata")
        tp = metadata.topic_partition
        with self._store.snapshot() as view:
            for epoch, start in metadata.leader_epochs.items():
                mapped = view.get(REMOTE_EPOCHS, keys.epoch_key(tp, epoch, start))
                if mapped is not None and mapped.value == metadata.segment_id:
                    return True
        return False

    def earliest_offset(self, tp: TopicPartition) -> int | None:
        """Where ``tp``'s remote log can be read from: its log start offset if some
        COPY_SEGMENT_FINISHED segment that lookups resolve to reaches it (see the module
        doc), else None (nothing copied yet, or nothing left to read at or after it).
        Raises ``RemoteSegmentNotFound`` (unknown partition), ``InvalidArgument``."""
        _check_partition(tp)
        with self._store.snapshot() as view:
            record = self._known(tp, self._partition(view, tp))
            start = record.log_start_offset
            if start is None:
                return None
            for epoch in sorted(record.highest_offsets, reverse=True):
                if record.highest_offsets[epoch] < start:
                    continue  # nothing of this epoch ever reached the start
                last = _floor_segment(view, tp, epoch, OFFSET_MAX)
                if last is not None and last.epoch_end_offset(epoch) >= start:
                    return start
        return None

    def log_start_offset(self, tp: TopicPartition) -> int | None:
        """``tp``'s stored remote log start offset: set by the first segment copied, moved
        forward only (``move_log_start_offset``); None before any copy. Unlike
        ``earliest_offset`` it stays when nothing is left to read. Raises
        ``RemoteSegmentNotFound`` (unknown partition), ``InvalidArgument``."""
        _check_partition(tp)
        return self._known(tp, self._read_partition(tp)).log_start_offset

    def highest_offset_for_epoch(self, tp: TopicPartition, leader_epoch: int) -> int | None:
        """The highest offset copied under ``leader_epoch`` (None: none; deletes do not
        lower it). Raises ``RemoteSegmentNotFound`` (unknown partition), ``InvalidArgument``."""
        _check_partition(tp)
        check_epoch(leader_epoch)
        return self._known(tp, self._read_partition(tp)).highest_offsets.get(leader_epoch)

    def highest_offset(self, tp: TopicPartition) -> int | None:
        """The highest offset copied in any epoch (None: none; deletes do not lower it).
        Raises ``RemoteSegmentNotFound`` (unknown partition), ``InvalidArgument``."""
        _check_partition(tp)
        record = self._known(tp, self._read_partition(tp))
        return max(record.highest_offsets.values()) if record.highest_offsets else None

    def leader_epochs(self, tp: TopicPartition) -> dict[int, int]:
        """Epoch -> highest offset copied in it, for every epoch of ``tp`` (ascending).
        Raises ``RemoteSegmentNotFound`` (unknown partition), ``InvalidArgument``."""
        _check_partition(tp)
        return dict(sorted(self._known(tp, self._read_partition(tp)).highest_offsets.items()))

    def delete_state(self, tp: TopicPartition) -> PartitionDeleteState | None:
        """``tp``'s deletion marker (None: not marked). Raises ``RemoteSegmentNotFound``
        (unknown partition, or forgotten: FINISHED), ``InvalidArgument``."""
        _check_partition(tp)
        record = self._known(tp, self._read_partition(tp))
        return None if record.delete_state is None else PartitionDeleteState(record.delete_state)

    def list_segments(
        self, tp: TopicPartition, min_offset: int = 0, *, leader_epoch: int | None = None
    ) -> Iterator[RemoteLogSegmentMetadata]:
        """Every segment of ``tp`` not DELETE_SEGMENT_FINISHED whose end offset is at least
        ``min_offset`` (and that holds ``leader_epoch``, if given), sorted by start offset
        (ties by id), streamed in pages of ``LIST_PAGE``; each page is one consistent
        read, so a listing running beside changes sees each page as of its own read (a
        partition forgotten meanwhile ends the listing). Raises ``InvalidArgument`` and
        ``RemoteSegmentNotFound`` (unknown partition) at the call, not at the first item."""
        _check_partition(tp)
        check_offset(min_offset, f"{tp}: minimum offset")
        if leader_epoch is not None:
            check_epoch(leader_epoch)
        self._known(tp, self._read_partition(tp))
        return self._list(tp, min_offset, leader_epoch)

    def partitions(self) -> Iterator[TopicPartition]:
        """Every partition with remote metadata, in key order (topic, then number)."""
        start = b""
        while True:
            page = self._store.scan(REMOTE_PARTITIONS, start, None, limit=LIST_PAGE)
            for key, _ in page:
                yield keys.partition_of(key)
            if len(page) < LIST_PAGE:
                return
            start = page[-1][0] + b"\x00"

    # -- helpers ---------------------------------------------------------------------------------

    def _list(
        self, tp: TopicPartition, min_offset: int, leader_epoch: int | None
    ) -> Iterator[RemoteLogSegmentMetadata]:
        prefix = keys.partition_key(tp)
        start, stop = prefix, prefix_stop(prefix)
        while True:
            with self._store.snapshot() as view:
                page = view.scan(REMOTE_OFFSETS, start, stop, limit=LIST_PAGE)
                found = [view.get(REMOTE_SEGMENTS, keys.offsets_key_id(key)) for key, _ in page]
            for stored in found:
                assert stored is not None, f"a listing entry of {tp} names no segment"
                metadata = RemoteLogSegmentMetadata.decode(stored.value)
                if metadata.end_offset >= min_offset and (
                    leader_epoch is None or leader_epoch in metadata.leader_epochs
                ):
                    yield metadata
            if len(page) < LIST_PAGE:
                return
            start = page[-1][0] + b"\x00"

    def _partition(self, view: ReadView, tp: TopicPartition) -> _Partition:
        key = keys.partition_key(tp)
        stored = view.get(REMOTE_PARTITIONS, key)
        if stored is None:
            return _Partition(None, 0)
        # Every lookup reads its partition's record (epochs' ranges, log start offset): the
        # decoded record is kept while the stored bytes are the same (compared whole).
        known = self._decoded.get(key)
        if known is not None and known[0] == stored.value:
            return _Partition(known[1], stored.version)
        record = RemotePartitionRecord.decode(stored.value)
        if len(self._decoded) >= DECODED_PARTITIONS_MAX:
            self._decoded.clear()
        self._decoded[key] = (bytes(stored.value), record)
        return _Partition(record, stored.version)

    def _read_partition(self, tp: TopicPartition) -> _Partition:
        with self._store.snapshot() as view:
            return self._partition(view, tp)

    def _known(self, tp: TopicPartition, partition: _Partition) -> RemotePartitionRecord:
        if partition.record is None:
            raise RemoteSegmentNotFound(
                f"no remote partition {tp}: no segment of it was added, or it was deleted",
                partition=str(tp),
            )
        return partition.record

    def _check_not_deleted(self, tp: TopicPartition, partition: _Partition) -> None:
        if partition.record is not None and partition.record.delete_state is not None:
            state = PartitionDeleteState(partition.record.delete_state).name
            raise IllegalStateTransition(
                f"remote partition {tp} is {state}: no new segments", partition=str(tp)
            )

    def _check_writer(self) -> None:
        """Before deciding that a change is a no-op: only the owner may be told so."""
        if self._ctx.ownership.read_only:
            raise ReadOnlyInstance(f"container {self._ctx.container_id} was opened read-only")
        self._ctx.ownership.check()


def _lock_name(tp: TopicPartition) -> str:
    return f"remote:{tp}"


def _check_partition(tp: object) -> None:
    if not isinstance(tp, TopicPartition):
        raise InvalidArgument(f"{tp!r} is not a TopicPartition")


def _new_partition(tp: TopicPartition) -> RemotePartitionRecord:
    return RemotePartitionRecord(
        tp.topic, tp.partition, log_start_offset=None, highest_offsets={}, lowest_offsets={}
    )


def _epochs_spanning(record: RemotePartitionRecord, offset: int) -> list[int]:
    """The epochs whose copied range can hold ``offset``, newest first."""
    return sorted(
        (
            epoch
            for epoch, highest in record.highest_offsets.items()
            if record.lowest_offsets[epoch] <= offset <= highest
        ),
        reverse=True,
    )


def _floor_segment(
    view: ReadView, tp: TopicPartition, epoch: int, offset: int
) -> RemoteLogSegmentMetadata | None:
    """The segment of ``epoch``'s offset map whose epoch start is the greatest <= ``offset``."""
    prefix = keys.epoch_prefix(tp, epoch)
    entry = view.floor(REMOTE_EPOCHS, keys.epoch_key(tp, epoch, offset), lowest=prefix)
    if entry is None:
        return None
    stored = view.get(REMOTE_SEGMENTS, entry[1].value)
    assert stored is not None, f"the offset map of {tp} epoch {epoch} names a forgotten segment"
    return RemoteLogSegmentMetadata.decode(stored.value)


def _state_change_ops(
    view: ReadView, updated: RemoteLogSegmentMetadata, partition: RemotePartitionRecord
) -> tuple[list[Operation], RemotePartitionRecord]:
    """The operations that move ``updated`` (already in its new state) into the tables,
    and the partition record after them."""
    tp = updated.topic_partition
    ops: list[Operation] = []
    state = updated.segment_state
    if state == SegmentState.COPY_SEGMENT_FINISHED:
        highest = dict(partition.highest_offsets)
        lowest = dict(partition.lowest_offsets)
        for epoch, start, end in updated.epoch_ranges():
            prefix = keys.epoch_prefix(tp, epoch)
            if highest.get(epoch, -1) <= end:  # it reaches as far as all before: they are superseded
                for key, _ in scan_all(
                    view, REMOTE_EPOCHS, keys.epoch_key(tp, epoch, start), prefix_stop(prefix)
                ):
                    ops.append(Delete(REMOTE_EPOCHS, key))
            ops.append(Put(REMOTE_EPOCHS, keys.epoch_key(tp, epoch, start), updated.segment_id))
            highest[epoch] = max(highest.get(epoch, -1), end)
            lowest[epoch] = min(lowest.get(epoch, start), start)
        start_offset = partition.log_start_offset
        partition = partition.replace(
            highest_offsets=highest,
            lowest_offsets=lowest,
            log_start_offset=updated.start_offset if start_offset is None else start_offset,
        )
        ops.append(Put(REMOTE_SEGMENTS, updated.segment_id, updated.encode()))
    elif state == SegmentState.DELETE_SEGMENT_STARTED:
        for epoch, start, _ in updated.epoch_ranges():
            key = keys.epoch_key(tp, epoch, start)
            mapped = view.get(REMOTE_EPOCHS, key)
            if mapped is not None and mapped.value == updated.segment_id:
                ops.append(Delete(REMOTE_EPOCHS, key))
        ops.append(Put(REMOTE_SEGMENTS, updated.segment_id, updated.encode()))
    else:
        assert state == SegmentState.DELETE_SEGMENT_FINISHED, state
        ops.append(Delete(REMOTE_SEGMENTS, updated.segment_id))
        ops.append(Delete(REMOTE_OFFSETS, keys.offsets_key(tp, updated.start_offset, updated.segment_id)))
    return ops, partition


def _forget_ops(view: ReadView, tp: TopicPartition) -> tuple[list[Operation], bool]:
    """The deletes of the next part of ``tp``'s records (at most ``FORGET_COMMIT_ITEMS``)
    and whether they are the rest of them. Offset-map entries go before any segment (an
    entry never names a forgotten segment), a segment with its listing entry."""
    prefix = keys.partition_key(tp)
    stop = prefix_stop(prefix)
    mapped = view.scan(REMOTE_EPOCHS, prefix, stop, limit=FORGET_COMMIT_ITEMS)
    ops: list[Operation] = [Delete(REMOTE_EPOCHS, key) for key, _ in mapped]
    if len(mapped) == FORGET_COMMIT_ITEMS:
        return ops, False
    room = max(1, (FORGET_COMMIT_ITEMS - len(mapped)) // 2)
    listed = view.scan(REMOTE_OFFSETS, prefix, stop, limit=room)
    for key, _ in listed:
        ops.append(Delete(REMOTE_OFFSETS, key))
        ops.append(Delete(REMOTE_SEGMENTS, keys.offsets_key_id(key)))
    return ops, len(listed) < room
