"""The remote storage manager (KIP-405 RSM) on SLTS segments.

A remote log segment is a set of ordinary SLTS segments, one per file, under one folder
named by its partition, start offset and id::

    remote/<topic (first 40 characters)>-<partition>/<start offset, 20 digits>-<id hex>/log
                                                                                     /index
                                                                                     /timeindex
                                                                                     /txnindex       (if any)
                                                                                     /snapshot       (if any)
                                                                                     /leader-epoch-checkpoint

so defrag, GC, verify, scrub and the durable metadata copy apply to them as to any
segment, and deleting one only queues its chunks for the GC (a failed chunk delete is
retried by the GC, never forgotten). Each file is sealed once copied.

``copy_log_segment`` checks its input before it writes anything (``inspect``): every
batch of the log parses and passes its CRC, the log's first and last offsets and size
match the metadata, the offset index points at batch starts within its segment, the
time index stays within the segment's offsets and the leader-epoch checkpoint parses.
Bad input raises ``InvalidLogSegment`` naming partition, segment and position/offset,
and nothing is written. A copy that fails later (storage) deletes what it wrote. The log
is written in pieces of ``write_bytes`` and read back as a stream (``fetch_log``): no
whole segment is ever held in memory. Indexes are small (Kafka caps them at 10 MiB) and
are returned whole.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import io
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from slts.errors import InvalidArgument, InvalidLogSegment, InvalidOffset, SegmentNotFound
from slts.limiter import TrafficClass, traffic_class
from slts.remote import kafka_formats as kf
from slts.remote.records import RemoteLogSegmentMetadata
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.types import SegmentHandle

#: Bytes written per call while copying a log (bounded memory, few metadata commits).
WRITE_BYTES_DEFAULT = 8 << 20
#: Bytes read per call by a fetch stream.
READ_BYTES_DEFAULT = 1 << 20
#: Kafka's cap on an index file (segment.index.bytes default): indexes are read whole.
INDEX_BYTES_MAX = 64 << 20


class IndexType(enum.Enum):
    """The files of a remote log segment besides its log (KIP-405 ``IndexType``)."""

    OFFSET = "index"
    TIMESTAMP = "timeindex"
    TRANSACTION = "txnindex"
    PRODUCER_SNAPSHOT = "snapshot"
    LEADER_EPOCH = "leader-epoch-checkpoint"


LOG = "log"


@dataclass(frozen=True, slots=True)
class LogSegmentData:
    """The local files of one rolled log segment (KIP-405 ``LogSegmentData``): paths of
    the log and its indexes, and the leader-epoch checkpoint's bytes up to the segment's
    end (the broker's cache, cut there)."""

    log: str | os.PathLike[str]
    offset_index: str | os.PathLike[str]
    time_index: str | os.PathLike[str]
    leader_epoch_checkpoint: bytes
    transaction_index: str | os.PathLike[str] | None = None
    producer_snapshot: str | os.PathLike[str] | None = None


@dataclass(frozen=True, slots=True)
class InspectedLog:
    """What ``inspect`` learned from a segment's files, all checked."""

    summary: kf.LogSummary
    batches: int
    leader_epoch_checkpoint: list[tuple[int, int]]


class RemoteStorageManager:
    """KIP-405's RSM: remote log segments as SLTS segments of ``storage`` (the owner to
    copy or delete; a read-only instance can fetch)."""

    def __init__(
        self,
        storage: ChunkedSegmentStorage,
        *,
        write_bytes: int = WRITE_BYTES_DEFAULT,
        read_bytes: int = READ_BYTES_DEFAULT,
    ) -> None:
        if not isinstance(storage, ChunkedSegmentStorage):
            raise InvalidArgument(f"{storage!r} is not a ChunkedSegmentStorage")
        for value, what in ((write_bytes, "write_bytes"), (read_bytes, "read_bytes")):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1 << 30:
                raise InvalidArgument(f"{what} must be an integer in 1..2**30, got {value!r}")
        self.storage = storage
        self.write_bytes = write_bytes
        self.read_bytes = read_bytes

    # -- names -----------------------------------------------------------------------------------

    @staticmethod
    def folder(metadata: RemoteLogSegmentMetadata) -> str:
        """The folder of ``metadata``'s segments (see module doc)."""
        partition = f"{metadata.topic[:40]}-{metadata.partition}"
        return f"remote/{partition}/{metadata.start_offset:020d}-{metadata.id.hex}"

    def segment_name(self, metadata: RemoteLogSegmentMetadata, kind: IndexType | str = LOG) -> str:
        """The SLTS segment holding ``kind`` (``LOG`` or an ``IndexType``) of ``metadata``."""
        _check_metadata(metadata)
        part = kind.value if isinstance(kind, IndexType) else kind
        if part != LOG and part not in {index.value for index in IndexType}:
            raise InvalidArgument(f"{kind!r} is not 'log' or an IndexType")
        return f"{self.folder(metadata)}/{part}"

    # -- copy -------------------------------------------------------------------------------------

    def inspect(self, data: LogSegmentData, *, label: str = "") -> InspectedLog:
        """Check every file of ``data`` (see module doc) and summarise the log; reads each
        file once, in blocks of ``kf.SCAN_BLOCK_BYTES``. ``label`` names the segment in errors.
        Raises ``InvalidLogSegment``, ``InvalidArgument`` (not a LogSegmentData, a file
        missing or unreadable)."""
        if not isinstance(data, LogSegmentData):
            raise InvalidArgument(f"{data!r} is not a LogSegmentData")
        label = label or os.fspath(data.log)
        headers: list[kf.BatchHeader] = []
        with _open(data.log, "log") as file:
            for header, _ in kf.iter_batches(file.read, segment=label, block_bytes=kf.SCAN_BLOCK_BYTES):
                headers.append(header)
        summary = kf.summarize(headers, segment=label)
        base = summary.base_offset
        offsets = kf.parse_offset_index(_read_small(data.offset_index, "offset index"), base, segment=label)
        kf.check_offset_index(offsets, headers, segment=label)
        for entry in kf.parse_time_index(_read_small(data.time_index, "time index"), base, segment=label):
            if not base <= entry.offset <= summary.end_offset:
                raise InvalidLogSegment(
                    f"{label}: time index entry for offset {entry.offset} is outside the log's "
                    f"offsets {base}..{summary.end_offset}",
                    segment=label,
                    offset=entry.offset,
                )
        if not isinstance(data.leader_epoch_checkpoint, bytes):
            raise InvalidArgument("leader_epoch_checkpoint must be the checkpoint file's bytes")
        checkpoint = kf.parse_leader_epoch_checkpoint(data.leader_epoch_checkpoint, segment=label)
        return InspectedLog(summary, len(headers), checkpoint)

    def copy_log_segment(
        self,
        metadata: RemoteLogSegmentMetadata,
        data: LogSegmentData,
        *,
        inspected: InspectedLog | None = None,
    ) -> bytes | None:
        """Copy ``data`` into the segments of ``metadata``; return the RSM's custom
        metadata for the segment (None: SLTS needs none, the names derive from the id).

        ``inspected`` is ``inspect(data)``'s result if the caller already has it (the
        remote log manager does); otherwise the files are inspected first. Raises
        ``InvalidLogSegment`` (bad files, or files that disagree with ``metadata``:
        nothing written), ``SegmentExists`` (this id was copied before), storage errors
        (what was written is deleted again), ``Fenced``, ``ReadOnlyInstance``.
        """
        _check_metadata(metadata)
        label = f"{metadata.topic_partition} segment {metadata.id}"
        inspected = inspected if inspected is not None else self.inspect(data, label=label)
        summary = inspected.summary
        if (summary.base_offset, summary.end_offset, summary.size_bytes) != (
            metadata.start_offset,
            metadata.end_offset,
            metadata.size_bytes,
        ):
            raise InvalidLogSegment(
                f"{label}: the log holds offsets {summary.base_offset}..{summary.end_offset} in "
                f"{summary.size_bytes} bytes, the metadata says {metadata.start_offset}.."
                f"{metadata.end_offset} in {metadata.size_bytes}",
                segment=label,
                offset=summary.base_offset,
            )
        written: list[str] = []
        files = [
            (IndexType.OFFSET, data.offset_index),
            (IndexType.TIMESTAMP, data.time_index),
            (IndexType.TRANSACTION, data.transaction_index),
            (IndexType.PRODUCER_SNAPSHOT, data.producer_snapshot),
        ]
        present = [(kind, path) for kind, path in files if path is not None]
        try:
            # The files are written at once: the indexes' metadata commits and fsyncs join
            # the log's (group commit) instead of queueing behind it.
            # Tiering is offload traffic for the chunk storage's limiter, in every copy thread.
            with (
                traffic_class(TrafficClass.OFFLOAD),
                ThreadPoolExecutor(len(present) + 2, thread_name_prefix="slts-remote-copy") as pool,
            ):

                def submit(call: Callable[..., None], *args: Any) -> Future[None]:
                    context = contextvars.copy_context()  # one per task: a context runs in one thread
                    return pool.submit(lambda: context.run(call, *args))

                copies = [submit(self._copy_log, self.segment_name(metadata, LOG), data.log, written)]
                copies += [
                    submit(self._copy_file, self.segment_name(metadata, kind), path, kind, written)
                    for kind, path in present
                ]
                copies.append(
                    submit(
                        self._copy_bytes,
                        self.segment_name(metadata, IndexType.LEADER_EPOCH),
                        data.leader_epoch_checkpoint,
                        written,
                    )
                )
            for copy in copies:  # every copy has finished; the first file's error in file order
                copy.result()
        except BaseException:
            for name in written:
                with contextlib.suppress(Exception):  # best effort: the original error matters
                    self.storage.delete(self.storage.open_write(name))
            raise
        return None

    def _copy_log(self, name: str, path: str | os.PathLike[str], written: list[str]) -> None:
        with _open(path, "log") as file:
            self._copy_stream(name, file, written)

    def _copy_file(
        self, name: str, path: str | os.PathLike[str], kind: IndexType, written: list[str]
    ) -> None:
        self._copy_bytes(name, _read_small(path, kind.value), written)

    def _copy_stream(self, name: str, file: io.BufferedIOBase, written: list[str]) -> None:
        self.storage.create(name)
        written.append(name)
        handle = self.storage.open_write(name)
        offset = 0
        while piece := file.read(self.write_bytes):
            self.storage.write(handle, offset, piece)
            offset += len(piece)
        self.storage.seal(handle)

    def _copy_bytes(self, name: str, data: bytes, written: list[str]) -> None:
        self.storage.create(name)
        written.append(name)
        handle = self.storage.open_write(name)
        if data:
            self.storage.write(handle, 0, data)
        self.storage.seal(handle)

    # -- fetch ------------------------------------------------------------------------------------

    def fetch_log(
        self, metadata: RemoteLogSegmentMetadata, start_position: int, end_position: int | None = None
    ) -> io.BufferedReader:
        """A stream of the log's bytes from ``start_position`` to ``end_position``
        (inclusive, as Kafka's; None: the end), read ``read_bytes`` at a time.

        Raises ``InvalidOffset`` (positions outside the log or end before start),
        ``SegmentNotFound`` (not copied, or deleted)."""
        handle = self.storage.open_read(self.segment_name(metadata, LOG))
        size = self.storage.info(handle.name).length
        for value, what in ((start_position, "start position"), (end_position, "end position")):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise InvalidOffset(f"{what} {value!r} is not an integer", segment=handle.name)
        end = size - 1 if end_position is None else end_position
        if not 0 <= start_position < size or not start_position <= end < size:
            raise InvalidOffset(
                f"remote segment {metadata.id}: positions {start_position}..{end} are outside its "
                f"log of {size} bytes",
                segment=handle.name,
                offset=start_position,
            )
        raw = _SegmentStream(self.storage, handle, start_position, end + 1)
        return io.BufferedReader(raw, buffer_size=self.read_bytes)

    def fetch_index(self, metadata: RemoteLogSegmentMetadata, index_type: IndexType) -> bytes:
        """The whole index ``index_type`` of ``metadata``. Raises ``InvalidArgument``,
        ``SegmentNotFound`` (never copied: a segment without a transaction index has
        none, or the segment was deleted)."""
        if not isinstance(index_type, IndexType):
            raise InvalidArgument(f"{index_type!r} is not an IndexType")
        handle = self.storage.open_read(self.segment_name(metadata, index_type))
        length = self.storage.info(handle.name).length
        return self.storage.read(handle, 0, length) if length else b""

    # -- delete -----------------------------------------------------------------------------------

    def delete_log_segment(self, metadata: RemoteLogSegmentMetadata) -> int:
        """Delete every segment of ``metadata`` there is; return how many. Idempotent: a
        retry after a partial delete deletes the rest. The chunks go to the GC queue.
        Raises ``Fenced``, ``ReadOnlyInstance``, storage errors (retry)."""
        deleted = 0
        for kind in (LOG, *IndexType):
            name = self.segment_name(metadata, kind)
            try:
                self.storage.delete(self.storage.open_write(name))
            except SegmentNotFound:
                continue
            deleted += 1
        return deleted

    def copied_names(self, metadata: RemoteLogSegmentMetadata) -> list[str]:
        """The segments of ``metadata`` that exist now."""
        return list(self.storage.list(self.folder(metadata) + "/"))


class _SegmentStream(io.RawIOBase):
    """Bytes ``[position, stop)`` of a segment, read on demand."""

    def __init__(
        self, storage: ChunkedSegmentStorage, handle: SegmentHandle, position: int, stop: int
    ) -> None:
        super().__init__()
        self._storage, self._handle = storage, handle
        self._position, self._stop = position, stop

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        count = min(len(buffer), self._stop - self._position)
        if count <= 0:
            return 0
        data = self._storage.read(self._handle, self._position, count)
        assert len(data) == count, (len(data), count)
        buffer[:count] = data
        self._position += count
        return count


def _check_metadata(metadata: object) -> None:
    if not isinstance(metadata, RemoteLogSegmentMetadata):
        raise InvalidArgument(f"{metadata!r} is not a RemoteLogSegmentMetadata")


def _open(path: str | os.PathLike[str], what: str) -> io.BufferedReader:
    try:
        return open(path, "rb")
    except OSError as exc:
        raise InvalidArgument(f"cannot read the {what} file {os.fspath(path)!r}: {exc.strerror}") from exc


def _read_small(path: str | os.PathLike[str], what: str) -> bytes:
    with _open(path, what) as file:
        data = file.read(INDEX_BYTES_MAX + 1)
    if len(data) > INDEX_BYTES_MAX:
        raise InvalidArgument(f"the {what} file {os.fspath(path)!r} is over {INDEX_BYTES_MAX} bytes")
    return data
