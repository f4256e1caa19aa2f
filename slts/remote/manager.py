"""The remote log manager (KIP-405 RLM): the copy, fetch and retention tasks, driven by
the engine that owns the local log, with Kafka's ``RemoteLogManager`` rules.

Kafka runs these as tasks per partition on the leader (copy, expiration) and serves
fetches from the remote tier. Here the engine calls them with a ``LocalLog`` snapshot
(``slts.remote.local_log``: its segments, leader-epoch cache, start, end and last stable
offsets):

* ``copy_rolled_segments(tp, log)``: the highest remote offset is found by walking the
  leader-epoch cache from its latest epoch back (``find_highest_remote_offset``: a
  remote segment of a diverged lineage does not count past the lineage's own epoch end);
  the candidates are the segments after it, never the active segment, whose *next*
  segment starts at or below the last stable offset. Each is optionally validated
  (``validate=True``, the default: every batch parses and passes its CRC, offsets lie in
  the segment, the indexes agree; bad files raise ``InvalidLogSegment`` and nothing of
  that segment is recorded), recorded COPY_SEGMENT_STARTED with end offset = the next
  segment's base - 1 and the cache's epochs in that range, copied by the RSM (exactly
  the bytes the snapshot holds: appends after it are not copied), recorded
  COPY_SEGMENT_FINISHED. A copy that fails is deleted at once (Kafka's "copy failed,
  cleaning segment"); a crash in between leaves a STARTED entry that the next run
  deletes (``cleanup``). Empty segments are skipped.
* ``fetch(tp, offset, max_bytes, leader_epochs=...)``: with the cache, the segment is the
  one of the epoch the cache gives for ``offset`` (Kafka's lookup: a diverged lineage is
  never served); without it, the newest epoch whose map holds the offset. Whole record
  batches from the batch holding ``offset``, continuing into later segments while
  ``max_bytes`` allows, up to the first batch the cache's lineage does not hold (another
  leader's, past an unclean election's truncation); an offset that compaction removed
  continues into the next segment; the first batch is returned even if it exceeds ``max_bytes`` unless
  ``min_one_message=False``, which returns nothing then. A segment deleted under a
  fetch is resolved again: a fetch returns whole batches or ``RemoteOffsetOutOfRange``.
  The log start offset and segments come from the partition's view in the RLMM; the
  log is read in ranges the offset index bounds, sized to the budget, as views of the
  engine's checked bytes, no stream between (``_batch_views``); the batches returned
  are copied once.
* ``enforce_retention(tp, log, retention_ms=..., retention_bytes=...)``: Kafka's
  expiration task: segments below the log start offset, then, walking the lineage's
  epochs oldest first, segments breached by time (largest timestamp at or before now -
  retention) or by size (the whole log, local segments not yet remote plus the remote
  segments of the lineage, over the limit), stopping at the first segment kept; the log
  start offset moves past them before anything is deleted; DELETE_SEGMENT_STARTED ones
  are finished; segments of epochs older than the lineage's earliest are deleted too.
* ``delete_partition(tp)``: the partition's deletion markers around deleting every
  segment; a repeat (or a partition never seen) changes nothing more.

The copy, retention, cleanup and partition deletion of one partition never run at once
in one container: each holds the partition's task lock; another process changes nothing
unless it owns the container (the fence). Fetches run beside them.

A read-only instance (a follower) answers ``fetch`` from the same store.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import functools
import itertools
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field

from slts.errors import InvalidArgument, InvalidLogSegment, RemoteOffsetOutOfRange, RemoteSegmentNotFound
from slts.remote import inspection
from slts.remote import kafka_formats as kf
from slts.remote.index_cache import OffsetIndexCache
from slts.remote.inspection import InspectedLog
from slts.remote.lineage import LeaderEpochCache, filtered_epochs, segment_within_lineage
from slts.remote.local_log import LocalLog, LocalSegment, local_log
from slts.remote.partition_views import PartitionView
from slts.remote.records import (
    OFFSET_MAX,
    PartitionDeleteState,
    RemoteLogSegmentMetadata,
    SegmentState,
    TopicPartition,
    check_offset,
    new_segment_metadata,
)
from slts.remote.rlmm import RemoteLogMetadataManager
from slts.remote.rsm import IndexType, LogSegmentData, RemoteStorageManager
from slts.remote.workers import executor
from slts.storage.chunked import ChunkedSegmentStorage

logger = logging.getLogger(__name__)

#: Default byte budget of one fetch (Kafka's max.partition.fetch.bytes default).
FETCH_MAX_BYTES_DEFAULT = 1 << 20
#: Times a fetch resolves its first segment again when retention deleted it meanwhile.
FETCH_ATTEMPTS = 3
#: Offset-index entries at least this far apart: the batch at the first entry at or past
#: a fetch's offset is read first, as the likely holder (see ``_batch_views``).
SPECULATE_GAP_BYTES = 2 * kf.DEFAULT_INDEX_INTERVAL_BYTES
#: Segment labels (for errors) and ids kept by one manager (all dropped when one more
#: is needed).
SEGMENT_NAMES_MAX = 4096

__all__ = [
    "FETCH_MAX_BYTES_DEFAULT",
    "CopyReport",
    "FetchResult",
    "LocalLog",
    "LocalSegment",
    "RemoteLogManager",
    "RetentionReport",
    "local_log",
]


@dataclass(slots=True)
class CopyReport:
    """What ``copy_rolled_segments`` did."""

    copied: list[RemoteLogSegmentMetadata] = field(default_factory=list)
    #: Unfinished uploads (and unfinished deletes) of earlier runs, now deleted.
    cleaned: list[uuid.UUID] = field(default_factory=list)
    #: Rolled segments not copied by this run: already remote, empty, or not yet
    #: below the last stable offset.
    skipped: int = 0


@dataclass(frozen=True, slots=True)
class FetchResult:
    """Whole record batches from the batch holding ``offset``; ``next_offset`` follows
    the last batch returned."""

    records: bytes
    offset: int
    next_offset: int
    segments: tuple[uuid.UUID, ...]


@dataclass(slots=True)
class RetentionReport:
    """What ``enforce_retention`` / ``delete_partition`` deleted."""

    deleted: list[RemoteLogSegmentMetadata] = field(default_factory=list)
    log_start_offset: int | None = None
    bytes_deleted: int = 0


class RemoteLogManager:
    """KIP-405's RLM on one SLTS container (the owner; a read-only instance can fetch).

    ``validate`` (default on) checks every segment's batches and indexes before the RSM
    is called (see module doc), the next segment's in a background thread while one is
    written; ``threads=False`` runs that work, and the default RSM's, in the calling
    thread (``slts.remote.workers``: a seeded simulation replays exactly)."""

    def __init__(
        self,
        storage: ChunkedSegmentStorage,
        *,
        broker_id: int = 0,
        clock: Callable[[], float] = time.time,
        rsm: RemoteStorageManager | None = None,
        offset_indexes: OffsetIndexCache | None = None,
        validate: bool = True,
        threads: bool = True,
    ) -> None:
        if not isinstance(storage, ChunkedSegmentStorage):
            raise InvalidArgument(f"{storage!r} is not a ChunkedSegmentStorage")
        if isinstance(broker_id, bool) or not isinstance(broker_id, int) or broker_id < 0:
            raise InvalidArgument(f"broker id {broker_id!r} is not a non-negative integer")
        if not isinstance(validate, bool):
            raise InvalidArgument(f"validate must be True or False, got {validate!r}")
        if not isinstance(threads, bool):
            raise InvalidArgument(f"threads must be True or False, got {threads!r}")
        if rsm is not None and not isinstance(rsm, RemoteStorageManager):
            raise InvalidArgument(f"{rsm!r} is not a RemoteStorageManager")
        self.rlmm = RemoteLogMetadataManager(storage)
        self.rsm = rsm if rsm is not None else RemoteStorageManager(storage, threads=threads)
        self.offset_indexes = offset_indexes if offset_indexes is not None else OffsetIndexCache()
        self.broker_id = broker_id
        self.validate = validate
        self.threads = threads
        self._locks = storage.context.locks
        self._clock = clock
        self._segment_names: dict[bytes, tuple[str, uuid.UUID]] = {}

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    @contextlib.contextmanager
    def _task(self, tp: TopicPartition) -> Iterator[None]:
        """The partition's task lock: copy, retention, cleanup and partition deletion of
        ``tp`` run one at a time in this container (across processes: the fence)."""
        with self._locks.changing(f"remote-task:{tp}"):
            yield

    # -- the RLMM's answers for partitions it may not know yet -------------------------------------

    def _highest_for_epoch(self, tp: TopicPartition, epoch: int) -> int | None:
        try:
            return self.rlmm.highest_offset_for_epoch(tp, epoch)
        except RemoteSegmentNotFound:
            return None

    def _listing(self, tp: TopicPartition, leader_epoch: int | None = None) -> list[RemoteLogSegmentMetadata]:
        try:
            return list(self.rlmm.list_segments(tp, leader_epoch=leader_epoch))
        except RemoteSegmentNotFound:
            return []

    def _log_start_offset(self, tp: TopicPartition) -> int | None:
        try:
            return self.rlmm.log_start_offset(tp)
        except RemoteSegmentNotFound:
            return None

    def _remote_range(self, tp: TopicPartition) -> tuple[int | None, int | None]:
        try:
            return self.rlmm.earliest_offset(tp), self.rlmm.highest_offset(tp)
        except RemoteSegmentNotFound:
            return None, None

    # -- offsets of the lineage ----------------------------------------------------------------------

    def find_highest_remote_offset(self, tp: TopicPartition, log: LocalLog) -> tuple[int, int]:
        """(offset, epoch) of the highest offset copied in ``log``'s lineage, (-1, -1) if
        none (Kafka's ``findHighestRemoteOffset``): from the latest epoch of the cache back,
        the first epoch with a remote copy gives its highest copied offset, capped at that
        epoch's end in the cache minus one (a lineage that diverged after it)."""
        _check_tp(tp)
        _check_log(log)
        cache = log.leader_epochs
        entry = cache.latest()
        while entry is not None:
            epoch = entry[0]
            highest = self._highest_for_epoch(tp, epoch)
            if highest is not None:
                found_epoch, end = cache.end_offset_for(epoch, log.log_end_offset)
                return (end - 1, found_epoch) if end <= highest else (highest, epoch)
            entry = cache.previous_entry(epoch)
        return -1, -1

    def find_log_start_offset(self, tp: TopicPartition, log: LocalLog) -> int:
        """The log start offset a new leader adopts (Kafka's ``findLogStartOffset``): the
        start of the first remote segment listed under the cache's earliest epoch that has
        one, else the local log's first offset."""
        _check_tp(tp)
        _check_log(log)
        cache = log.leader_epochs
        earliest = cache.earliest()
        epoch = None if earliest is None else earliest[0]
        while epoch is not None:
            listed = self._listing(tp, epoch)
            if listed:
                return listed[0].start_offset
            epoch = cache.next_epoch(epoch)
        return log.segments[0].base_offset if log.segments else log.log_start_offset

    # -- copy ---------------------------------------------------------------------------------------

    @staticmethod
    def candidate_segments(log: LocalLog, from_offset: int) -> list[tuple[LocalSegment, int]]:
        """(segment, next segment's base offset) of every segment of ``log`` holding or
        after ``from_offset`` that is not the active segment and whose next segment starts
        at or below the last stable offset (Kafka's ``candidateLogSegments``)."""
        _check_log(log)
        check_offset(from_offset, "from offset")
        segments = list(log.segments)
        first = 0
        for number, segment in enumerate(segments):
            if segment.base_offset <= from_offset:
                first = number
        chosen = segments[first:]
        return [
            (previous, current.base_offset)
            for previous, current in itertools.pairwise(chosen)
            if current.base_offset <= log.last_stable_offset
        ]

    def copy_rolled_segments(self, tp: TopicPartition, log: LocalLog) -> CopyReport:
        """Copy the rolled segments of ``log`` that are not remote yet and lie below its
        last stable offset, oldest first (see module doc).

        Raises ``InvalidLogSegment`` (validation: that segment and later ones are not
        copied, earlier ones are), ``InvalidArgument``, ``Fenced``, ``ReadOnlyInstance``,
        storage errors (the failed upload is deleted, or left STARTED for the next run's
        cleanup if the delete fails too)."""
        _check_tp(tp)
        _check_log(log)
        with self._task(tp):
            report = CopyReport(cleaned=self._cleanup(tp))
            rolled = len(log.segments) - 1 if log.segments else 0
            highest, _ = self.find_highest_remote_offset(tp, log)
            lso = log.last_stable_offset
            if lso == 0 or highest >= lso:
                report.skipped = rolled
                return report
            candidates = self.candidate_segments(log, max(highest + 1, log.log_start_offset))
            pending = [
                (segment, following, _segment_data(log, segment, following))
                for segment, following in candidates
                if segment.size_bytes > 0
            ]
            with executor(1, "slts-remote-inspect", threads=self.threads) as ahead:

                def inspect(number: int) -> Future[InspectedLog | None]:
                    segment, _, data = pending[number]
                    return self._inspect_later(ahead, tp, segment, data)

                inspections = [inspect(0)] if pending else []
                for number, (segment, following, data) in enumerate(pending):
                    inspected = inspections[number].result()
                    if number + 1 < len(pending):  # the next file is checked while this one is written
                        inspections.append(inspect(number + 1))
                    report.copied.append(self._copy(tp, log, segment, following, data, inspected))
            report.skipped = rolled - len(report.copied)
            return report

    def _inspect_later(
        self,
        pool: Executor,
        tp: TopicPartition,
        segment: LocalSegment,
        data: LogSegmentData,
    ) -> Future[InspectedLog | None]:
        """``segment``'s inspection (None without validation), run on ``pool``."""
        if not self.validate:
            done: Future[InspectedLog | None] = Future()
            done.set_result(None)
            return done
        return pool.submit(
            inspection.inspect_segment,
            data,
            label=f"{tp} segment {segment.base_offset:020d}",
            size_bytes=segment.size_bytes,
        )

    def _copy(
        self,
        tp: TopicPartition,
        log: LocalLog,
        segment: LocalSegment,
        following: int,
        data: LogSegmentData,
        inspected: InspectedLog | None,
    ) -> RemoteLogSegmentMetadata:
        """Record ``segment`` COPY_SEGMENT_STARTED, copy it, record it FINISHED; delete
        it again if the copy fails."""
        label = f"{tp} segment {segment.base_offset:020d}"
        end_offset = following - 1
        if inspected is not None:
            _check_within(inspected, segment.base_offset, end_offset, log.leader_epochs, label)
        epochs = _segment_epochs(log.leader_epochs, segment.base_offset, following, inspected, label)
        metadata = new_segment_metadata(
            tp,
            start_offset=segment.base_offset,
            end_offset=end_offset,
            leader_epochs=epochs,
            max_timestamp_ms=(
                inspected.summary.max_timestamp if inspected is not None else _largest_timestamp(segment)
            ),
            size_bytes=segment.size_bytes,
            broker_id=self.broker_id,
            event_timestamp_ms=self._now_ms(),
        )
        self.rlmm.add_segment(metadata)
        try:
            custom = self.rsm.copy_log_segment(metadata, data)
        except Exception:
            logger.info("copy of %s failed: deleting remote segment %s", label, metadata.id)
            try:
                self._delete(metadata)
            except Exception as cleanup_error:  # noqa: BLE001 - the original error matters; cleanup retries
                logger.info(
                    "deleting remote segment %s failed (the next run retries): %s", metadata.id, cleanup_error
                )
            raise
        return self.rlmm.update_segment(
            metadata.id,
            SegmentState.COPY_SEGMENT_FINISHED,
            event_timestamp_ms=self._now_ms(),
            custom_metadata=custom,
        )

    def cleanup(self, tp: TopicPartition) -> list[uuid.UUID]:
        """Delete the uploads of ``tp`` a crash left COPY_SEGMENT_STARTED and finish the
        deletes it left DELETE_SEGMENT_STARTED; return their ids."""
        _check_tp(tp)
        with self._task(tp):
            return self._cleanup(tp)

    def _cleanup(self, tp: TopicPartition) -> list[uuid.UUID]:
        unfinished = [
            m
            for m in self._listing(tp)
            if m.segment_state in (SegmentState.COPY_SEGMENT_STARTED, SegmentState.DELETE_SEGMENT_STARTED)
        ]
        return [m.id for m in unfinished if self._delete(m)]

    # -- fetch ----------------------------------------------------------------------------------------

    def fetch(
        self,
        tp: TopicPartition,
        offset: int,
        max_bytes: int = FETCH_MAX_BYTES_DEFAULT,
        *,
        leader_epochs: LeaderEpochCache | Sequence[tuple[int, int]] | None = None,
        min_one_message: bool = True,
    ) -> FetchResult:
        """Whole record batches of ``tp`` from the one holding ``offset`` (see module doc).

        ``leader_epochs``: the partition's leader-epoch cache (Kafka's lookup; None: the
        newest epoch holding the offset). Raises ``RemoteOffsetOutOfRange`` (below the
        earliest or above the highest remote offset, or in no finished segment of the
        lineage: naming partition and offset), ``InvalidArgument``, ``InvalidLogSegment``
        (the remote bytes or index do not parse: damage)."""
        _check_tp(tp)
        if type(offset) is not int or not 0 <= offset <= OFFSET_MAX:  # the message only on error
            check_offset(offset, f"{tp}: fetch offset")
        if (
            type(max_bytes) is not int and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int))
        ) or max_bytes < 1:
            raise InvalidArgument(f"{tp}: max_bytes {max_bytes!r} is not a positive integer")
        if not isinstance(min_one_message, bool):
            raise InvalidArgument(f"{tp}: min_one_message must be True or False")
        cache = (
            leader_epochs
            if leader_epochs is None or isinstance(leader_epochs, LeaderEpochCache)
            else LeaderEpochCache.of(leader_epochs)
        )
        for _ in range(FETCH_ATTEMPTS):
            try:
                return self._fetch_once(tp, offset, max_bytes, cache, min_one_message)
            except RemoteSegmentNotFound:
                continue  # retention deleted the segment it resolved: resolve again
        earliest, highest = self._remote_range(tp)
        raise _out_of_range(tp, offset, "was deleted while it was read", earliest, highest)

    def _fetch_once(
        self,
        tp: TopicPartition,
        offset: int,
        max_bytes: int,
        cache: LeaderEpochCache | None,
        min_one_message: bool,
    ) -> FetchResult:
        """One attempt; raises ``RemoteSegmentNotFound`` if the first segment vanished.
        The log start offset guards the segments retention is deleting; the lookup finds
        nothing above the highest offset; both come from the partition's view in the
        RLMM (current as of this call: ``slts.remote.partition_views``), or the store if
        there is none. The remote range is read for the error only."""
        view = self.rlmm.view(tp)
        start = self._log_start_offset(tp) if view is None else view.record.log_start_offset
        metadata = None if start is None or offset < start else self._segment_for(tp, view, offset, cache)
        if metadata is None:
            earliest, highest = self._remote_range(tp)
            if earliest is None or highest is None or not earliest <= offset <= highest:
                raise _out_of_range(tp, offset, "is outside the remote log", earliest, highest)
            epoch = None if cache is None else cache.epoch_for_offset(offset)
            where = f" of leader epoch {epoch}" if cache is not None else ""
            raise _out_of_range(tp, offset, f"is in no remote segment{where}", earliest, highest)
        batches: list[memoryview] = []
        taken = 0
        segments: list[uuid.UUID] = []
        position = offset
        in_lineage = _lineage_holds(cache)
        while metadata is not None and taken < max_bytes:
            try:
                after, full, taken = self._read_batches(
                    metadata, position, max_bytes, batches, taken, min_one_message, in_lineage
                )
            except RemoteSegmentNotFound:
                if not segments and not batches:
                    raise
                break  # deleted under us: what was read is whole batches
            if after > position:
                segments.append(self._names(metadata)[1])
                position = after
            if full:
                break
            metadata = self._segment_for(tp, view, metadata.end_offset + 1, cache)  # Kafka's next segment
        return FetchResult(_joined(batches), offset, position, tuple(segments))

    def _segment_for(
        self, tp: TopicPartition, view: PartitionView | None, offset: int, cache: LeaderEpochCache | None
    ) -> RemoteLogSegmentMetadata | None:
        """The segment holding ``offset`` in the lineage of ``cache`` (without: the
        newest epoch's), from ``view`` if there is one, else from the store."""
        epoch = None if cache is None else cache.epoch_for_offset(offset)
        if cache is not None and epoch is None:
            return None
        try:
            if view is not None:
                return self.rlmm.segment_in_view(view, offset, epoch)
            return self.rlmm.segment_for_offset(tp, offset, epoch)
        except RemoteSegmentNotFound:
            return None

    def _read_batches(
        self,
        metadata: RemoteLogSegmentMetadata,
        offset: int,
        max_bytes: int,
        batches: list[memoryview],
        taken: int,
        min_one_message: bool,
        in_lineage: Callable[[int, int], bool] | None = None,
    ) -> tuple[int, bool, int]:
        """Append to ``batches`` (``taken`` bytes so far) the batches of ``metadata`` from
        the one holding ``offset`` while the budget allows (the first of the fetch even
        over it, if ``min_one_message``); return the offset after the last batch appended
        (``offset`` if none), whether the budget stopped it, and the bytes taken now.
        With ``in_lineage`` (the fetch's leader-epoch cache), a batch another leader wrote
        (its epoch is not the lineage's at its offset: an unclean election truncated it)
        ends the fetch, and raises ``RemoteOffsetOutOfRange`` if it would have been the
        fetch's first.

        The log is read in ranges sized to the fetch (``_batch_views``), never more than
        the budget or ``rsm.read_bytes`` past the batch holding ``offset``."""
        for header, batch in self._batch_views(metadata, offset, max(max_bytes - taken, 1)):
            if header.base_offset + header.last_offset_delta < offset:
                continue
            if in_lineage is not None and not in_lineage(header.partition_leader_epoch, header.base_offset):
                if batches:
                    return offset, True, taken
                raise RemoteOffsetOutOfRange(
                    f"{metadata.topic_partition}: offset {offset} is held remotely only by "
                    f"leader epoch {header.partition_leader_epoch}, not in the lineage",
                    partition=str(metadata.topic_partition),
                    offset=offset,
                )
            if taken + len(batch) > max_bytes and (batches or not min_one_message):
                return offset, True, taken
            batches.append(batch)
            taken += len(batch)
            offset = header.base_offset + header.last_offset_delta + 1
            if taken >= max_bytes:
                return offset, True, taken
        return offset, False, taken

    def _batch_views(
        self, metadata: RemoteLogSegmentMetadata, offset: int, budget: int
    ) -> Iterable[tuple[kf.BatchHeader, memoryview]]:
        """The batches of ``metadata``'s log from one at or before the batch holding
        ``offset``, read in ranges sized to what the fetch needs: the offset index bounds
        that batch (``OffsetIndex.bounds``); when entries lie far enough apart for the
        batch at the first entry at or past ``offset`` to be the one (batches above
        ``index.interval.bytes`` each have an entry), that batch alone is read first, and
        only if it starts past ``offset`` is the stretch before it read; otherwise the
        stretch between the entries around ``offset`` in one read. Each read reaches at
        least ``budget`` bytes (at most ``rsm.read_bytes``) further, so a fetch of one
        batch reads one batch and a fetch of many reads in few ranges."""
        label, segment_id = self._names(metadata)
        index = self.offset_indexes.get(
            segment_id,
            metadata.start_offset,
            lambda: self.rsm.fetch_index(metadata, IndexType.OFFSET),
            segment=label,
        )
        size = metadata.size_bytes
        low, at, high = index.bounds(offset)
        stop = size if high is None else high
        more = min(budget, self.rsm.read_bytes)

        read = functools.partial(self.rsm.read_log, metadata)
        if at is not None and at - low >= SPECULATE_GAP_BYTES:
            views = kf.iter_batch_views(
                read, size, at, min(size, max(stop, at + more)), more_bytes=more, segment=label
            )
            try:
                first = next(views, None)
            except InvalidLogSegment:
                first = None  # damage there fails the fetch only if the fetch reaches it
            if first is not None and first[0].base_offset <= offset:
                return itertools.chain((first,), views)
            views.close()
            stop = at  # the batch holding offset starts before the entry's
        return kf.iter_batch_views(
            read, size, low, min(size, max(stop, low + more)), more_bytes=more, segment=label
        )

    def _names(self, metadata: RemoteLogSegmentMetadata) -> tuple[str, uuid.UUID]:
        """``metadata``'s label (for errors) and id, kept per segment: not formatted or
        built per fetch."""
        names = self._segment_names.get(metadata.segment_id)
        if names is None:
            if len(self._segment_names) >= SEGMENT_NAMES_MAX:
                self._segment_names.clear()
            segment_id = metadata.id
            names = (f"{metadata.topic_partition} segment {segment_id}", segment_id)
            self._segment_names[metadata.segment_id] = names
        return names

    # -- retention ------------------------------------------------------------------------------------

    def enforce_retention(
        self,
        tp: TopicPartition,
        log: LocalLog,
        *,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        now_ms: int | None = None,
    ) -> RetentionReport:
        """Delete the remote segments Kafka's expiration task deletes (see module doc);
        None: no limit of that kind. ``retention_bytes`` covers the whole log: the local
        segments not yet remote count (``log``). Raises ``InvalidArgument``, ``Fenced``,
        ``ReadOnlyInstance``, storage errors (what was not deleted yet is retried by the
        next run)."""
        _check_tp(tp)
        _check_log(log)
        for value, what in ((retention_ms, "retention_ms"), (retention_bytes, "retention_bytes")):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise InvalidArgument(f"{tp}: {what} {value!r} is not a non-negative integer or None")
        now = self._now_ms() if now_ms is None else check_offset(now_ms, "now_ms")
        with self._task(tp):
            return self._enforce_retention(tp, log, retention_ms, retention_bytes, now)

    def _enforce_retention(
        self,
        tp: TopicPartition,
        log: LocalLog,
        retention_ms: int | None,
        retention_bytes: int | None,
        now: int,
    ) -> RetentionReport:
        listed = self._listing(tp)
        report = RetentionReport(log_start_offset=self._log_start_offset(tp))
        if not listed:
            return report
        remote_epochs = sorted({epoch for m in listed for epoch in m.leader_epochs})
        lineage = filtered_epochs(log.leader_epochs.as_dict())
        breached = _Breach(
            cleanup_until_ms=None if retention_ms is None else now - retention_ms,
            remaining_bytes=self._breached_bytes(tp, log, listed, lineage, retention_bytes),
        )
        chosen: dict[bytes, RemoteLogSegmentMetadata] = {}
        going = True
        for epoch in lineage:
            if not going:
                break
            for metadata in _holding(listed, epoch):
                if not going:
                    break
                state = metadata.segment_state
                if state == SegmentState.DELETE_SEGMENT_STARTED:
                    chosen[metadata.segment_id] = metadata
                    continue
                if state == SegmentState.DELETE_SEGMENT_FINISHED or metadata.segment_id in chosen:
                    continue
                delete = _below_log_start(metadata, log.log_start_offset, lineage)
                valid = False
                if not delete:
                    valid = segment_within_lineage(metadata, log.log_end_offset, lineage)
                    delete = valid and (breached.by_time(metadata) or breached.by_size(metadata))
                if delete:
                    chosen[metadata.segment_id] = metadata
                going = delete or not valid
        if breached.log_start_offset is not None:
            report.log_start_offset = self.rlmm.move_log_start_offset(tp, breached.log_start_offset)
        doomed = list(chosen.values())
        earliest = log.leader_epochs.earliest()
        if earliest is not None:  # epochs older than the lineage: after an unclean election
            seen = set(chosen)
            for epoch in (e for e in remote_epochs if e < earliest[0]):
                for metadata in _holding(listed, epoch):
                    if metadata.segment_id not in seen and all(
                        e < earliest[0] for e in metadata.leader_epochs
                    ):
                        seen.add(metadata.segment_id)
                        doomed.append(metadata)
        for metadata in doomed:
            if self._delete(metadata):
                report.deleted.append(metadata)
                report.bytes_deleted += metadata.size_bytes
        return report

    def _breached_bytes(
        self,
        tp: TopicPartition,
        log: LocalLog,
        listed: list[RemoteLogSegmentMetadata],
        lineage: dict[int, int],
        retention_bytes: int | None,
    ) -> int | None:
        """Bytes over ``retention_bytes`` of the whole log (Kafka's ``RetentionSizeData``):
        the local segments not yet remote and the finished remote segments of the lineage
        (of ``listed``, the partition's listing); None if no limit or within it."""
        if retention_bytes is None:
            return None
        remote = sum(
            metadata.size_bytes
            for metadata in listed
            if metadata.segment_state == SegmentState.COPY_SEGMENT_FINISHED
            and segment_within_lineage(metadata, log.log_end_offset, lineage)
        )
        highest, _ = self.find_highest_remote_offset(tp, log)
        total = log.only_local_bytes(highest) + remote
        return total - retention_bytes if total > retention_bytes else None

    # -- partition deletion -----------------------------------------------------------------------------

    def delete_partition(self, tp: TopicPartition) -> RetentionReport:
        """Delete every remote segment of ``tp`` between its deletion markers, then forget
        the partition. Resumable: a repeat after a crash carries on; a partition never
        seen (or already forgotten) has nothing to delete."""
        _check_tp(tp)
        report = RetentionReport()
        with self._task(tp):
            try:
                state = self.rlmm.delete_state(tp)
            except RemoteSegmentNotFound:
                return report
            if state is None:
                self.rlmm.mark_partition(tp, PartitionDeleteState.DELETE_PARTITION_MARKED)
            self.rlmm.mark_partition(tp, PartitionDeleteState.DELETE_PARTITION_STARTED)
            for metadata in self._listing(tp):
                if self._delete(metadata):
                    report.deleted.append(metadata)
                    report.bytes_deleted += metadata.size_bytes
            self.rlmm.mark_partition(tp, PartitionDeleteState.DELETE_PARTITION_FINISHED)
        return report

    def _delete(self, metadata: RemoteLogSegmentMetadata) -> bool:
        """DELETE_SEGMENT_STARTED, the data, DELETE_SEGMENT_FINISHED; each step idempotent,
        and a segment already forgotten (deleted by an earlier run) is left alone. Return
        whether this call found the segment still recorded."""
        try:
            self.rlmm.update_segment(
                metadata.id, SegmentState.DELETE_SEGMENT_STARTED, event_timestamp_ms=self._now_ms()
            )
        except RemoteSegmentNotFound:
            return False
        self.rsm.delete_log_segment(metadata)
        with contextlib.suppress(RemoteSegmentNotFound):
            self.rlmm.update_segment(
                metadata.id, SegmentState.DELETE_SEGMENT_FINISHED, event_timestamp_ms=self._now_ms()
            )
        return True


@dataclass(slots=True)
class _Breach:
    """Kafka's retention handler: which segments time or size retention breaches, and
    the log start offset past them."""

    cleanup_until_ms: int | None
    remaining_bytes: int | None
    log_start_offset: int | None = None

    def _moved_past(self, metadata: RemoteLogSegmentMetadata) -> None:
        if self.log_start_offset is None or self.log_start_offset < metadata.end_offset + 1:
            self.log_start_offset = metadata.end_offset + 1

    def by_time(self, metadata: RemoteLogSegmentMetadata) -> bool:
        if self.cleanup_until_ms is None or metadata.max_timestamp_ms > self.cleanup_until_ms:
            return False
        if self.remaining_bytes is not None:
            self.remaining_bytes = max(0, self.remaining_bytes - metadata.size_bytes)
        self._moved_past(metadata)
        return True

    def by_size(self, metadata: RemoteLogSegmentMetadata) -> bool:
        if self.remaining_bytes is None or self.remaining_bytes <= 0:
            return False
        if self.remaining_bytes - metadata.size_bytes < 0:
            return False
        self.remaining_bytes -= metadata.size_bytes
        self._moved_past(metadata)
        return True


def _holding(listed: list[RemoteLogSegmentMetadata], epoch: int) -> Iterator[RemoteLogSegmentMetadata]:
    """The segments of ``listed`` (a listing, by start offset) that hold ``epoch``: the
    RLMM's listing under that epoch, taken from the one listing a retention run reads."""
    return (metadata for metadata in listed if epoch in metadata.leader_epochs)


def _below_log_start(
    metadata: RemoteLogSegmentMetadata, log_start_offset: int, lineage: dict[int, int]
) -> bool:
    """Kafka's ``isSegmentBreachByLogStartOffset``: every epoch of the segment at or
    below the lineage's first, and the segment ends below the log start offset."""
    if not lineage:
        return False
    first = min(lineage)
    return all(epoch <= first for epoch in metadata.leader_epochs) and metadata.end_offset < log_start_offset


def _lineage_holds(cache: LeaderEpochCache | None) -> Callable[[int, int], bool] | None:
    """Whether a batch of epoch ``e`` at offset ``o`` is in the lineage of ``cache``
    (None without a cache): ``e`` is one of its epochs that holds records, ``o`` lies
    before the next one's start and not before its own (the earliest epoch excepted: the
    cache may be cut at the log start offset)."""
    if cache is None:
        return None
    ordered = sorted(filtered_epochs(cache.as_dict()).items())
    epochs = [epoch for epoch, _ in ordered]

    def holds(epoch: int, offset: int) -> bool:
        if epoch < 0:  # a batch without an epoch (written before epochs existed) cannot diverge
            return True
        at = bisect.bisect_left(epochs, epoch)
        if at == len(epochs) or epochs[at] != epoch:
            return False
        if at > 0 and offset < ordered[at][1]:
            return False
        return at + 1 == len(epochs) or offset < ordered[at + 1][1]

    return holds


def _joined(batches: list[memoryview]) -> bytes:
    """The batches' bytes as one ``bytes``: the read's own bytes if one batch is all of
    them (no copy), else one copy."""
    if len(batches) == 1:
        whole = batches[0].obj
        if type(whole) is bytes and len(whole) == len(batches[0]):
            return whole
    return b"".join(batches)


def _check_tp(tp: object) -> None:
    if not isinstance(tp, TopicPartition):
        raise InvalidArgument(f"{tp!r} is not a TopicPartition")


def _check_log(log: object) -> None:
    if not isinstance(log, LocalLog):
        raise InvalidArgument(f"{log!r} is not a LocalLog (slts.remote.local_log)")


def _check_within(inspected: InspectedLog, start: int, end: int, cache: LeaderEpochCache, label: str) -> None:
    """Raise ``InvalidLogSegment`` unless the inspected batches lie in ``start..end`` and
    each epoch they carry is the cache's epoch for its first offset."""
    summary = inspected.summary
    if summary.base_offset < start or summary.end_offset > end:
        raise InvalidLogSegment(
            f"{label}: its batches hold offsets {summary.base_offset}..{summary.end_offset}, outside "
            f"the segment's {start}..{end} (the next segment starts at {end + 1})",
            segment=label,
            offset=summary.base_offset if summary.base_offset < start else summary.end_offset,
        )
    if not len(cache):
        return
    for epoch, first in summary.leader_epochs.items():
        if epoch >= 0 and cache.epoch_for_offset(first) != epoch:
            raise InvalidLogSegment(
                f"{label}: a batch at offset {first} carries leader epoch {epoch}, the leader-epoch "
                f"cache says {cache.epoch_for_offset(first)}",
                segment=label,
                offset=first,
            )


def _segment_epochs(
    cache: LeaderEpochCache, start: int, following: int, inspected: InspectedLog | None, label: str
) -> dict[int, int]:
    """The segment's leader epochs: the cache's entries in ``[start, following)`` (Kafka's
    rule), else those the batches carry (a log without a cache); the first moved to the
    segment's start."""
    epochs = dict(cache.entries_in_range(start, following))
    if not epochs and inspected is not None:
        epochs = {epoch: first for epoch, first in inspected.summary.leader_epochs.items() if epoch >= 0}
    if not epochs:
        if inspected is None:
            raise InvalidLogSegment(
                f"{label}: the leader-epoch cache has no entry for it", segment=label, offset=start
            )
        epochs = {0: start}  # no epoch anywhere: Kafka's epoch before any election
    first = min(epochs)
    epochs[first] = start
    return epochs


def _segment_data(log: LocalLog, segment: LocalSegment, following: int) -> LogSegmentData:
    """The files the RSM copies for ``segment``: its own, and the leader-epoch cache cut
    at its end (Kafka's ``epochEntriesInRange(-1, next segment's base)``)."""
    checkpoint = kf.encode_leader_epoch_checkpoint(log.leader_epochs.entries_in_range(-1, following))
    return dataclasses.replace(segment.data, leader_epoch_checkpoint=checkpoint)


def _largest_timestamp(segment: LocalSegment) -> int:
    """The largest record timestamp of a rolled segment: its time index's last entry
    (Kafka writes the segment's largest timestamp there when it rolls)."""
    label = f"segment {segment.base_offset:020d}"
    try:
        with open(segment.data.time_index, "rb") as file:
            data = file.read()
    except OSError as exc:
        raise InvalidArgument(
            f"cannot read the time index {segment.data.time_index!r}: {exc.strerror}"
        ) from exc
    entries = kf.parse_time_index(data, segment.base_offset, segment=label)
    return entries[-1].timestamp if entries else kf.NO_TIMESTAMP


def _out_of_range(
    tp: TopicPartition, offset: int, why: str, earliest: int | None, highest: int | None
) -> RemoteOffsetOutOfRange:
    span = "empty" if earliest is None or highest is None else f"offsets {earliest}..{highest}"
    return RemoteOffsetOutOfRange(
        f"{tp}: offset {offset} {why} (remote log: {span})",
        partition=str(tp),
        offset=offset,
        earliest=earliest,
        highest=highest,
    )
