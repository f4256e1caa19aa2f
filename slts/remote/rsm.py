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

The RSM's contract is Kafka's (``RemoteStorageManager``'s javadoc and the cases of its
``LocalTieredStorageTest``, ported in ``tests/remote/test_rsm_kafka.py``):

* the files are opaque bytes: nothing is parsed, any bytes (an empty log too) are copied.
  Checking Kafka's formats is the caller's job, before it records the upload
  (``slts.remote.inspection``, which the remote log manager runs);
* ``copy_log_segment`` copies exactly bytes ``[0, size_bytes)`` of the log (the metadata's
  size: what the caller inspected; bytes appended later are not copied, a shorter file is
  an error) and every other file whole, all streamed in pieces of ``write_bytes``. A copy
  retried under the same id replaces what an earlier (partial or complete) copy of that
  id wrote; a copy that fails deletes what it wrote;
* ``fetch_log`` streams the log from a start position to an inclusive end position, or to
  the end of the data if that comes first; ``fetch_index`` returns one file whole;
* a segment or file that is not there (never copied, deleted, or deleted while a stream
  is read) is ``RemoteSegmentNotFound``, Kafka's ``RemoteResourceNotFoundException``;
* ``delete_log_segment`` deletes what there is: deleting absent files is not an error.

No whole segment is ever held in memory.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import io
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from slts.errors import (
    ChunkNotFound,
    InvalidArgument,
    InvalidLogSegment,
    InvalidOffset,
    RemoteSegmentNotFound,
    SegmentNotFound,
)
from slts.limiter import TrafficClass, traffic_class
from slts.remote.records import RemoteLogSegmentMetadata
from slts.remote.workers import executor
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.types import SegmentHandle

#: Bytes written per call while copying a log (bounded memory, few metadata commits).
WRITE_BYTES_DEFAULT = 8 << 20
#: Bytes read per call by a fetch stream.
READ_BYTES_DEFAULT = 1 << 20
#: Read handles of logs kept for ``read_log`` (all dropped when one more is needed).
LOG_HANDLES_MAX = 4096


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


class RemoteStorageManager:
    """KIP-405's RSM: remote log segments as SLTS segments of ``storage`` (the owner to
    copy or delete; a read-only instance can fetch)."""

    def __init__(
        self,
        storage: ChunkedSegmentStorage,
        *,
        write_bytes: int = WRITE_BYTES_DEFAULT,
        read_bytes: int = READ_BYTES_DEFAULT,
        threads: bool = True,
    ) -> None:
        if not isinstance(storage, ChunkedSegmentStorage):
            raise InvalidArgument(f"{storage!r} is not a ChunkedSegmentStorage")
        if not isinstance(threads, bool):
            raise InvalidArgument(f"threads must be True or False, got {threads!r}")
        for value, what in ((write_bytes, "write_bytes"), (read_bytes, "read_bytes")):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1 << 30:
                raise InvalidArgument(f"{what} must be an integer in 1..2**30, got {value!r}")
        self.storage = storage
        self.write_bytes = write_bytes
        self.read_bytes = read_bytes
        self.threads = threads
        self._log_handles: dict[bytes, SegmentHandle] = {}

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

    def copy_log_segment(self, metadata: RemoteLogSegmentMetadata, data: LogSegmentData) -> bytes | None:
        """Copy ``data`` into the segments of ``metadata``; return the RSM's custom
        metadata for the segment (None: SLTS needs none, the names derive from the id).

        The log's first ``metadata.size_bytes`` bytes are copied, the other files whole,
        as opaque bytes (see module doc). Anything an earlier copy of the same id wrote is
        replaced. Raises ``InvalidArgument`` (not a RemoteLogSegmentMetadata or
        LogSegmentData, a file missing or unreadable: nothing changed),
        ``InvalidLogSegment`` (the log file is shorter than ``size_bytes``: nothing
        changed, or, if it shrank during the copy, what was written is deleted again),
        storage errors (what was written is deleted again), ``Fenced``,
        ``ReadOnlyInstance``.
        """
        _check_metadata(metadata)
        _check_data(data)
        label = f"{metadata.topic_partition} segment {metadata.id}"
        sources: list[tuple[str | IndexType, str | os.PathLike[str]]] = [
            (LOG, data.log),
            (IndexType.OFFSET, data.offset_index),
            (IndexType.TIMESTAMP, data.time_index),
        ]
        sources += [
            (kind, path)
            for kind, path in (
                (IndexType.TRANSACTION, data.transaction_index),
                (IndexType.PRODUCER_SNAPSHOT, data.producer_snapshot),
            )
            if path is not None
        ]
        written: list[str] = []
        with contextlib.ExitStack() as files:
            opened = [
                (self.segment_name(metadata, kind), files.enter_context(_open(path, _what(kind))))
                for kind, path in sources
            ]
            length = os.fstat(opened[0][1].fileno()).st_size
            if length < metadata.size_bytes:
                raise InvalidLogSegment(
                    f"{label}: the log file {os.fspath(data.log)!r} holds {length} bytes, the metadata "
                    f"says {metadata.size_bytes}",
                    segment=label,
                    position=length,
                    offset=None,
                )
            try:
                self.delete_log_segment(metadata)  # a retry replaces what an earlier copy wrote
                self._copy_files(metadata, opened, data.leader_epoch_checkpoint, label, written)
            except BaseException:
                for name in written:
                    with contextlib.suppress(Exception):  # best effort: the original error matters
                        self.storage.delete(self.storage.open_write(name))
                raise
        return None

    def _copy_files(
        self,
        metadata: RemoteLogSegmentMetadata,
        opened: list[tuple[str, io.BufferedReader]],
        checkpoint: bytes,
        label: str,
        written: list[str],
    ) -> None:
        """Write every file at once: the indexes' metadata commits and fsyncs join the
        log's (group commit) instead of queueing behind it. Tiering is offload traffic for
        the chunk storage's limiter, in every copy thread."""
        (log_name, log), *others = opened
        with (
            traffic_class(TrafficClass.OFFLOAD),
            executor(len(opened) + 1, "slts-remote-copy", threads=self.threads) as pool,
        ):

            def submit(call: Callable[..., None], *args: Any) -> Future[None]:
                context = contextvars.copy_context()  # one per task: a context runs in one thread
                return pool.submit(lambda: context.run(call, *args))

            copies = [submit(self._copy_stream, log_name, log, metadata.size_bytes, label, written)]
            copies += [submit(self._copy_stream, name, file, None, label, written) for name, file in others]
            checkpoint_name = self.segment_name(metadata, IndexType.LEADER_EPOCH)
            copies.append(submit(self._copy_bytes, checkpoint_name, checkpoint, written))
        for copy in copies:  # every copy has finished; the first file's error in file order
            copy.result()

    def _copy_stream(
        self, name: str, file: io.BufferedReader, limit: int | None, label: str, written: list[str]
    ) -> None:
        """Copy ``file`` from its start: its first ``limit`` bytes, or all (None)."""
        self.storage.create(name)
        written.append(name)
        handle = self.storage.open_write(name)
        offset = 0
        while limit is None or offset < limit:
            want = self.write_bytes if limit is None else min(self.write_bytes, limit - offset)
            piece = file.read(want)
            if not piece:
                if limit is None:
                    break
                raise InvalidLogSegment(
                    f"{label}: the log file ended at {offset} bytes during the copy, the metadata "
                    f"says {limit}",
                    segment=label,
                    position=offset,
                    offset=None,
                )
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
        (inclusive, as Kafka's) or to the end of the data if that comes first (None: the
        end), read ``read_bytes`` at a time. A start at the end gives an empty stream.

        Raises ``InvalidArgument``; ``InvalidOffset`` (a position that is not an integer,
        a negative start, an end before the start: checked first, as Kafka does; a start
        past the end of the data); ``RemoteSegmentNotFound`` (never copied or deleted; a
        read of the stream raises it too if the segment is deleted meanwhile)."""
        _check_metadata(metadata)
        for value, what in ((start_position, "start position"), (end_position, "end position")):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise InvalidOffset(f"remote segment {metadata.id}: {what} {value!r} is not an integer")
        if start_position < 0 or (end_position is not None and end_position < start_position):
            raise InvalidOffset(
                f"remote segment {metadata.id}: positions {start_position}..{end_position} are not a "
                "range (the start must be >= 0 and the end, inclusive, at or after it)",
                offset=start_position,
            )
        name = self.segment_name(metadata, LOG)
        with _not_found_as_remote(self.storage, metadata, name):
            handle = self.storage.open_read(name)
            size = self.storage.info(name).length
        if start_position > size:
            raise InvalidOffset(
                f"remote segment {metadata.id}: start position {start_position} is past the end of its "
                f"log of {size} bytes",
                segment=name,
                offset=start_position,
            )
        stop = size if end_position is None else min(end_position + 1, size)
        raw = _SegmentStream(self.storage, metadata, handle, start_position, stop, self.read_bytes)
        return io.BufferedReader(raw, buffer_size=self.read_bytes)

    def read_log(self, metadata: RemoteLogSegmentMetadata, position: int, length: int) -> memoryview:
        """Bytes ``[position, position + length)`` of ``metadata``'s log, in one ranged
        read of the engine (which reads and checks only the checksum blocks the range
        touches): for a reader that knows the range it needs, the remote log manager's
        fetch, with no stream between. The range lies within ``metadata.size_bytes`` (the
        bytes copied). The log's read handle is kept from one call to the next.

        A read-only view (``ChunkedSegmentStorage.read_view``): of the chunk file's own
        pages where the binding maps its files (checked in place, not copied), else of
        the bytes read. Whoever keeps bytes beyond the call copies what it keeps.

        Raises ``InvalidArgument``; ``InvalidOffset`` (a range outside the log);
        ``RemoteSegmentNotFound`` (never copied or deleted, before or under the read);
        ``InvalidLogSegment`` (the stored log is shorter than the metadata says: damage);
        the engine's read errors (``ChunkCorrupted``: bytes that fail their checksum)."""
        handle = self._log_handles.get(metadata.segment_id)
        if handle is None:
            _check_metadata(metadata)
            handle = self._open_log(metadata)
        if not (type(position) is int and type(length) is int and 0 <= position <= position + length):
            raise InvalidOffset(
                f"remote segment {metadata.id}: no range of {length!r} bytes at {position!r}", offset=position
            )
        if position + length > metadata.size_bytes:
            raise InvalidOffset(
                f"remote segment {metadata.id}: a read of {length} at {position} passes the end of its "
                f"log of {metadata.size_bytes} bytes",
                segment=handle.name,
                offset=position,
            )
        try:
            return self.storage.read_view(handle, position, length)
        except (SegmentNotFound, ChunkNotFound) as exc:
            self._log_handles.pop(metadata.segment_id, None)
            if isinstance(exc, ChunkNotFound) and self.storage.exists(handle.name):
                raise  # a chunk missing under a segment that exists: data loss
            raise _not_found(metadata, handle.name) from exc
        except InvalidOffset as exc:
            raise InvalidLogSegment(
                f"remote segment {metadata.id} of {metadata.topic_partition}: its stored log is shorter "
                f"than the {metadata.size_bytes} bytes its metadata records",
                segment=handle.name,
                position=position,
                offset=None,
            ) from exc

    def _open_log(self, metadata: RemoteLogSegmentMetadata) -> SegmentHandle:
        name = self.segment_name(metadata, LOG)
        with _not_found_as_remote(self.storage, metadata, name):
            handle = self.storage.open_read(name)
        if len(self._log_handles) >= LOG_HANDLES_MAX:
            self._log_handles.clear()
        self._log_handles[metadata.segment_id] = handle
        return handle

    def fetch_index(self, metadata: RemoteLogSegmentMetadata, index_type: IndexType) -> bytes:
        """The whole file ``index_type`` of ``metadata``, read ``read_bytes`` at a time.

        Raises ``InvalidArgument``; ``RemoteSegmentNotFound`` (the segment was never
        copied or was deleted, or was copied without that file: a segment without a
        transaction index or producer snapshot has none, as in Kafka)."""
        _check_metadata(metadata)
        if not isinstance(index_type, IndexType):
            raise InvalidArgument(f"{index_type!r} is not an IndexType")
        name = self.segment_name(metadata, index_type)
        with _not_found_as_remote(self.storage, metadata, name):
            handle = self.storage.open_read(name)
            length = self.storage.info(name).length
            pieces = [
                self.storage.read(handle, offset, min(self.read_bytes, length - offset))
                for offset in range(0, length, self.read_bytes)
            ]
        return b"".join(pieces)

    # -- delete -----------------------------------------------------------------------------------

    def delete_log_segment(self, metadata: RemoteLogSegmentMetadata) -> int:
        """Delete every segment of ``metadata`` there is; return how many. Idempotent, as
        Kafka's contract says: files already gone (a retry after a partial delete, a
        segment never copied) are not an error. The chunks go to the GC queue.
        Raises ``InvalidArgument``, ``Fenced``, ``ReadOnlyInstance``, storage errors (retry)."""
        _check_metadata(metadata)
        deleted = 0
        self._log_handles.pop(metadata.segment_id, None)
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
        _check_metadata(metadata)
        return list(self.storage.list(self.folder(metadata) + "/"))


class _SegmentStream(io.RawIOBase):
    """Bytes ``[position, stop)`` of a segment, read on demand, at most ``piece`` per read."""

    def __init__(
        self,
        storage: ChunkedSegmentStorage,
        metadata: RemoteLogSegmentMetadata,
        handle: SegmentHandle,
        position: int,
        stop: int,
        piece: int,
    ) -> None:
        super().__init__()
        self._storage, self._metadata, self._handle = storage, metadata, handle
        self._position, self._stop, self._piece = position, stop, piece

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        count = min(len(buffer), self._stop - self._position, self._piece)
        if count <= 0:
            return 0
        with _not_found_as_remote(self._storage, self._metadata, self._handle.name):
            data = self._storage.read(self._handle, self._position, count)
        assert len(data) == count, (len(data), count)
        buffer[:count] = data
        self._position += count
        return count


@contextlib.contextmanager
def _not_found_as_remote(
    storage: ChunkedSegmentStorage, metadata: RemoteLogSegmentMetadata, name: str
) -> Iterator[None]:
    """Storage's "no such segment" inside as ``RemoteSegmentNotFound``: the segment is not
    there, or was deleted under a read (its chunks collected: ``ChunkNotFound`` while the
    segment is gone). A chunk missing under a segment that still exists is data loss and
    stays ``ChunkNotFound``."""
    try:
        yield
    except SegmentNotFound as exc:
        raise _not_found(metadata, name) from exc
    except ChunkNotFound as exc:
        if storage.exists(name):
            raise
        raise _not_found(metadata, name) from exc


def _not_found(metadata: RemoteLogSegmentMetadata, name: str) -> RemoteSegmentNotFound:
    part = name.rsplit("/", 1)[-1]
    return RemoteSegmentNotFound(
        f"remote segment {metadata.id} of {metadata.topic_partition}: no {part!r} in the store "
        "(never copied, copied without it, or deleted)",
        segment=str(metadata.id),
        partition=str(metadata.topic_partition),
        name=name,
    )


def _check_metadata(metadata: object) -> None:
    if not isinstance(metadata, RemoteLogSegmentMetadata):
        raise InvalidArgument(f"{metadata!r} is not a RemoteLogSegmentMetadata")


def _check_data(data: object) -> None:
    if not isinstance(data, LogSegmentData):
        raise InvalidArgument(f"{data!r} is not a LogSegmentData")
    for path, what in (
        (data.log, "log"),
        (data.offset_index, "offset_index"),
        (data.time_index, "time_index"),
        (data.transaction_index, "transaction_index"),
        (data.producer_snapshot, "producer_snapshot"),
    ):
        if not isinstance(path, str | os.PathLike) and not (path is None and what in _OPTIONAL):
            raise InvalidArgument(f"LogSegmentData.{what} {path!r} is not a path")
    if not isinstance(data.leader_epoch_checkpoint, bytes):
        raise InvalidArgument("LogSegmentData.leader_epoch_checkpoint must be the checkpoint file's bytes")


_OPTIONAL = ("transaction_index", "producer_snapshot")


def _what(kind: str | IndexType) -> str:
    return kind.value if isinstance(kind, IndexType) else kind


def _open(path: str | os.PathLike[str], what: str) -> io.BufferedReader:
    try:
        return open(path, "rb")
    except OSError as exc:
        raise InvalidArgument(f"cannot read the {what} file {os.fspath(path)!r}: {exc.strerror}") from exc
