"""ChunkedSegmentStorage: segments as linked lists of chunks (PDP-34, DESIGN.md §5).

Invariants this module keeps (numbers as in DESIGN.md §5; tests cite them):

1. A segment's readable bytes ``[start_offset, length)`` are its chunks' bytes in list
   order, the first chunk trimmed by ``first_chunk_start_offset``.
2. Data first, metadata second: a chunk's bytes are durable before the commit that
   references them; every referenced chunk holds at least its recorded length.
3. Chunk names are unique and never reused; this instance appends only to chunks it
   created itself in this epoch, and never to one after a failed write or commit.
4. Every commit is fenced by the container epoch (``Ownership``); a segment's length
   comes only from committed metadata, never from the chunk storage.
6. An acknowledged write is durable; a failed write leaves no visible trace and its
   chunk (if any) stays in the GC queue as an ``intent`` entry.

Locking (``slts.storage.segment_locks``): each segment in use has a change lock, held by
one changer at a time for its whole operation (a ``write`` across its data I/O, which
keeps one writer per segment), and a layout lock, held only while its records are read
as a whole or committed. Unrelated segments never share a lock; a read waits for a
commit of its segment, never for a write's data I/O or sync.
"""

from __future__ import annotations

import builtins
import contextvars
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import NamedTuple

import crc32c

from slts.bindings.base import ChunkAppend, ChunkHandle, ChunkStorage
from slts.buffers import filled_bytes
from slts.config import INTEGER_MAX, StorageConfig
from slts.errors import (
    ChunkCorrupted,
    ChunkNotFound,
    Fenced,
    InvalidArgument,
    InvalidName,
    InvalidOffset,
    InvariantViolated,
    MetadataCorrupted,
    ReadOnlyInstance,
    SegmentExists,
    SegmentSealed,
    SegmentTruncated,
    SltsError,
    StorageClosed,
    VersionConflict,
    WriteExpired,
)
from slts.gc import GarbageCollector, queue_entry
from slts.journal import identity
from slts.journal import replay as journal_replay
from slts.journal.durable_copy import DurableCopy
from slts.limiter import PriorityLimiter
from slts.metadata import index
from slts.metadata.cache import CachedMetadataStore
from slts.metadata.group_commit import GroupCommitter
from slts.metadata.ownership import EPOCH_MAX, Ownership, ReadOnlyOwnership
from slts.metadata.records import ChunkRecord, DecodedRecords, GcReason, SegmentRecord, SegmentStatus
from slts.metadata.schema import CHUNKS, CLIENT_TABLES, DELETED, GC, INDEX, SEGMENTS, name_key, segment_id_key
from slts.metadata.store import Delete, Expect, MetadataStore, Operation, Put, ReadView, prefix_stop
from slts.storage import block_checksums, layout_changes
from slts.storage.ahead_intents import AheadIntent, AheadIntents
from slts.storage.chunk_transforms import ChunkTransforms, Encoded, StoredKey
from slts.storage.context import EngineContext, SegmentIds
from slts.storage.gate import GatedChunkStorage
from slts.storage.leaks import LeakReport, find_leaks
from slts.storage.read_ahead import Plan, ReadAhead, ReadAheadStatistics
from slts.storage.resolved_layouts import Extent, ResolvedLayouts
from slts.storage.segment_names import check_segment_name, chunk_name
from slts.storage.types import DefragResult, SegmentHandle, SegmentInfo, StorageStatistics
from slts.transforms.keys import KeyRing
from slts.usage import UsageMeter

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _NewChunk:
    name: str
    start: int  # segment offset where the chunk starts
    data: bytes


class _Append(NamedTuple):
    """A write combined with others (``_combine_appends``): the segment as its writer read it
    under its change lock, its last chunk (record, version), which receives all of
    ``data``."""

    record: SegmentRecord
    version: int
    last: tuple[ChunkRecord, int]
    data: bytes


class _InFlight:
    """How many threads are inside a ``with`` block of it now."""

    __slots__ = ("_count", "_lock")

    def __init__(self) -> None:
        self._count = 0
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        with self._lock:
            self._count += 1

    def __exit__(self, *exc_info: object) -> None:
        with self._lock:
            self._count -= 1
            assert self._count >= 0

    def alone(self) -> bool:
        """Whether the caller (inside a block) is the only one inside now (a hint: it may
        change at once)."""
        return self._count <= 1


class _ReadPiece(NamedTuple):  # a tuple: every read makes one or more (cheaper than a dataclass)
    chunk: str
    chunk_offset: int
    length: int
    whole_chunk_checksum: int | None  # set when the piece is the whole chunk and it has no blocks
    blocks: bytes | None  # the chunk's block checksums, when reads verify them
    frames: bytes | None = None  # a transformed chunk's frame map (its frames check themselves)
    data_keys: tuple[StoredKey, ...] | None = None  # and its wrapped data keys


#: Where a read resolves its layout: the instance's (cached) store, or one snapshot's view.
RecordSource = MetadataStore | ReadView


def _checksum(data: bytes | memoryview, previous: int = 0) -> int:
    return crc32c.crc32c(data, previous)


#: From this many bytes, a write's checksums are computed on a helper thread while its
#: data is written and synced (CRC32C releases the GIL; so does the sync). They cost
#: about 0.08 ms per MiB here (two CRC32C passes: the chunk's and its blocks'), taken off
#: the write's latency; below this size that is less than handing them over costs.
PARALLEL_CHECKSUM_BYTES_MIN = 256 << 10
#: Writes below this many bytes that append all their bytes to their segment's last chunk
#: are combined across writers (``_combine_appends``: their syncs shared). Larger ones
#: are bound by bandwidth, not by syncs, and compute their checksums beside their I/O.
COMBINED_WRITE_BYTES_MAX = PARALLEL_CHECKSUM_BYTES_MIN - 1
#: From this many bytes of one chunk, a verified read of a local storage is read and
#: checked in parallel runs, one per core (``_read_checked``).
OVERLAPPED_CHECK_BYTES_MIN = 2 << 20
#: The same for blocks the binding holds locally (``_read_held``): no request to wait
#: for, so a read of any size is bound by its copy and its one checksum pass.
OVERLAPPED_HELD_BYTES_MIN = 2 << 20
_CORES = os.cpu_count() or 1
#: A read that starts where the extents it resolved end (``ResolvedLayouts.continues``)
#: resolves this many chunks past its range too: a sequential reader then pays one
#: resolve (an index seek and a chunk record per chunk, about 0.15 ms measured on a
#: chunk cache's hits of 1 MiB) per this many chunks rather than per chunk, and a random
#: reader, which seldom starts at a resolved end, pays nothing more.
RESOLVE_AHEAD_CHUNKS = 64


@dataclass(frozen=True, slots=True)
class _WriteSums:
    """The checksums a write's commit records: for the last chunk after ``appended``
    (whole-chunk CRC, block list), and for each new chunk."""

    appended: tuple[int | None, bytes | None]
    chunks: tuple[tuple[int | None, bytes | None], ...]


@dataclass(frozen=True, slots=True)
class _WritePlan:
    """What a write's commit makes readable, fixed before its data I/O: the bytes
    appended to the last chunk, the new chunks, their intents (and the version those
    were committed at), the intent registered ahead for the next write's chunk
    (``slts.storage.ahead_intents``), the checksums (None: ``checksums`` is off), and the
    caller's records committed with it."""

    appended: bytes
    new_chunks: list[_NewChunk]
    intents: list[Put]
    intent_version: int
    following: Put | None
    sums: _WriteSums | None
    #: The caller's own operations and expectations (``write``'s ``also`` and ``expect``).
    also: tuple[Operation, ...] = ()
    expect: tuple[Expect, ...] = ()
    #: With transforms on: what the appended bytes and each new chunk store, and the
    #: chunk records' fields after them (``sums`` is then None: these carry the checksums).
    appended_encoded: Encoded | None = None
    chunks_encoded: tuple[Encoded, ...] = ()


def _client_records(
    also: Sequence[Operation], expect: Sequence[Expect], segment: str
) -> tuple[tuple[Operation, ...], tuple[Expect, ...]]:
    """``write``'s ``also`` and ``expect``, checked: operations (``Put``, ``Delete``) and
    expectations on the clients' tables only (``CLIENT_TABLES``), keys and values bytes."""
    also, expect = tuple(also), tuple(expect)
    operations = all(isinstance(op, (Put, Delete)) for op in also)
    if not operations or not all(isinstance(e, Expect) for e in expect):
        raise InvalidArgument("also holds Put and Delete operations, expect holds Expect", segment=segment)
    for item in (*also, *expect):
        if (
            item.table not in CLIENT_TABLES
            or not isinstance(item.key, bytes)
            or (isinstance(item, Put) and not isinstance(item.value, bytes))
            or (isinstance(item, Expect) and type(item.version) is not int)
        ):
            raise InvalidArgument(
                f"a write commits records of the clients' tables {list(CLIENT_TABLES)} only (bytes keys and"
                f" values, integer versions), got {item!r}",
                segment=segment,
            )
    return also, expect


def _without_frames(error: BaseException) -> BaseException:
    """``error`` and the errors it chains to, without their tracebacks (whose frames
    may hold views of a buffer that is gone once the error is raised on)."""
    seen: set[int] = set()
    link: BaseException | None = error
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        link.__traceback__ = None
        link = link.__cause__ or link.__context__
    return error


def _exactly(data: bytes | memoryview, piece: _ReadPiece, how: str) -> bytes | memoryview:
    """``data`` if it is as long as ``piece``, else ``InvariantViolated`` (a bug that
    would return wrong bytes; an ``if``, so it holds under ``python -O``)."""
    if len(data) != piece.length:
        raise InvariantViolated(
            f"chunk {piece.chunk!r}: {len(data)} bytes {how} for a piece of {piece.length} "
            f"at {piece.chunk_offset}",
            chunk=piece.chunk,
            offset=piece.chunk_offset,
        )
    return data


def _write_sums(
    last: ChunkRecord | None, appended: bytes, new_chunks: Sequence[_NewChunk], block_bytes: int
) -> _WriteSums:
    """The checksums of a write (``checksums`` on): ``last`` receives ``appended``."""
    grown: tuple[int | None, bytes | None] = (None, None)
    if appended:
        assert last is not None
        grown = (
            _checksum(appended, last.checksum) if last.checksum is not None else None,
            block_checksums.extend(last.blocks, appended, block_bytes) if last.blocks is not None else None,
        )
    return _WriteSums(
        grown,
        tuple(
            (_checksum(chunk.data), block_checksums.compute(chunk.data, block_bytes)) for chunk in new_chunks
        ),
    )


def _cut_to_piece(checked: bytes | memoryview, piece: _ReadPiece, start: int) -> bytes | memoryview:
    """``piece``'s bytes out of ``checked``, the whole blocks around it from chunk offset ``start``."""
    cut = piece.chunk_offset - start
    return checked[cut : cut + piece.length] if cut or len(checked) != piece.length else checked


def _shorter_than_its_blocks(name: str, held: int, blocks_end: int) -> ChunkCorrupted:
    """The error for chunk ``name`` ending at ``held`` where its blocks reach ``blocks_end``."""
    return ChunkCorrupted(
        f"chunk {name!r} holds {held} bytes where its blocks hold {blocks_end}:"
        " its bytes are not the ones written",
        chunk=name,
        offset=held,
    )


class ChunkedSegmentStorage:
    """One container instance: segments on ``chunk_storage``, layout in ``metadata_store``.

    Construction starts the container with ``epoch`` (``None``: one above the recorded
    epoch) and fences every older instance (``Fenced`` if a newer epoch is recorded).
    Thread-safe. Operations that change a segment take a ``SegmentHandle`` from
    ``open_write``; reads take one from ``open_read`` or ``open_write``.
    ``owns_resources``: ``close`` also closes the binding and the store;
    ``owns_store`` (default: as ``owns_resources``) says so for the store alone.

    A defrag batch driver (``slts.storage.batch_defrag``) may commit a segment's new
    layout between this instance's read of it and its own commit: every change re-reads
    and retries then (``EngineContext.retry_conflicts``, ``commit_retries_max``), and
    raises ``VersionConflict`` (nothing changed; retry later) only if the segment kept
    moving through every attempt.
    """

    def __init__(
        self,
        container_id: int,
        epoch: int | None,
        chunk_storage: ChunkStorage,
        metadata_store: MetadataStore,
        config: StorageConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
        owns_resources: bool = False,
        owns_store: bool | None = None,
        read_only: bool = False,
        limiter: PriorityLimiter | None = None,
        key_ring: KeyRing | None = None,
    ) -> None:
        # Every argument is checked before anything is written (the epoch commit fences).
        if (
            isinstance(container_id, bool)
            or not isinstance(container_id, int)
            or not 0 <= container_id <= EPOCH_MAX
        ):
            raise InvalidArgument(
                f"container_id must be an integer in [0, {EPOCH_MAX}], got {container_id!r}"
            )
        if epoch is not None and (
            isinstance(epoch, bool) or not isinstance(epoch, int) or not 1 <= epoch <= EPOCH_MAX
        ):
            raise InvalidArgument(f"epoch must be an integer in [1, {EPOCH_MAX}] or None, got {epoch!r}")
        if config is not None and not isinstance(config, StorageConfig):
            raise InvalidArgument(f"config must be a StorageConfig, got {type(config).__name__}")
        if limiter is not None and not isinstance(limiter, PriorityLimiter):
            raise InvalidArgument(f"limiter must be a PriorityLimiter, got {type(limiter).__name__}")
        if not isinstance(chunk_storage, ChunkStorage):
            raise InvalidArgument(f"chunk_storage must be a ChunkStorage, got {type(chunk_storage).__name__}")
        #: What the container asks of its chunk storage (``slts.usage``; ``slts cost``).
        self.meter = UsageMeter()
        # Every user of the container's binding (engine, GC, journal, defrag) gets the gate.
        chunk_storage = GatedChunkStorage(chunk_storage, self.meter, limiter)
        self.config = config or StorageConfig()
        #: Client-side compression and encryption of chunks (docs/security.md): what a
        #: write stores of its bytes, and the decoding of a chunk's frames.
        self.transforms = ChunkTransforms(self.config, key_ring)
        self.container_id = container_id
        self.chunk_storage = chunk_storage
        self._clock = clock
        self.read_only = read_only
        self._ownership: Ownership | ReadOnlyOwnership
        if read_only:
            # An observer: no epoch of its own (it fences nobody). Its cache sees every
            # commit of the owner (another process) as foreign and drops what it holds.
            if epoch is not None:
                raise InvalidArgument("a read-only instance takes no epoch")
        elif self.config.journal:
            # Before the epoch commit, so that the tier-2 copy sees every commit from here on.
            metadata_store.enable_change_capture()
        # One store? (``slts.journal.identity``): checked before the epoch commit fences anyone.
        identity.settle(metadata_store, chunk_storage, container_id, read_only=read_only)
        if not read_only and self.config.journal:
            # An encrypted store's journal is sealed: without its key ring the boot would
            # fail after the epoch commit; fail before it, fencing nobody.
            journal_replay.check_keys(chunk_storage, container_id, self.transforms.record_seal)
        # The GC queue and the offset index change with every write but are read by scans
        # and floors, never by ``get`` on the hot path: their keys would only crowd the cache.
        self._store = CachedMetadataStore(
            metadata_store, self.config.metadata_cache_entries, uncached_tables=frozenset({GC, INDEX})
        )
        if read_only:
            self._ownership = ReadOnlyOwnership(metadata_store, container_id)
        else:
            self._ownership = Ownership(self._store, container_id, epoch, clock)
        self.epoch = self._ownership.epoch
        assert 0 <= self.epoch <= EPOCH_MAX, self.epoch
        self.gc = GarbageCollector(self._store, chunk_storage, self._ownership, self.config, clock)
        self._owns_binding = owns_resources
        self._owns_store = owns_resources if owns_store is None else owns_store
        self._metadata_store = metadata_store
        #: What the operation modules and the admin features share (``slts.storage.context``).
        self.context = EngineContext(
            container_id,
            self.epoch,
            self.config,
            chunk_storage,
            self._store,
            self._ownership,
            self.gc,
            clock,
            DecodedRecords(self.config.metadata_cache_entries),
            SegmentIds(self.epoch),
        )
        #: Thread pools made on first use, by purpose ("slts-read": burst reads of several
        #: chunks; "slts-checksum": large writes' checksums beside their data I/O), each
        #: of ``read_threads`` threads; ``close`` shuts them down.
        self._pools: dict[str, ThreadPoolExecutor] = {}
        self._pool_lock = threading.Lock()
        self._read_ahead = self._new_read_ahead()
        #: Chunk extents reads resolved, per segment record version (``_read_once``).
        self._layouts = ResolvedLayouts(self.config.metadata_cache_entries)
        self._leaks: LeakReport | None = None  # the last check_leaks() report
        #: Without append every write creates a chunk: its intent rides in the previous
        #: write's commit (``slts.storage.ahead_intents``), one commit per write.
        self._ahead = (
            AheadIntents(int(self.config.gc_delay_s * 500))
            if not read_only and not chunk_storage.supports_append
            else None
        )
        #: Writers inside ``write`` now: a write that is the only one runs alone (it would
        #: be a group of its own; a lone writer pays nothing for combining).
        self._writers = _InFlight()
        #: Small writes that append to their last chunk, combined across writers (their
        #: data syncs issued together, one metadata commit): ``_combine_appends``.
        self._appends: GroupCommitter[_Append, None] | None = (
            GroupCommitter(self._combine_appends, linger_s=self.config.combined_writes_linger_us / 1e6)
            if not read_only and chunk_storage.supports_append and self.config.combined_writes != "off"
            else None
        )
        self._closed = False
        #: The metadata's durable copy on tier-2 (DESIGN.md §6); None when read-only or
        #: when ``journal`` is off.
        self.durable: DurableCopy | None = None
        if not read_only and self.config.journal:
            self.durable = DurableCopy(
                self._store,
                chunk_storage,
                container_id,
                self.epoch,
                self.config,
                clock=clock,
                fence_check=self._ownership.check,
                discard_changes=self._ownership.discard_changes,
                seal=self.transforms.record_seal,
            )
            self.gc.barrier = self.durable.barrier
            if self.config.metadata_log_flush_interval_s > 0:
                self.durable.start(self.config.metadata_log_flush_interval_s)
        if not read_only and self.config.gc_interval_s > 0:
            self.gc.start(self.config.gc_interval_s)
        if self.config.usage_flush_interval_s > 0:
            self.meter.start(self.flush_usage, self.config.usage_flush_interval_s)

    # -- life cycle -------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop accepting operations; release threads (and the store/binding if owned).
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.gc.stop()
        with self._pool_lock:
            for pool in self._pools.values():
                pool.shutdown(wait=True)
        if self._read_ahead is not None:
            self._read_ahead.close()
        self.meter.stop()
        try:  # before the metadata copy's last flush, which takes it to tier-2
            self.flush_usage()
        except Fenced:  # a fenced instance writes nothing, its usage neither
            _log.warning(
                "chunk storage usage not recorded at close: container %d epoch %d was fenced; "
                "%d requests dropped",
                self.container_id,
                self.epoch,
                self.meter.drop_unflushed(),
            )
        except SltsError as exc:  # accounting: never a reason to fail a close
            _log.warning("chunk storage usage not recorded at close: %s", exc)
        if self.durable is not None:
            self.durable.close()
        assert isinstance(self.chunk_storage, GatedChunkStorage)
        self.chunk_storage.detach()
        if self._owns_store:
            self._metadata_store.close()
        if self._owns_binding:
            self.chunk_storage.close()

    def __enter__(self) -> ChunkedSegmentStorage:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self, *, changes: bool = False) -> None:
        if self._closed:
            raise StorageClosed("this ChunkedSegmentStorage was closed")
        if changes and self.read_only:
            raise ReadOnlyInstance("this ChunkedSegmentStorage was opened read-only")

    def flush_usage(self) -> int:
        """Add the chunk storage usage since the last flush to the metadata store's usage
        records (``slts.usage``); returns the requests added. Runs every
        ``usage_flush_interval_s`` and at ``close``. An owner commits through its fenced
        commit: ``Fenced`` once a newer epoch started (nothing written). A read-only
        instance records its usage too (a scrub's reads are billed like any other):
        accounting, not a change of any segment, and it fences nobody."""
        commit = None if self._ownership.read_only else self._ownership.commit
        return self.meter.flush(self._store, self.container_id, commit)

    def statistics(self) -> StorageStatistics:
        """Counters since start, and the last leak check's report (the leak gauge), as a
        frozen snapshot."""
        c = self.context.counters
        with c.lock:
            return StorageStatistics(
                self.epoch,
                c.writes,
                c.bytes_written,
                c.appends,
                c.chunks_created,
                c.reads,
                c.bytes_read,
                c.commit_retries,
                c.write_failures,
                self._leaks,
            )

    def check_leaks(self) -> LeakReport:
        """Look for metadata nothing reaches any more (``slts.storage.leaks``) in one
        consistent read; the report also becomes ``statistics().leaks``. A full scan of
        the container's metadata: run it from operations tooling, not per request."""
        self._check_open()
        report = find_leaks(self._store, now_ms=self.context.now_ms(), gc_delay_s=self.config.gc_delay_s)
        with self.context.counters.lock:
            self._leaks = report
        return report

    # -- helpers ------------------------------------------------------------------------------------

    @staticmethod
    def _check_offset(offset: object, segment: str) -> None:
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidOffset(f"offset must be an integer >= 0, got {offset!r}", segment=segment)

    def _check_handle(self, handle: object, *, writable: bool) -> SegmentHandle:
        self._check_open(changes=writable)
        if not isinstance(handle, SegmentHandle):
            raise InvalidArgument(f"expected a SegmentHandle, got {type(handle).__name__}")
        if writable and handle.read_only:
            raise InvalidArgument(f"handle to {handle.name!r} is read-only; use open_write")
        return handle

    @staticmethod
    def _info(record: SegmentRecord) -> SegmentInfo:
        return SegmentInfo(
            record.name,
            record.length,
            record.start_offset,
            record.sealed,
            record.chunk_count,
            record.max_rolling_length,
            record.owner_epoch,
            record.created_ms,
            record.modified_ms,
        )

    # -- metadata-only operations ----------------------------------------------------------------

    def create(self, name: str, max_rolling_length: int | None = None) -> SegmentInfo:
        """Create an empty, active segment owned by this instance.

        Raises ``InvalidName``, ``InvalidArgument`` (bad ``max_rolling_length``),
        ``SegmentExists``, ``Fenced``. A name whose earlier segment was deleted may be
        created again at once: the old chunks are collected under the old segment's id.
        """
        self._check_open(changes=True)
        check_segment_name(name)
        rolling = (
            self.config.rolling_length_bytes_default if max_rolling_length is None else max_rolling_length
        )
        if isinstance(rolling, bool) or not isinstance(rolling, int) or not 0 < rolling <= INTEGER_MAX:
            raise InvalidArgument(
                f"max_rolling_length must be an integer in [1, {INTEGER_MAX}], got {rolling!r}"
            )
        now = self.context.now_ms()
        record = SegmentRecord(
            name=name,
            segment_id=self.context.new_segment_id(),
            status=SegmentStatus.ACTIVE,
            start_offset=0,
            length=0,
            first_chunk=None,
            last_chunk=None,
            first_chunk_start_offset=0,
            last_chunk_start_offset=0,
            max_rolling_length=rolling,
            owner_epoch=self.epoch,
            chunk_count=0,
            created_ms=now,
            modified_ms=now,
            index_depth=0,
        )
        key = name_key(name)
        with self.context.locks.exclusive(name):
            if self._store.get(SEGMENTS, key) is not None:
                raise SegmentExists(f"segment {name!r} exists", segment=name)
            try:
                self._ownership.commit([Put(SEGMENTS, key, record.encode())], [Expect(SEGMENTS, key, 0)])
            except VersionConflict as exc:
                raise SegmentExists(f"segment {name!r} exists", segment=name) from exc
        return self._info(record)

    def exists(self, name: str) -> bool:
        """True if a live (not deleted) segment has this name. ``InvalidName`` if malformed."""
        self._check_open()
        check_segment_name(name)
        return self._store.get(SEGMENTS, name_key(name)) is not None

    def info(self, name: str) -> SegmentInfo:
        """The segment's length, start offset, state and chunk count. ``SegmentNotFound``."""
        self._check_open()
        check_segment_name(name)
        return self._info(self.context.load(name)[0])

    def list(self, prefix: str = "") -> Iterator[str]:
        """Names of live segments starting with ``prefix``, ascending, read page by page.

        Arguments are checked at the call, before iteration starts."""
        self._check_open()
        if not isinstance(prefix, str) or "\x00" in prefix:
            raise InvalidName(f"prefix must be a string without NUL, got {prefix!r}")
        start = name_key(prefix)
        entries = self._store.iterate(SEGMENTS, start, prefix_stop(start) if start else None)
        return (key.decode("utf-8") for key, _ in entries)

    def open_read(self, name: str) -> SegmentHandle:
        """A read handle to an existing segment. ``SegmentNotFound``."""
        self._check_open()
        check_segment_name(name)
        self.context.load(name)
        return SegmentHandle(name, read_only=True)

    def open_write(self, name: str) -> SegmentHandle:
        """A write handle; takes the segment over if an older epoch owned it.

        Takeover (PDP-34 failover): the length recorded in metadata stays the length;
        bytes an older owner wrote past it are never read, and this instance writes to
        new chunks only. Raises ``SegmentNotFound``, ``Fenced``, ``VersionConflict``
        (see the class doc).
        """
        self._check_open(changes=True)
        check_segment_name(name)
        with self.context.locks.exclusive(name):
            self.context.retry_conflicts(lambda: self._take_over(name))
        return SegmentHandle(name, read_only=False)

    def _take_over(self, name: str) -> None:
        """One attempt of ``open_write``'s takeover (lock held; see ``retry_conflicts``)."""
        record, version = self.context.load(name)
        if record.owner_epoch > self.epoch:
            self._ownership.check()  # a newer epoch took the segment: this instance is fenced
            raise Fenced(f"segment {name!r} is owned by epoch {record.owner_epoch}", segment=name)
        if record.owner_epoch != self.epoch:
            taken = record.replace(owner_epoch=self.epoch, modified_ms=self.context.now_ms())
            key = name_key(name)
            self._ownership.commit([Put(SEGMENTS, key, taken.encode())], [Expect(SEGMENTS, key, version)])

    def seal(self, handle: SegmentHandle) -> None:
        """Seal the segment: no more writes until ``unseal``. Idempotent. Raises
        ``SegmentNotFound``, ``Fenced``, ``VersionConflict`` (see the class doc)."""
        self._set_sealed(handle, True)

    def unseal(self, handle: SegmentHandle) -> None:
        """Accept writes again. Idempotent. Raises ``SegmentNotFound``, ``Fenced``,
        ``VersionConflict`` (see the class doc)."""
        self._set_sealed(handle, False)

    def _set_sealed(self, handle: SegmentHandle, sealed: bool) -> None:
        self._check_open()
        handle = self._check_handle(handle, writable=True)
        with self.context.locks.exclusive(handle.name):
            self.context.retry_conflicts(lambda: self._set_sealed_once(handle.name, sealed))

    def _set_sealed_once(self, name: str, sealed: bool) -> None:
        """One attempt of ``_set_sealed`` (lock held; see ``retry_conflicts``)."""
        record, version = self.context.load(name)
        if record.sealed == sealed:  # a no-op: still, only the owner may say it succeeded
            self._ownership.check()
            return
        status = record.status | SegmentStatus.SEALED if sealed else record.status & ~SegmentStatus.SEALED
        changed = record.replace(status=int(status), modified_ms=self.context.now_ms())
        key = name_key(name)
        self._ownership.commit([Put(SEGMENTS, key, changed.encode())], [Expect(SEGMENTS, key, version)])

    def delete(self, handle: SegmentHandle) -> None:
        """Delete the segment: its name is free at once; its chunks go to GC.

        One bounded commit whatever the chunk count: the header moves to the ``deleted``
        table as a tombstone that the collector walks in batches after ``gc_delay_s``.
        """
        self._check_open()
        handle = self._check_handle(handle, writable=True)
        with self.context.locks.exclusive(handle.name):
            self.context.retry_conflicts(lambda: self._delete_once(handle.name))

    def _delete_once(self, name: str) -> None:
        """One attempt of ``delete`` (lock held; see ``retry_conflicts``)."""
        record, version = self.context.load(name)
        tombstone = record.replace(
            status=int((record.status | SegmentStatus.DELETED) & ~SegmentStatus.ACTIVE),
            modified_ms=self.context.now_ms(),
        )
        key = name_key(name)
        self._ownership.commit(
            [Delete(SEGMENTS, key), Put(DELETED, segment_id_key(record.segment_id), tombstone.encode())],
            [Expect(SEGMENTS, key, version), Expect(DELETED, segment_id_key(record.segment_id), 0)],
        )

    # -- layout changes (slts.storage.layout_changes) --------------------------------------------

    def concat(self, target: SegmentHandle, offset: int, source: str) -> None:
        """Append the sealed segment ``source`` to ``target`` at ``offset``; ``source`` is gone.

        Metadata only, one commit whose size does not depend on the number of chunks:
        the source's chunk list is spliced after the target's and one index link maps
        the new range to the source's index. Afterwards, if both chunks at the seam are
        small (``concat_merge_seam``), they are merged into one.

        Needs ``offset == target length``, a target that is not sealed, and a source that
        is sealed and not truncated (``start_offset == 0``). Raises ``InvalidOffset``,
        ``InvalidArgument`` (source is the target), ``SegmentNotFound``,
        ``SegmentSealed``, ``SegmentNotSealed``, ``SegmentTruncated``, ``ConcatTooDeep``
        (the source's index links are nested ``index.LINK_DEPTH_MAX`` deep already),
        ``Fenced``, ``MetadataError``: every error means nothing changed. Once the concat
        has committed, it has succeeded: the seam merge after it is best effort and
        never raises (a failure leaves two chunks, merged by the next defrag). An empty
        source simply disappears.
        """
        target = self._check_handle(target, writable=True)
        check_segment_name(source)
        self._check_offset(offset, target.name)
        layout_changes.concat(self.context, target.name, offset, source)

    def truncate(self, handle: SegmentHandle, offset: int) -> None:
        """Make ``[0, offset)`` unreadable: the start offset moves up to ``offset``.

        Chunks wholly below the new start leave the list (to GC) in bounded batches of
        ``gc_batch_max`` chunks per commit; no data is ever rewritten. Works on sealed
        segments. ``offset`` at or below the current start is a no-op (except that it
        finishes dropping chunks an interrupted truncate left below the start). Once the
        first batch has committed the truncate has happened and returns normally: an error
        in a later batch leaves chunks below the start for the next truncate. Raises
        ``InvalidOffset`` (negative or past the length), ``SegmentNotFound``, ``Fenced``,
        ``VersionConflict`` (see the class doc):
        every error means nothing changed.
        """
        handle = self._check_handle(handle, writable=True)
        self._check_offset(offset, handle.name)
        layout_changes.truncate(self.context, handle.name, offset)

    def defrag(self, name: str) -> DefragResult:
        """Merge runs of consecutive small chunks of segment ``name`` (``slts.storage.defrag``).

        The segment's bytes never change; reads during a defrag return the right bytes
        (old chunks stay until GC). Each run is built outside the segment's lock and
        committed under it; a run whose chunks changed meanwhile is dropped and its new
        chunk collected. Raises ``SegmentNotFound``, ``Fenced``, ``ChunkStorageError``.
        """
        self._check_open(changes=True)
        check_segment_name(name)
        return layout_changes.defrag(self.context, name)

    # -- write ------------------------------------------------------------------------------------------

    def write(
        self,
        handle: SegmentHandle,
        offset: int,
        data: bytes | bytearray | memoryview,
        *,
        also: Sequence[Operation] = (),
        expect: Sequence[Expect] = (),
    ) -> None:
        """Append ``data`` at ``offset``, which must equal the segment's length.

        Atomic and durable: on return every byte is on the chunk storage (fsynced) and
        the metadata commit that makes them readable is durable; on an error nothing of
        the write is readable. The data goes to the last chunk when the binding can
        append, this instance created that chunk and it is below ``max_rolling_length``;
        otherwise (and for what does not fit) to new chunks of at most that size.

        ``also`` and ``expect``: a client's own records (in ``CLIENT_TABLES`` only),
        committed in the write's one transaction and only if ``expect`` holds: the bytes
        and the records become readable together or not at all (one commit, one sync,
        no window between them). If ``expect`` fails the write raises
        ``VersionConflict`` and nothing of it is readable (its chunks go to GC).

        Raises ``InvalidArgument``/``InvalidOffset`` (bad input, offset != length, too
        large), ``SegmentNotFound``, ``SegmentSealed``, ``Fenced``, ``ChunkStorageError``,
        ``VersionConflict`` (``expect``), ``WriteExpired`` (it stalled past
        ``gc_delay_s``; not applied, may be retried).
        """
        self._check_open()
        handle = self._check_handle(handle, writable=True)
        also, expect = _client_records(also, expect, handle.name)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidArgument(f"data must be bytes-like, got {type(data).__name__}")
        try:
            data = bytes(data)
        except ValueError as exc:  # a released memoryview
            raise InvalidArgument(f"data cannot be read: {exc}", segment=handle.name) from exc
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidOffset(f"offset must be an integer >= 0, got {offset!r}", segment=handle.name)
        if len(data) > self.config.write_bytes_max:
            raise InvalidArgument(
                f"write of {len(data)} bytes exceeds write_bytes_max {self.config.write_bytes_max}",
                segment=handle.name,
            )
        with self.context.locks.changing(handle.name), self._writers:
            record, version = self.context.load(handle.name)
            if record.sealed:
                raise SegmentSealed(f"segment {handle.name!r} is sealed", segment=handle.name)
            if offset != record.length:
                raise InvalidOffset(
                    f"segment {handle.name!r}: write at {offset}, but its length is {record.length}",
                    segment=handle.name,
                    offset=offset,
                )
            if not data:  # no bytes: still, only the owner may say it succeeded
                if also or expect:
                    self._ownership.commit(list(also), list(expect))
                else:
                    self._ownership.check()
                return
            if len(data) > self.config.write_chunks_max * record.max_rolling_length:
                raise InvalidArgument(
                    f"write of {len(data)} bytes needs more than write_chunks_max "
                    f"({self.config.write_chunks_max}) chunks of max_rolling_length "
                    f"{record.max_rolling_length}",
                    segment=handle.name,
                )
            try:
                alone = (
                    also
                    or expect
                    or self._appends is None
                    or (self.config.combined_writes == "auto" and self._writers.alone())
                )
                last = None if alone else self._sole_append(record, data)
                if last is not None:
                    assert self._appends is not None
                    self._appends.submit(_Append(record, version, last, data))
                else:
                    self._write_locked(record, version, data, also, expect)
            except BaseException:
                self.context.counters.add(write_failures=1)
                if record.last_chunk is not None:
                    self.context.tainted.add(record.last_chunk)
                raise
        self.context.counters.add(writes=1, bytes_written=len(data))

    def _chunk_name(self, record: SegmentRecord, start: int) -> str:
        """A new chunk's name for ``record`` at segment offset ``start`` (opaque with
        encryption on: ``segment_names.chunk_name``)."""
        opaque = record.segment_id if self.config.encryption else None
        return chunk_name(self.container_id, record.name, self.epoch, start, opaque)

    def _appendable(self, record: SegmentRecord, last: ChunkRecord | None) -> bool:
        """May this write append to the segment's last chunk ``last``? (see ``write``)"""
        return (
            last is not None
            and self.chunk_storage.supports_append
            and last.name not in self.context.tainted
            and last.epoch == self.epoch
            and last.length < record.max_rolling_length
            and self.transforms.appendable(last)
        )

    def _sole_append(self, record: SegmentRecord, data: bytes) -> tuple[ChunkRecord, int] | None:
        """The last chunk (record, version) when all of ``data`` (at most
        ``COMBINED_WRITE_BYTES_MAX`` bytes) goes to it untransformed (a write that
        ``_combine_appends`` may combine with others); None otherwise."""
        if record.last_chunk is None or self.transforms.active or len(data) > COMBINED_WRITE_BYTES_MAX:
            return None
        last = self.context.chunk(record.last_chunk)
        if not self._appendable(record, last[0]) or len(data) > record.max_rolling_length - last[0].length:
            return None
        return last

    def _combine_appends(self, appends: Sequence[_Append]) -> builtins.list[Exception | None]:
        """One group of combined writes (``write``: each appends all its bytes to its
        segment's last chunk, each under its segment's change lock): their data written
        and synced together (``write_together``), then one metadata commit for those
        written (``_commit_appends``). One outcome per write: None (committed and
        durable), or its error (nothing of it readable)."""
        assert self._ahead is None, "combined writes create no chunk"
        written = self.chunk_storage.write_together(
            [
                ChunkAppend(
                    ChunkHandle(append.last[0].name, readonly=False), append.last[0].stored, append.data
                )
                for append in appends
            ]
        )
        outcomes: builtins.list[Exception | None] = [None] * len(appends)
        plans: builtins.list[tuple[int, _WritePlan]] = []
        block_bytes = self.config.checksum_block_bytes
        for position, (append, result) in enumerate(zip(appends, written, strict=True)):
            if isinstance(result, Exception):
                outcomes[position] = result
                continue
            self.context.counters.add(appends=1)
            sums = (
                _write_sums(append.last[0], append.data, (), block_bytes) if self.config.checksums else None
            )
            plan = _WritePlan(
                appended=append.data, new_chunks=[], intents=[], intent_version=0, following=None, sums=sums
            )
            plans.append((position, plan))
        if plans:
            self._commit_appends(appends, plans, outcomes)
        return outcomes

    def _commit_appends(
        self,
        appends: Sequence[_Append],
        plans: builtins.list[tuple[int, _WritePlan]],
        outcomes: builtins.list[Exception | None],
    ) -> None:
        """The written appends' ``plans`` (position in ``appends``, plan) committed in one
        conditional commit under their segments' layout locks; on a conflict, each on its
        own (``_commit_write``: re-based where its segment's end is as it found it), its
        error its ``outcomes`` entry alone."""
        ops: builtins.list[Put | Delete] = []
        expect: builtins.list[Expect] = []
        committed: builtins.list[tuple[_Append, SegmentRecord, ChunkRecord | None]] = []
        for position, plan in plans:
            append = appends[position]
            its_ops, its_expect, updated, last_after = self._write_commit(
                append.record, append.version, append.last, plan
            )
            ops += its_ops
            expect += its_expect
            committed.append((append, updated, last_after))
        try:
            with self.context.locks.layout(*(append.record.name for append, _, _ in committed)):
                sequence = self._ownership.commit(ops, expect)
                for append, updated, _ in committed:
                    self._layouts.advance(append.record.name, append.version, sequence, updated)
        except VersionConflict:
            self.context.counters.add(commit_retries=len(plans))
            for position, plan in plans:
                append = appends[position]
                try:
                    self._commit_write(append.record, append.version, append.last, plan)
                except SltsError as error:
                    outcomes[position] = error
            return
        for _, updated, last_after in committed:
            self._remember_write(sequence, updated, last_after)

    def _remember_write(self, sequence: int, updated: SegmentRecord, last_after: ChunkRecord | None) -> None:
        """The records a write's commit at ``sequence`` made current, kept as committed:
        the next write reads them without a decode."""
        self.context.records.remember(SEGMENTS, name_key(updated.name), sequence, updated)
        if last_after is not None:
            self.context.records.remember(CHUNKS, name_key(last_after.name), sequence, last_after)

    def _write_locked(
        self,
        record: SegmentRecord,
        version: int,
        data: bytes,
        also: tuple[Operation, ...] = (),
        expect: tuple[Expect, ...] = (),
    ) -> None:
        # Plan: what goes to the last chunk, what to new chunks.
        previous = self.context.chunk(record.last_chunk) if record.last_chunk is not None else None
        last = previous[0] if previous is not None and self._appendable(record, previous[0]) else None
        appended = b""
        if last is not None:
            appended = data[: record.max_rolling_length - last.length]
        new_chunks: builtins.list[_NewChunk] = []
        position = len(appended)
        while position < len(data):
            piece = data[position : position + record.max_rolling_length]
            start = record.length + position
            new_chunks.append(_NewChunk(self._chunk_name(record, start), start, piece))
            position += len(piece)

        # 1. GC intents for the chunks about to exist (leak-free whatever happens next):
        #    registered by the previous write's commit (``ahead_intents``), or now.
        now_ms = self.context.now_ms()
        ahead = None
        if self._ahead is not None and len(new_chunks) == 1 and not appended:
            ahead = self._ahead.take(record.name, new_chunks[0].start, now_ms)
        if ahead is not None:
            new_chunks[0] = _NewChunk(ahead.name, ahead.start, new_chunks[0].data)
            intents, intent_version = [ahead.entry], ahead.version
        else:
            intents = [self.gc.entry(chunk.name, GcReason.INTENT) for chunk in new_chunks]
            intent_version = (
                self._ownership.commit(intents, [Expect(GC, op.key, 0) for op in intents]) if intents else 0
            )
        following: AheadIntent | None = None  # of the chunk the next write will create
        if self._ahead is not None:
            start = record.length + len(data)
            name = self._chunk_name(record, start)
            following = AheadIntent(name, start, queue_entry(name, GcReason.INTENT, now_ms), 0, now_ms)

        # Transformed: each piece encoded now (its frames carry their checks).
        appended_encoded: Encoded | None = None
        chunks_encoded: tuple[Encoded, ...] = ()
        if self.transforms.active:
            if appended:
                assert last is not None
                appended_encoded = self.transforms.encode_append(last, appended)
            chunks_encoded = tuple(self.transforms.encode_new(c.name, c.data) for c in new_chunks)
        # The checksums, beside the data I/O when the write is large (both release the GIL).
        sums: Future[_WriteSums] | _WriteSums | None = None
        if self.config.checksums and not self.transforms.active:
            arguments = (
                previous[0] if previous else None,
                appended,
                new_chunks,
                self.config.checksum_block_bytes,
            )
            if len(data) >= PARALLEL_CHECKSUM_BYTES_MIN:
                sums = self._thread_pool("slts-checksum").submit(_write_sums, *arguments)
            else:
                sums = _write_sums(*arguments)

        try:
            # 2. Data, durable.
            if appended:
                assert last is not None
                stored = appended_encoded.stored if appended_encoded is not None else appended
                self.chunk_storage.write(ChunkHandle(last.name, readonly=False), last.stored, stored)
                self.context.counters.add(appends=1)
            for i, chunk in enumerate(new_chunks):
                self.chunk_storage.create(
                    chunk.name, chunks_encoded[i].stored if chunks_encoded else chunk.data
                )
                self.context.counters.add(chunks_created=1)

            # 3. Metadata, one conditional commit, re-based on a conflict that left the
            #    segment where this write expects it (e.g. a defrag elsewhere in the list).
            plan = _WritePlan(
                appended,
                new_chunks,
                intents,
                intent_version,
                following.entry if following is not None else None,
                sums.result() if isinstance(sums, Future) else sums,
                also,
                expect,
                appended_encoded,
                chunks_encoded,
            )
            sequence = self._commit_write(record, version, previous, plan)
        except BaseException:
            if intents:  # a write stalled past gc_delay_s may have lost them to GC
                self.gc.requeue_lost(intents, intent_version)
            raise
        if self._ahead is not None and following is not None:  # committed at ``sequence``
            self._ahead.offer(record.name, replace(following, version=sequence))

    def _commit_write(
        self,
        record: SegmentRecord,
        version: int,
        previous: tuple[ChunkRecord, int] | None,
        plan: _WritePlan,
    ) -> int:
        """Step 3 of ``_write_locked``: commit, re-based at most ``commit_retries_max``
        times on conflicts that left the segment's end as this write found it; returns
        the commit's sequence. ``WriteExpired`` if GC took the intents meanwhile (no
        commit can succeed then)."""
        intents, intent_version = plan.intents, plan.intent_version
        for attempt in range(self.config.commit_retries_max + 1):
            ops, expect, updated, last_after = self._write_commit(record, version, previous, plan)
            try:
                with self.context.locks.layout(record.name):
                    sequence = self._ownership.commit(ops, expect)
                    # An append: the extents reads resolved stay, but the last chunk's.
                    self._layouts.advance(record.name, version, sequence, updated)
                self._remember_write(sequence, updated, last_after)
                return sequence
            except VersionConflict as exc:
                if intents and (lost := self.gc.lost(intents, intent_version)):
                    written = len(plan.appended) + sum(len(c.data) for c in plan.new_chunks)
                    raise WriteExpired(
                        f"write of {written} bytes at offset "
                        f"{record.length} took longer than gc_delay_s ({self.config.gc_delay_s:g} s) between "
                        f"registering its chunks and committing them; GC took {len(lost)} of them: not "
                        "applied",
                        segment=record.name,
                        offset=record.length,
                        chunks=lost,
                    ) from exc
                if attempt == self.config.commit_retries_max or not self._expectations_hold(plan.expect):
                    raise
                self.context.counters.add(commit_retries=1)
                fresh, version = self.context.load(record.name)
                if fresh.length != record.length or fresh.last_chunk != record.last_chunk or fresh.sealed:
                    raise
                record = fresh
                if previous is not None:
                    fresh_previous = self.context.chunk(previous[0].name)
                    if fresh_previous[0].length != previous[0].length:
                        raise
                    previous = fresh_previous
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _expectations_hold(self, expect: tuple[Expect, ...]) -> bool:
        """Whether a client's expectations (``write``'s ``expect``) hold now: a conflict
        on them is the caller's, not a layout change a retry could re-base over."""
        if not expect:
            return True
        with self._store.snapshot() as view:
            for wanted in expect:
                stored = view.get(wanted.table, wanted.key)
                if (0 if stored is None else stored.version) != wanted.version:
                    return False
        return True

    def _write_commit(
        self,
        record: SegmentRecord,
        version: int,
        last: tuple[ChunkRecord, int] | None,
        plan: _WritePlan,
    ) -> tuple[builtins.list[Put | Delete], builtins.list[Expect], SegmentRecord, ChunkRecord | None]:
        """The operations and expectations that make the write ``plan`` readable, the
        segment's record they commit, and the last chunk's if they change it.

        ``record``/``version``: the segment as read; ``last``: its last chunk (record,
        version) as read, which receives ``plan.appended`` and points at the new chunks."""
        appended, new_chunks, sums = plan.appended, plan.new_chunks, plan.sums
        ops: builtins.list[Put | Delete] = []
        expect = [Expect(SEGMENTS, name_key(record.name), version)]
        last_after: ChunkRecord | None = None
        if last is not None and (appended or new_chunks):
            previous, previous_version = last
            previous_name = previous.name
            if appended and plan.appended_encoded is not None:
                grown = plan.appended_encoded
                previous = previous.replace(
                    length=previous.length + len(appended),
                    checksum=grown.checksum,
                    frames=grown.frames,
                    stored_length=grown.stored_length,
                )
            elif appended:
                checksum, blocks = sums.appended if sums is not None else (None, None)
                previous = previous.replace(
                    length=previous.length + len(appended), checksum=checksum, blocks=blocks
                )
            if new_chunks:
                previous = previous.replace(next_chunk=new_chunks[0].name)
            ops.append(Put(CHUNKS, name_key(previous_name), previous.encode()))
            expect.append(Expect(CHUNKS, name_key(previous_name), previous_version))
            last_after = previous
        for i, chunk in enumerate(new_chunks):
            following = new_chunks[i + 1].name if i + 1 < len(new_chunks) else None
            checksum, blocks = sums.chunks[i] if sums is not None else (None, None)
            encoded = plan.chunks_encoded[i] if plan.chunks_encoded else None
            chunk_record = ChunkRecord(
                name=chunk.name,
                index_id=record.segment_id,
                index_offset=chunk.start,
                length=len(chunk.data),
                next_chunk=following,
                epoch=self.epoch,
                checksum=encoded.checksum if encoded is not None else checksum,
                blocks=blocks,
                frames=encoded.frames if encoded is not None else None,
                stored_length=encoded.stored_length if encoded is not None else None,
                data_keys=encoded.data_keys if encoded is not None else None,
            )
            ops.append(Put(CHUNKS, name_key(chunk.name), chunk_record.encode()))
            ops.append(index.chunk_entry(chunk_record))
        for intent in plan.intents:
            ops.append(Delete(GC, intent.key))
            expect.append(Expect(GC, intent.key, plan.intent_version))
        if plan.following is not None:
            ops.append(plan.following)
            expect.append(Expect(GC, plan.following.key, 0))
        total = len(appended) + sum(len(chunk.data) for chunk in new_chunks)
        changes: dict[str, object] = {"length": record.length + total, "modified_ms": self.context.now_ms()}
        if new_chunks:
            changes["last_chunk"] = new_chunks[-1].name
            changes["last_chunk_start_offset"] = new_chunks[-1].start
            changes["chunk_count"] = record.chunk_count + len(new_chunks)
            if record.first_chunk is None:
                changes["first_chunk"] = new_chunks[0].name
                changes["first_chunk_start_offset"] = new_chunks[0].start
        updated = record.replace(**changes)
        ops.append(Put(SEGMENTS, name_key(record.name), updated.encode()))
        ops += plan.also
        expect += plan.expect
        return ops, expect, updated, last_after

    # -- read -------------------------------------------------------------------------------------------

    def read(self, handle: SegmentHandle, offset: int, length: int) -> bytes:
        """Exactly the bytes ``[offset, offset+length)`` of the segment.

        ``offset`` must be >= the start offset (``SegmentTruncated`` below it) and
        ``offset + length`` <= the length (``InvalidOffset`` past it); a zero-length
        read at the end returns ``b""``. Chunks are located through the offset index
        (O(log n)); large reads over several chunks fetch them in parallel. With
        ``verify_checksums_on_read``, every read checks the CRC32C of each block it
        touches (``ChunkCorrupted`` names the chunk and the block's offset); chunks
        written before block checksums are checked when a read covers them whole.
        """
        data = self._read(handle, offset, length, mapped=False)
        assert isinstance(data, bytes), type(data)
        return data

    def read_view(self, handle: SegmentHandle, offset: int, length: int) -> memoryview:
        """``read``'s bytes (same checks, same errors) as a read-only ``memoryview``.

        With ``read_mapped`` (the default), a range that lies in one chunk of a binding
        that maps its files (filesystem) is a view of the chunk file's pages, checked
        like any read: no copy. Such a view keeps the chunk's mapping (and its file,
        even once collected) alive until it and its slices are released; the bytes never
        change (``slts.bindings.mapped_reads``). Otherwise it is a view of the bytes read.
        """
        data = self._read(handle, offset, length, mapped=self.config.read_mapped)
        return data if isinstance(data, memoryview) else memoryview(data)

    @property
    def read_views_mapped(self) -> bool:
        """Whether ``read_view`` answers with views of the chunk files' own pages (the
        binding maps its files and ``read_mapped`` is on): a large view then costs the
        process no memory to hold."""
        return self.config.read_mapped and self.chunk_storage.maps_reads

    def _read(self, handle: SegmentHandle, offset: int, length: int, *, mapped: bool) -> bytes | memoryview:
        """``read`` and ``read_view``: the checks, the read, one retry over a changed layout."""
        handle = self._check_handle(handle, writable=False)
        if not (type(offset) is int and type(length) is int and offset >= 0 and length >= 0):
            for value, what in ((offset, "offset"), (length, "length")):
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise InvalidOffset(f"{what} must be an integer >= 0, got {value!r}", segment=handle.name)
        if length > self.config.read_bytes_max:
            raise InvalidArgument(
                f"read of {length} bytes exceeds read_bytes_max {self.config.read_bytes_max}",
                segment=handle.name,
            )
        try:
            data = self._read_once(handle.name, offset, length, mapped)
        except (ChunkNotFound, MetadataCorrupted):
            # The layout this instance read is gone: another instance changed it (and GC
            # collected its chunks). Fenced if a newer epoch owns the container; otherwise
            # forget every cached record and read once more from the store: a chunk still
            # missing then is missing (ChunkNotFound).
            self._ownership.check()
            self._store.clear()
            self._layouts.clear()
            data = self._read_once(handle.name, offset, length, mapped)
        if len(data) != length:  # not an assert: wrong bytes must not reach a caller under -O
            raise InvariantViolated(
                f"segment {handle.name!r}: a read of {length} at {offset} produced {len(data)} bytes",
                segment=handle.name,
                offset=offset,
            )
        self.context.counters.add_read(length)
        return data

    def _read_once(self, name: str, offset: int, length: int, mapped: bool) -> bytes | memoryview:
        """Check the range against the segment's record, resolve the pieces (and those
        to read ahead, ``slts.storage.read_ahead``) under the segment's lock, fetch them
        without it (``mapped``: as views of the binding, ``read_view``).

        A range whose chunks a read resolved before, at the version of the segment's
        record the store has now, is resolved from those extents
        (``slts.storage.resolved_layouts``): one record read, no index seek. Without
        read-ahead to plan, such a read takes no lock: the extents are the layout at the
        version it read, so it returns that committed state, as a read that ran just
        before any later change would; the chunks of that layout are only deleted once
        a later change dropped them and GC's delay passed (a read that finds one gone
        reads again, ``_read``)."""
        # Known extents first: without read-ahead to plan they need no lock (see above);
        # nor do they when the binding holds every piece locally (a chunk cache): such a
        # read plans no read-ahead (nothing to fetch ahead of bytes at hand) but moves its
        # stream along (``ReadAhead.passed``), so the first read past the held bytes plans
        # at once. Else they are looked up under the lock, where the plan is made.
        # While the store's change marker stands where a version was confirmed, the
        # extents need no version read (``ResolvedLayouts.find_unchanged``).
        lock_free = self._read_ahead is None
        known = None
        if lock_free or self.chunk_storage.holds_locally:
            marker = self._store.change_marker
            known = self._layouts.find_unchanged(name, marker, offset, length)
            if known is None:
                known = self._layouts.find(name, self.context.version(name), offset, length, marker)
        if known is not None:
            self._check_range(known[0], offset, length)
            pieces = self._pieces(known[1], offset, length)
            storage = self.chunk_storage
            asked = (  # one piece of checked blocks: the binding is asked once
                storage.holds_locally
                and storage.checks_as_it_reads
                and not mapped
                and len(pieces) == 1
                and pieces[0].blocks is not None
            )
            data: bytes | memoryview | None = self._fetch_held(pieces[0]) if asked else None
            if data is None and (lock_free or (not asked and self._held_locally(pieces))):
                if len(pieces) == 1:  # the common small read: ``_fetch``'s one-piece case, inline
                    data = _exactly(self._fetch_stored(pieces[0], mapped), pieces[0], "read")
                else:
                    data = self._fetch(pieces, length, mapped)
            if data is not None:
                if not lock_free:  # with read-ahead on, only held bytes are read here
                    # A stream reading through held bytes keeps its place.
                    self._read_ahead.passed(name, offset, length)  # type: ignore[union-attr]
                return data
            known = None
        ahead: Plan | None = None
        ahead_pieces: builtins.list[_ReadPiece] = []
        with self.context.locks.layout(name):
            if not lock_free:  # (a lock-free miss resolves at once: no second look)
                known = self._layouts.find(name, self.context.version(name), offset, length)
            if known is not None:
                record, extents = known
                self._check_range(record, offset, length)
                pieces = self._pieces(extents, offset, length)
                ahead, ahead_pieces = self._plan_ahead(record, offset, length, self._store)
            else:
                pieces, ahead, ahead_pieces = self._resolve(name, offset, length)
        if ahead is not None:
            assert self._read_ahead is not None
            self._read_ahead.prefetch(ahead, ahead_pieces, self._fetch_range, self.chunk_storage.holds)
        return self._fetch(pieces, length, mapped)

    def _fetch_held(self, piece: _ReadPiece) -> bytes | None:
        """``piece``'s bytes (it has block checksums) if the binding holds them locally (a
        chunk cache), read and checked by it, asked once (``read_held_into_checked``);
        None if it does not hold them all (the caller plans read-ahead and reads as for
        any piece)."""
        storage = self.chunk_storage
        blocks = piece.blocks
        assert blocks is not None, piece
        first, end, start, stop = block_checksums.covering(blocks, piece.chunk_offset, piece.length)
        handle = ChunkHandle(piece.chunk, True)
        wanted = blocks[first * block_checksums.PAIR_BYTES : end * block_checksums.PAIR_BYTES]
        served: builtins.list[int | None] = []

        def fill(view: memoryview) -> None:
            served.append(storage.read_held_into_checked(handle, start, view, wanted))

        data = filled_bytes(stop - start, fill)
        if served[0] is None:
            return None
        cut = _cut_to_piece(data, piece, start)
        assert isinstance(cut, bytes), type(cut)
        return _exactly(cut, piece, "read")  # type: ignore[return-value]

    def _held_locally(self, pieces: Sequence[_ReadPiece]) -> bool:
        """Whether the binding holds every piece's bytes locally now (a hint, ``holds``)."""
        storage = self.chunk_storage
        return all(
            piece.frames is None and storage.holds(piece.chunk, piece.chunk_offset, piece.length)
            for piece in pieces
        )

    def _resolve(
        self, name: str, offset: int, length: int
    ) -> tuple[builtins.list[_ReadPiece], Plan | None, builtins.list[_ReadPiece]]:
        """``_read_once``'s pieces and read-ahead, resolved through the offset index and
        the chunk records (caller holds the segment's layout lock). What it resolved is
        kept for later reads if no change of the segment committed meanwhile."""
        ahead: Plan | None = None
        ahead_pieces: builtins.list[_ReadPiece] = []
        try:  # from the instance's cache, if no change of the segment commits meanwhile
            record, version = self.context.load(name)
            self._check_range(record, offset, length)
            extents = self._walk(record, offset, length, self._store)
            if extents and self._layouts.continues(name, version, offset):
                # A reader walking on past what it resolved: the chunks after these too,
                # so its next reads find them known (one resolve per RESOLVE_AHEAD_CHUNKS).
                with self._store.snapshot() as view:  # one read transaction for them all
                    extents += self._walk_on(extents[-1], RESOLVE_AHEAD_CHUNKS, view)
            marker = self._store.change_marker  # (read before the version it confirms)
            moved = self.context.version(name) != version
        except MetadataCorrupted:  # a chunk record gone: a change committed meanwhile
            moved = True
        if not moved:
            self._layouts.learn(name, version, record, extents, marker)
            ahead, ahead_pieces = self._plan_ahead(record, offset, length, self._store)
        else:  # a change by another instance or process: read one committed state
            with self._store.snapshot() as view:
                record = self.context.load(name, view)[0]
                self._check_range(record, offset, length)
                extents = self._walk(record, offset, length, view)
                ahead, ahead_pieces = self._plan_ahead(record, offset, length, view)
        return self._pieces(extents, offset, length), ahead, ahead_pieces

    def _plan_ahead(
        self, record: SegmentRecord, offset: int, length: int, source: RecordSource
    ) -> tuple[Plan | None, builtins.list[_ReadPiece]]:
        """What to read ahead after a read of ``[offset, offset+length)`` (``follow``) and
        its pieces, located in ``source``; (None, []) when nothing is, or when the range's
        layout changed under the lookup (read-ahead is a hint: the read goes on)."""
        if self._read_ahead is None:
            return None, []
        ahead = self._read_ahead.follow(record.name, offset, length, record.length)
        if ahead is None:
            return None, []
        try:
            return ahead, self._locate(record, ahead.start, ahead.end - ahead.start, source)
        except MetadataCorrupted:
            return None, []

    @staticmethod
    def _check_range(record: SegmentRecord, offset: int, length: int) -> None:
        """``SegmentTruncated`` if ``offset`` is below ``record``'s start, ``InvalidOffset``
        if the range passes its end."""
        name = record.name
        if offset < record.start_offset:
            raise SegmentTruncated(
                f"segment {name!r}: offset {offset} is below its start {record.start_offset}",
                segment=name,
                offset=offset,
            )
        if offset + length > record.length:
            raise InvalidOffset(
                f"segment {name!r}: read of {length} at {offset} passes its end {record.length}",
                segment=name,
                offset=offset,
            )

    def _locate(
        self, record: SegmentRecord, offset: int, length: int, source: RecordSource
    ) -> builtins.list[_ReadPiece]:
        """The chunk pieces holding ``[offset, offset+length)``, read from ``source``."""
        return self._pieces(self._walk(record, offset, length, source), offset, length)

    def _walk(
        self, record: SegmentRecord, offset: int, length: int, source: RecordSource
    ) -> builtins.list[Extent]:
        """The chunks that hold ``[offset, offset+length)`` with their start offsets, read
        from ``source`` (the instance's store, or one snapshot's view): one O(log n)
        index lookup, then a walk along ``next_chunk`` over the chunks the range covers
        only (none for an empty range)."""
        if not length:
            return []
        name: str | None
        name, chunk_start = index.resolve(source, record.segment_id, offset)
        extents: builtins.list[Extent] = []
        end = offset + length
        while chunk_start < end:
            if name is None:  # not an assert: a read must never come back short
                raise MetadataCorrupted(
                    f"chunk list of {record.name!r} ends before offset {chunk_start}", segment=record.name
                )
            chunk, _ = self.context.chunk(name, source)
            extents.append((chunk_start, chunk))
            chunk_start, name = chunk_start + chunk.length, chunk.next_chunk
        return extents

    def _walk_on(self, last: Extent, count: int, source: RecordSource) -> builtins.list[Extent]:
        """Up to ``count`` chunks after extent ``last`` along ``next_chunk``, with their
        start offsets, read from ``source``."""
        extents: builtins.list[Extent] = []
        start, chunk = last
        start += chunk.length
        name = chunk.next_chunk
        while name is not None and len(extents) < count:
            chunk, _ = self.context.chunk(name, source)
            extents.append((start, chunk))
            start, name = start + chunk.length, chunk.next_chunk
        return extents

    def _pieces(self, extents: Sequence[Extent], offset: int, length: int) -> builtins.list[_ReadPiece]:
        """The pieces of ``extents`` (chunks in segment order, the first holding
        ``offset``) that ``[offset, offset+length)`` covers."""
        verifying = self.config.verify_checksums_on_read
        pieces: builtins.list[_ReadPiece] = []
        end = offset + length
        position = offset
        for chunk_start, chunk in extents:
            chunk_end = chunk_start + chunk.length
            if chunk_end <= position:
                continue  # an empty chunk, or one the range starts past
            take = min(chunk_end, end) - position
            name = chunk.name
            if chunk.transformed:  # its frames check themselves, always
                pieces.append(
                    _ReadPiece(name, position - chunk_start, take, None, None, chunk.frames, chunk.data_keys)
                )
            else:
                whole = position == chunk_start and take == chunk.length
                blocks = chunk.blocks if verifying else None
                checksum = chunk.checksum if whole and verifying and blocks is None else None
                pieces.append(_ReadPiece(name, position - chunk_start, take, checksum, blocks))
            position += take
            if position == end:
                break
        if position != end:  # not an assert: a read must never come back short
            raise InvariantViolated(
                f"chunks {[chunk.name for _, chunk in extents]} cover [{offset}, {position}) of a read "
                f"of {length} at {offset}",
                offset=offset,
            )
        return pieces

    def _fetch(self, pieces: builtins.list[_ReadPiece], length: int, mapped: bool) -> bytes | memoryview:
        """The pieces' bytes, in order (one piece ``mapped``: its view). In parallel,
        every piece's fetch has finished before this returns or raises (no chunk read
        outlives the call that asked for it, even after ``close``), and the error raised
        is the first failing piece's in segment order, whatever the threads' schedule."""
        if len(pieces) > 1 and length >= self.config.read_parallel_bytes_min:
            pool = self._thread_pool("slts-read")
            # In the caller's context (its traffic class), a copy per piece: a context
            # runs in one thread at a time.
            fetches = [
                pool.submit(contextvars.copy_context().run, self._fetch_piece, piece) for piece in pieces
            ]
            wait(fetches)
            parts: builtins.list[bytes | memoryview] = [fetch.result() for fetch in fetches]
        elif len(pieces) == 1:
            return self._fetch_piece(pieces[0], mapped)
        else:
            parts = [self._fetch_piece(piece) for piece in pieces]
        return b"".join(parts)

    def _fetch_piece(self, piece: _ReadPiece, mapped: bool = False) -> bytes | memoryview:
        """The piece's bytes, checked: from what was read ahead if it covers them, else
        from the chunk storage (``_fetch_stored``; ``mapped``: a view of the binding's)."""
        if self._read_ahead is not None:
            data = self._read_ahead.take(piece.chunk, piece.chunk_offset, piece.length)
            # Parts were checked block by block when fetched; a whole chunk kept without
            # blocks is checked here. Bytes that fail it are read again, and the read
            # from storage reports them.
            if data is not None and (
                piece.whole_chunk_checksum is None or _checksum(data) == piece.whole_chunk_checksum
            ):
                return _exactly(data, piece, "read ahead")
        return _exactly(self._fetch_stored(piece, mapped), piece, "read")

    def _fetch_range(self, piece: _ReadPiece, chunk_offset: int, length: int) -> bytes:
        """Bytes ``[chunk_offset, chunk_offset+length)`` of ``piece``'s chunk, within the
        piece, checked (read-ahead's fetch: a whole chunk without blocks is checked when
        a read takes it, in ``_fetch_piece``)."""
        assert piece.chunk_offset <= chunk_offset, (piece, chunk_offset)
        assert chunk_offset + length <= piece.chunk_offset + piece.length, (piece, chunk_offset, length)
        data = self._fetch_stored(
            piece._replace(chunk_offset=chunk_offset, length=length, whole_chunk_checksum=None)
        )
        assert isinstance(data, bytes), type(data)  # read ahead keeps copies: never views
        return data

    def _fetch_stored(self, piece: _ReadPiece, mapped: bool = False) -> bytes | memoryview:
        """The piece's bytes, checked, read from the chunk storage (``mapped``: by
        ``read_view``, checked in place, so a view of the binding's). The handle is built
        here, not opened: the metadata says the chunk exists and how long it is, and
        opening costs a request on some bindings (a HEAD on S3). A chunk that is gone
        after all raises ``ChunkNotFound`` from the read itself (``read`` retries it)."""
        handle = ChunkHandle(piece.chunk, True)  # (positional: the hot path)
        if piece.frames is not None:  # the frames it overlaps, fetched (viewed) and decoded
            return self.transforms.decode(
                piece.chunk,
                piece.frames,
                piece.data_keys,
                piece.chunk_offset,
                piece.length,
                lambda offset, length: self.chunk_storage.read_view(handle, offset, length),
                *self._decode_parts(piece.length),
            )
        fetch = self.chunk_storage.read_view if mapped else self.chunk_storage.read
        if piece.blocks is not None:  # read the blocks it touches whole, check them, cut the piece
            first, end, start, stop = block_checksums.covering(piece.blocks, piece.chunk_offset, piece.length)
            checked: bytes | memoryview | None = None
            storage = self.chunk_storage
            held = storage.holds_locally and storage.holds(piece.chunk, start, stop - start)
            # Local bytes of several blocks: read and checked by the binding in one pass. (Bytes
            # a cache does not hold come from its storage: no pass to share with the check.)
            if (
                end - first > 1
                and not mapped
                and storage.checks_as_it_reads
                and (held or not storage.holds_locally)
            ):
                return self._read_checked_by_binding(handle, piece, first, end, start, stop)
            if held:  # one check
                checked = self._read_held(handle, piece.blocks, first, end, start, stop - start)
            if checked is None:  # not held, or the held copy failed and was dropped
                # Local bytes: the copy and the check overlapped in runs, one per core. Not on
                # a remote storage: there the check is a fraction of a millisecond against a
                # request of many, and each run would be one more request (a cost).
                if (
                    not mapped
                    and stop - start >= OVERLAPPED_CHECK_BYTES_MIN
                    and _CORES > 1
                    and not storage.high_latency_reads
                ):
                    checked = self._read_checked(handle, piece.blocks, first, end, stop - start)
                else:
                    checked = fetch(handle, start, stop - start)
                    # One whole block (a small read) checked here; anything else, or a
                    # mismatch (reported with its offset), by ``verify``.
                    if not (
                        end - first == 1
                        and len(checked) == stop - start
                        and _checksum(checked) == block_checksums.block_checksum(piece.blocks, first)
                    ):
                        block_checksums.verify(
                            piece.blocks, first, end, checked, chunk=piece.chunk, start=start
                        )
            return _cut_to_piece(checked, piece, start)
        data = fetch(handle, piece.chunk_offset, piece.length)
        if len(data) != piece.length:
            raise ChunkCorrupted(
                f"chunk {piece.chunk!r} holds fewer bytes than its metadata records",
                chunk=piece.chunk,
            )
        if piece.whole_chunk_checksum is not None and _checksum(data) != piece.whole_chunk_checksum:
            raise ChunkCorrupted(f"chunk {piece.chunk!r} fails its CRC32C checksum", chunk=piece.chunk)
        return data

    def _read_checked_by_binding(
        self, handle: ChunkHandle, piece: _ReadPiece, first: int, end: int, start: int, stop: int
    ) -> bytes | memoryview:
        """``piece``'s bytes, in blocks ``[first, end)`` (chunk offsets ``[start, stop)``),
        read and checked by the binding in one pass (``read_into_checked``: bindings that
        ``checks_as_it_reads``), then cut to the piece."""
        assert piece.blocks is not None
        blocks = piece.blocks[first * block_checksums.PAIR_BYTES : end * block_checksums.PAIR_BYTES]
        name = handle.name

        def fill(view: memoryview) -> None:
            count = self.chunk_storage.read_into_checked(handle, start, view, blocks)
            if count != len(view):
                raise _shorter_than_its_blocks(name, start + count, stop)

        return _cut_to_piece(filled_bytes(stop - start, fill), piece, start)

    def _read_held(
        self, handle: ChunkHandle, blocks: bytes, first: int, end: int, start: int, length: int
    ) -> bytes | None:
        """Blocks ``[first, end)`` (``length`` bytes from chunk offset ``start``), which
        the binding holds locally (a chunk cache), checked: ``_read_checked`` with
        ``verified_by_caller`` (the block checksums are the one check of these bytes:
        the binding skips its own), in parallel runs from ``OVERLAPPED_HELD_BYTES_MIN``.
        The first block that fails the check (the whole range if the error names no
        offset) is ``distrust``ed: None if the binding dropped its copy (the caller then
        reads the storage, which also answers for any other bad block: the binding no
        longer holds the whole range), else the check's error."""
        parts = min(_CORES, self.config.read_threads) if length >= OVERLAPPED_HELD_BYTES_MIN else 1
        try:
            return self._read_checked(
                handle, blocks, first, end, length, parts=parts, verified_by_caller=True
            )
        except ChunkCorrupted as error:
            low, high = start, start + length
            bad = getattr(error, "offset", None)
            if isinstance(bad, int) and low <= bad < high:
                low, high = block_checksums.covering(blocks, bad, 1)[2:]
            if self.chunk_storage.distrust(handle.name, low, high - low):
                _log.warning("%s; the local copy was dropped, read again from the chunk storage", error)
                return None
            raise

    def _read_checked(
        self,
        handle: ChunkHandle,
        blocks: bytes,
        first: int,
        end: int,
        length: int,
        *,
        parts: int | None = None,
        verified_by_caller: bool = False,
    ) -> bytes:
        """Blocks ``[first, end)`` of ``handle``'s chunk (``length`` bytes), checked: cut
        into as many runs of whole blocks as the machine has cores (up to
        ``read_threads``), each run read straight into its part of the bytes returned and
        checked by one thread (the caller's or the checksum pool's; reads and CRC32C
        release the interpreter lock), so the check costs a read about nothing where
        cores are free, with one hand-over per run (``parts``: that many runs instead;
        one reads in the caller's thread alone). ``verified_by_caller`` is passed to the
        binding's ``read_into``: these checks are the bytes' only ones (``_read_held``).
        Every run has finished before this returns or raises; the first bad run's error
        (in chunk order) is raised:
        ``ChunkCorrupted`` for a bad block or a short chunk, else the read's own.

        No view of the result outlives the fill (``filled_bytes``): each run's view is
        released when its run ends, and errors pass on without their tracebacks' frames
        (which hold views)."""
        name = handle.name
        if parts is None:
            parts = min(_CORES, self.config.read_threads)
        assert parts >= 1, parts
        runs = block_checksums.runs(blocks, first, end, -(-length // parts))
        base = runs[0][2]

        def fill(view: memoryview) -> None:
            def run_checked(run: tuple[int, int, int, int]) -> BaseException | None:
                run_first, run_end, run_start, run_stop = run
                part = view[run_start - base : run_stop - base]
                try:
                    count = self.chunk_storage.read_into(
                        handle, run_start, part, verified_by_caller=verified_by_caller
                    )
                    if count != len(part):
                        raise _shorter_than_its_blocks(name, run_start + count, run_stop)
                    block_checksums.verify(blocks, run_first, run_end, part, chunk=name, start=run_start)
                except BaseException as error:  # noqa: BLE001 - handed to the caller, frames dropped
                    return _without_frames(error)
                finally:
                    part.release()
                return None

            pool = self._thread_pool("slts-checksum")
            others = [pool.submit(run_checked, run) for run in runs[1:]]
            try:
                failures = [run_checked(runs[0])]
            finally:
                wait(others)  # no run reads into the view after the fill
            failures += [other.result() for other in others]
            for failure in failures:
                if failure is not None:
                    raise failure

        return filled_bytes(length, fill)

    def _decode_parts(self, length: int) -> tuple[Callable[[Sequence[Callable[[], None]]], None] | None, int]:
        """How a transformed piece of ``length`` decoded bytes is decoded: at least
        ``read_parallel_bytes_min`` of them in as many runs at once as the machine has
        cores (up to ``read_threads``), on the decode pool (``_run_together``); less in
        the caller's thread."""
        if length < self.config.read_parallel_bytes_min:
            return None, 1
        parts = min(self.config.read_threads, os.cpu_count() or 1)
        return (self._run_together, parts) if parts > 1 else (None, 1)

    def _run_together(self, tasks: Sequence[Callable[[], None]]) -> None:
        """Run ``tasks``: the first in this thread, the rest on the decode pool, each in a
        copy of the caller's context; every one has ended before this returns or raises,
        and the error raised is the first failing task's in their order."""
        pool = self._thread_pool("slts-decode")
        others = [pool.submit(contextvars.copy_context().run, task) for task in tasks[1:]]
        try:
            tasks[0]()
        finally:
            wait(others)
        for other in others:
            other.result()

    def _thread_pool(self, purpose: str) -> ThreadPoolExecutor:
        """The instance's pool for ``purpose`` (its threads' name prefix), made on first
        use with ``read_threads`` threads: one per concurrent piece or large write is the
        most that helps. ``StorageClosed`` after ``close``."""
        with self._pool_lock:
            pool = self._pools.get(purpose)
            if pool is None:
                self._check_open()
                pool = self._pools[purpose] = ThreadPoolExecutor(
                    self.config.read_threads, thread_name_prefix=purpose
                )
            return pool

    def _new_read_ahead(self) -> ReadAhead | None:
        """The instance's read-ahead, if the configuration turns it on for its binding:
        ``read_ahead_bytes`` > 0, and a binding with ``high_latency_reads`` or
        ``read_ahead_low_latency``."""
        config = self.config
        wanted = self.chunk_storage.high_latency_reads or config.read_ahead_low_latency
        if not wanted or config.read_ahead_bytes == 0:
            return None
        return ReadAhead(config.read_ahead_bytes, config.read_ahead_part_bytes, config.read_threads)

    def read_ahead_statistics(self) -> ReadAheadStatistics | None:
        """What read-ahead did so far and holds now (None when it is off for this instance)."""
        return None if self._read_ahead is None else self._read_ahead.statistics()

    # -- inspection -------------------------------------------------------------------------------------

    def chunks(self, name: str) -> builtins.list[tuple[int, ChunkRecord]]:
        """The segment's chunk list as (start offset, record) pairs, walked from the head,
        as one committed layout (one snapshot of the metadata, whatever changes commit
        meanwhile, from this or another process).

        For tools and tests (``slts verify``, scrub, backup); O(chunks) in one read
        transaction. Raises ``SegmentNotFound``, and ``MetadataCorrupted`` only for a
        list that is broken in a committed state (damage, never a race).
        """
        self._check_open()
        check_segment_name(name)
        return self.context.layout(name)[1]
