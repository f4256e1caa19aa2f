"""The remote log manager (KIP-405 RLM): the copy, fetch and retention tasks, driven by
the engine that owns the local log.

KIP-405 runs these as a leader task per partition (copy, retention) and serves
followers and consumers from the remote tier (fetch). Here the engine calls them:

* ``copy_rolled_segments(tp, segments, last_stable_offset)`` copies rolled segments whose
  end offset is below the last stable offset, oldest first, one at a time: each is
  inspected (nothing is recorded for bad files), recorded COPY_SEGMENT_STARTED, copied
  (``RemoteStorageManager``) and then COPY_SEGMENT_FINISHED; the next segment's files are
  inspected in a background thread while this one is written (the writes wait on the
  disk or the network, the inspection on the CPU). A crash in between leaves a
  STARTED entry; the next run deletes its data and records it deleted before copying
  again (``cleanup``), as a new upload with a new id.
* ``fetch(tp, offset, max_bytes)`` finds the segment through the RLMM, the byte position
  through its offset index (read and checked once, then kept: ``index_cache``), and
  returns whole record batches from the batch holding ``offset``, up to ``max_bytes`` (at
  least one batch, as Kafka returns an oversized first batch so that a consumer makes
  progress), across segment boundaries.
* ``enforce_retention(tp, retention_ms=..., retention_bytes=...)``: the expired segments
  (oldest first, by their largest timestamp, or while the remote size minus the oldest
  segment is still at least the limit) move the log start offset past them first, then
  each goes DELETE_SEGMENT_STARTED, its data is deleted, DELETE_SEGMENT_FINISHED.
  Segments a later upload superseded, segments below the log start offset and segments
  a crash left in DELETE_SEGMENT_STARTED are deleted in the same run: a failed delete is
  retried by the next run, never forgotten. Uploads in COPY_SEGMENT_STARTED are left to
  the copy task (it may be copying them now; its next run cleans up a crashed one).
* ``delete_partition(tp)``: the partition's deletion markers around deleting every
  segment.

A read-only instance (a follower) answers ``fetch`` from the same store.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from slts.errors import InvalidArgument, RemoteOffsetOutOfRange
from slts.remote import kafka_formats as kf
from slts.remote.index_cache import OffsetIndexCache
from slts.remote.inspection import InspectedLog, inspect_segment
from slts.remote.records import (
    PartitionDeleteState,
    RemoteLogSegmentMetadata,
    SegmentState,
    TopicPartition,
    check_epoch,
    check_offset,
    new_segment_metadata,
)
from slts.remote.rlmm import RemoteLogMetadataManager
from slts.remote.rsm import IndexType, LogSegmentData, RemoteStorageManager
from slts.storage.chunked import ChunkedSegmentStorage

#: Default byte budget of one fetch (Kafka's max.partition.fetch.bytes default).
FETCH_MAX_BYTES_DEFAULT = 1 << 20
_LOG_FILE = re.compile(r"(?P<base>[0-9]{20})\.log")
CHECKPOINT_FILE = "leader-epoch-checkpoint"


@dataclass(frozen=True, slots=True)
class LocalSegment:
    """A rolled segment of the local log: its base offset and files."""

    base_offset: int
    data: LogSegmentData


def local_segments(log_dir: str | os.PathLike[str]) -> list[LocalSegment]:
    """The segments of a Kafka partition folder, by base offset: ``<20 digits>.log`` with
    its ``.index`` and ``.timeindex`` (and ``.txnindex``, ``.snapshot`` if present) and the
    folder's ``leader-epoch-checkpoint``. Raises ``InvalidArgument`` (no such folder, a
    log without its indexes, no checkpoint)."""
    folder = os.fspath(log_dir)
    try:
        names = set(os.listdir(folder))
    except OSError as exc:
        raise InvalidArgument(f"cannot list the log folder {folder!r}: {exc.strerror}") from exc
    try:
        with open(os.path.join(folder, CHECKPOINT_FILE), "rb") as file:
            checkpoint = file.read()
    except OSError as exc:
        raise InvalidArgument(f"the log folder {folder!r} has no readable {CHECKPOINT_FILE}") from exc
    found = []
    for name in sorted(names):
        match = _LOG_FILE.fullmatch(name)
        if match is None:
            continue
        stem = os.path.join(folder, match["base"])
        for suffix in (".index", ".timeindex"):
            if match["base"] + suffix not in names:
                raise InvalidArgument(f"the log {stem}.log has no {suffix} file")
        optional = {
            s: f"{stem}{s}" if match["base"] + s in names else None for s in (".txnindex", ".snapshot")
        }
        data = LogSegmentData(
            log=f"{stem}.log",
            offset_index=f"{stem}.index",
            time_index=f"{stem}.timeindex",
            leader_epoch_checkpoint=checkpoint,
            transaction_index=optional[".txnindex"],
            producer_snapshot=optional[".snapshot"],
        )
        found.append(LocalSegment(int(match["base"]), data))
    return found


@dataclass(slots=True)
class CopyReport:
    """What ``copy_rolled_segments`` did."""

    copied: list[RemoteLogSegmentMetadata] = field(default_factory=list)
    #: Unfinished uploads (and unfinished deletes) of earlier runs, now deleted.
    cleaned: list[uuid.UUID] = field(default_factory=list)
    #: Segments already remote, or not yet below the last stable offset.
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
    """KIP-405's RLM on one SLTS container (the owner; a read-only instance can fetch)."""

    def __init__(
        self,
        storage: ChunkedSegmentStorage,
        *,
        broker_id: int = 0,
        clock: Callable[[], float] = time.time,
        rsm: RemoteStorageManager | None = None,
        offset_indexes: OffsetIndexCache | None = None,
    ) -> None:
        if not isinstance(storage, ChunkedSegmentStorage):
            raise InvalidArgument(f"{storage!r} is not a ChunkedSegmentStorage")
        if isinstance(broker_id, bool) or not isinstance(broker_id, int) or broker_id < 0:
            raise InvalidArgument(f"broker id {broker_id!r} is not a non-negative integer")
        self.rlmm = RemoteLogMetadataManager(storage)
        self.rsm = rsm if rsm is not None else RemoteStorageManager(storage)
        self.offset_indexes = offset_indexes if offset_indexes is not None else OffsetIndexCache()
        self.broker_id = broker_id
        self._clock = clock

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    # -- copy -------------------------------------------------------------------------------------

    def copy_rolled_segments(
        self, tp: TopicPartition, segments: Iterable[LocalSegment], last_stable_offset: int
    ) -> CopyReport:
        """Copy every segment of ``segments`` not yet remote whose end offset is below
        ``last_stable_offset``, oldest first (see module doc). Stops at the first segment
        that is not below it. Raises ``InvalidLogSegment`` (that segment and later ones
        are not copied; earlier ones are), ``InvalidArgument``, ``Fenced``,
        ``ReadOnlyInstance``, storage errors (the STARTED entry is cleaned up next run)."""
        _check_tp(tp)
        check_offset(last_stable_offset, f"{tp}: last stable offset")
        try:
            given = list(segments)
        except TypeError as exc:
            raise InvalidArgument(f"{tp}: segments must be an iterable of LocalSegment") from exc
        if not all(isinstance(s, LocalSegment) for s in given):
            raise InvalidArgument(f"{tp}: segments must be LocalSegment objects")
        ordered = sorted(given, key=lambda s: s.base_offset)
        report = CopyReport(cleaned=self.cleanup(tp))
        highest = self.rlmm.highest_offset(tp)
        pending: list[LocalSegment] = []
        for segment, following in zip(ordered, [*ordered[1:], None], strict=True):
            if following is not None and highest is not None and following.base_offset - 1 <= highest:
                report.skipped += 1  # its end is known without reading it: already remote
            else:
                pending.append(segment)
        with ThreadPoolExecutor(1, thread_name_prefix="slts-remote-inspect") as read_ahead:
            inspections = [self._inspect_later(read_ahead, tp, segment) for segment in pending[:1]]
            for number, segment in enumerate(pending):
                inspected = inspections[number].result()
                if number + 1 < len(pending):  # the next file is checked while this one is written
                    inspections.append(self._inspect_later(read_ahead, tp, pending[number + 1]))
                summary = inspected.summary
                if highest is not None and summary.end_offset <= highest:
                    report.skipped += 1
                    continue
                if summary.end_offset >= last_stable_offset:
                    report.skipped += len(pending) - number
                    break
                report.copied.append(self._copy(tp, segment, inspected))
                highest = summary.end_offset
        return report

    def _inspect_later(
        self, pool: ThreadPoolExecutor, tp: TopicPartition, segment: LocalSegment
    ) -> Future[InspectedLog]:
        label = f"{tp} segment {segment.base_offset:020d}"
        return pool.submit(inspect_segment, segment.data, label=label, size_bytes=None)

    def _copy(
        self, tp: TopicPartition, segment: LocalSegment, inspected: InspectedLog
    ) -> RemoteLogSegmentMetadata:
        """Record ``segment`` COPY_SEGMENT_STARTED, copy it, record it FINISHED."""
        summary = inspected.summary
        metadata = new_segment_metadata(
            tp,
            start_offset=summary.base_offset,
            end_offset=summary.end_offset,
            leader_epochs=_segment_epochs(summary),
            max_timestamp_ms=summary.max_timestamp,
            size_bytes=summary.size_bytes,
            broker_id=self.broker_id,
            event_timestamp_ms=self._now_ms(),
        )
        cut = [(e, s) for e, s in inspected.leader_epoch_checkpoint if s <= summary.end_offset]
        data = dataclasses.replace(
            segment.data, leader_epoch_checkpoint=kf.encode_leader_epoch_checkpoint(cut)
        )
        self.rlmm.add_segment(metadata)
        custom = self.rsm.copy_log_segment(metadata, data)
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
        unfinished = [
            m
            for m in self.rlmm.list_segments(tp)
            if m.segment_state in (SegmentState.COPY_SEGMENT_STARTED, SegmentState.DELETE_SEGMENT_STARTED)
        ]
        for metadata in unfinished:
            self._delete(metadata)
        return [m.id for m in unfinished]

    # -- fetch ------------------------------------------------------------------------------------

    def fetch(
        self,
        tp: TopicPartition,
        offset: int,
        max_bytes: int = FETCH_MAX_BYTES_DEFAULT,
        *,
        leader_epoch: int | None = None,
    ) -> FetchResult:
        """Whole record batches of ``tp`` from the one holding ``offset`` (see module doc).

        Raises ``RemoteOffsetOutOfRange`` (below the earliest or above the highest remote
        offset, or in no finished segment: naming partition and offset), ``InvalidArgument``,
        ``InvalidLogSegment`` (the remote bytes or index do not parse: damage)."""
        _check_tp(tp)
        check_offset(offset, f"{tp}: fetch offset")
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise InvalidArgument(f"{tp}: max_bytes {max_bytes!r} is not a positive integer")
        if leader_epoch is not None:
            check_epoch(leader_epoch)
        earliest, highest = self.rlmm.earliest_offset(tp), self.rlmm.highest_offset(tp)
        if earliest is None or highest is None or not earliest <= offset <= highest:
            raise RemoteOffsetOutOfRange(
                f"{tp}: offset {offset} is outside the remote log ({_span(earliest, highest)})",
                partition=str(tp),
                offset=offset,
                earliest=earliest,
                highest=highest,
            )
        records = bytearray()
        segments: list[uuid.UUID] = []
        position = offset
        while position <= highest and len(records) < max_bytes:
            metadata = self.rlmm.segment_for_offset(tp, position, leader_epoch if not segments else None)
            if metadata is None:
                if not segments:
                    raise RemoteOffsetOutOfRange(
                        f"{tp}: no remote segment holds offset {offset}"
                        + (f" under leader epoch {leader_epoch}" if leader_epoch is not None else ""),
                        partition=str(tp),
                        offset=offset,
                    )
                break  # a gap: the caller reads on from ``next_offset`` (local log, or later)
            after = self._read_batches(metadata, position, max_bytes, records)
            if after == position:  # its next batch is over the budget left
                break
            segments.append(metadata.id)
            position = after
        return FetchResult(bytes(records), offset, position, tuple(segments))

    def _read_batches(
        self, metadata: RemoteLogSegmentMetadata, offset: int, max_bytes: int, records: bytearray
    ) -> int:
        """Append to ``records`` the batches of ``metadata`` from the one holding ``offset``
        while the budget allows (always one, if ``records`` is empty); return the offset
        after the last batch appended."""
        label = f"{metadata.topic_partition} segment {metadata.id}"
        index = self.offset_indexes.get(
            metadata.id,
            metadata.start_offset,
            lambda: self.rsm.fetch_index(metadata, IndexType.OFFSET),
            segment=label,
        )
        start = index.position_for(offset)
        with self.rsm.fetch_log(metadata, start) as stream:
            batches = kf.iter_batches(
                stream.read,
                segment=label,
                start_position=start,
                block_bytes=min(max_bytes - len(records), kf.SCAN_BLOCK_BYTES),
            )
            for header, batch in batches:
                if header.last_offset < offset:
                    continue
                if records and len(records) + len(batch) > max_bytes:
                    return offset
                records += batch
                offset = header.last_offset + 1
                if len(records) >= max_bytes:
                    break
        return offset

    # -- retention --------------------------------------------------------------------------------

    def enforce_retention(
        self,
        tp: TopicPartition,
        *,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        now_ms: int | None = None,
    ) -> RetentionReport:
        """Delete what retention no longer keeps (see module doc); None: no limit of that
        kind. Raises ``InvalidArgument``, ``Fenced``, ``ReadOnlyInstance``, storage errors
        (what was not deleted yet is retried by the next run)."""
        _check_tp(tp)
        for value, what in ((retention_ms, "retention_ms"), (retention_bytes, "retention_bytes")):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise InvalidArgument(f"{tp}: {what} {value!r} is not a non-negative integer or None")
        now = self._now_ms() if now_ms is None else check_offset(now_ms, "now_ms")
        segments = list(self.rlmm.list_segments(tp))
        start = self.rlmm.earliest_offset(tp)
        live = [
            m
            for m in segments
            if m.segment_state == SegmentState.COPY_SEGMENT_FINISHED
            and self.rlmm.is_referenced(m)
            and (start is None or m.end_offset >= start)
        ]
        expired: list[RemoteLogSegmentMetadata] = []
        remaining = sum(m.size_bytes for m in live)
        for metadata in live:  # oldest first (the listing is by start offset)
            by_time = retention_ms is not None and metadata.max_timestamp_ms < now - retention_ms
            by_size = retention_bytes is not None and remaining - metadata.size_bytes >= retention_bytes
            if not (by_time or by_size):
                break
            expired.append(metadata)
            remaining -= metadata.size_bytes
        report = RetentionReport(log_start_offset=start)
        if expired:
            report.log_start_offset = self.rlmm.move_log_start_offset(tp, expired[-1].end_offset + 1)
        kept = {m.id for m in live[len(expired) :]}
        chosen = {m.id for m in expired}
        rest = [  # superseded, below the start, or a delete a crash interrupted; an upload
            # in progress (COPY_SEGMENT_STARTED) is the copy task's to finish or clean up
            m
            for m in segments
            if m.id not in chosen
            and m.id not in kept
            and m.segment_state != SegmentState.COPY_SEGMENT_STARTED
        ]
        for metadata in [*expired, *rest]:
            self._delete(metadata)
            report.deleted.append(metadata)
            report.bytes_deleted += metadata.size_bytes
        return report

    def delete_partition(self, tp: TopicPartition) -> RetentionReport:
        """Delete every remote segment of ``tp`` between its deletion markers, then forget
        the partition. Resumable: a repeat after a crash carries on."""
        _check_tp(tp)
        report = RetentionReport()
        state = self.rlmm.delete_state(tp)
        if state is None:
            self.rlmm.mark_partition(tp, PartitionDeleteState.DELETE_PARTITION_MARKED)
        self.rlmm.mark_partition(tp, PartitionDeleteState.DELETE_PARTITION_STARTED)
        for metadata in list(self.rlmm.list_segments(tp)):
            self._delete(metadata)
            report.deleted.append(metadata)
            report.bytes_deleted += metadata.size_bytes
        self.rlmm.mark_partition(tp, PartitionDeleteState.DELETE_PARTITION_FINISHED)
        return report

    def _delete(self, metadata: RemoteLogSegmentMetadata) -> None:
        """DELETE_SEGMENT_STARTED, the data, DELETE_SEGMENT_FINISHED (each step idempotent)."""
        self.rlmm.update_segment(
            metadata.id, SegmentState.DELETE_SEGMENT_STARTED, event_timestamp_ms=self._now_ms()
        )
        self.rsm.delete_log_segment(metadata)
        self.rlmm.update_segment(
            metadata.id, SegmentState.DELETE_SEGMENT_FINISHED, event_timestamp_ms=self._now_ms()
        )


def _check_tp(tp: object) -> None:
    if not isinstance(tp, TopicPartition):
        raise InvalidArgument(f"{tp!r} is not a TopicPartition")


def _segment_epochs(summary: kf.LogSummary) -> dict[int, int]:
    """The segment's leader epochs from its batches; batches before the first that carries
    an epoch (-1: none, an old message format) count to that first epoch, and a log with
    no epoch at all is epoch 0 (Kafka's default before any election)."""
    epochs = dict(summary.leader_epochs)
    if not epochs:
        return {0: summary.base_offset}
    first = min(epochs)
    epochs[first] = summary.base_offset
    return epochs


def _span(earliest: int | None, highest: int | None) -> str:
    return "empty" if earliest is None or highest is None else f"offsets {earliest}..{highest}"
