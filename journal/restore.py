"""Restore for disaster recovery: rebuild a metadata store from tier-2 alone (DESIGN.md §6).

``restore(binding, container_id, target)`` reads, in order:

1. the system journal (``replay``: read-only, it writes nothing, so restoring never
   fences the instance that may still be running);
2. the latest metadata snapshot, through the snapshot segment's journaled layout
   (start and ``end`` attribute): its entries are loaded with their original versions;
3. the metadata log after the snapshot: each commit is applied with its own sequence,
   in order; a gap in the sequence is damage and stops the restore.

Both are bulk loads (``MetadataStore.replicate_rows``, one write transaction per batch):
the snapshot's pages in batches of ``SNAPSHOT_ROWS_PER_LOAD`` rows, the log in windows of
``LOG_OPS_PER_WINDOW`` operations where the last operation on a key wins (a key put and
deleted within a window costs the store one delete). The log's records are walked
straight from the bytes, CRC and fields checked, by a compiled walk where it was built
(``metadata_copy.changes_python`` is its reference); the few it leaves (sealed records,
damage) are read one by one. Segments are read as views (no copy where the binding maps
its objects).

Finally the container record's epoch is raised to the newest epoch found in the
journal (in a commit of its own), so the instance that starts on the restored store
takes an epoch no earlier instance ever wrote with.

The result is the state at the last flushed log position (the RPO): every segment
reads byte-identical to the source up to it (``slts verify`` proves it).
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from slts.bindings.base import ChunkStorage
from slts.journal import framing, metadata_copy, system_names
from slts.journal.identity import carry_over
from slts.journal.metadata_copy import (
    SNAPSHOT_END,
    SNAPSHOT_SEQUENCE,
    decode_change,
    iter_snapshot,
)
from slts.journal.replay import Replay, replay
from slts.journal.system_layout import SystemLayout
from slts.journal.system_names import METADATA_LOG, METADATA_SNAPSHOTS
from slts.journal.system_segments import iter_range

from slts.chunk_names import leaf_offset
from slts.errors import ChunkNotFound, ChunkStorageError, InvalidArgument, MetadataCorrupted
from slts.metadata.records import ContainerRecord
from slts.metadata.schema import CONTAINER, CONTAINER_KEY
from slts.metadata.store import MetadataStore, Put, Row
from slts.transforms.sealed import RecordSeal


@dataclass(frozen=True, slots=True)
class RestoreReport:
    """What a restore read and rebuilt."""

    snapshot_sequence: int
    snapshot_entries: int
    log_records: int
    sequence: int  # the restored store's sequence before the epoch commit
    epoch: int
    bytes_read: int
    journal_records: int
    seconds: float


def restore(
    binding: ChunkStorage,
    container_id: int,
    target: MetadataStore,
    found: Replay | None = None,
    seal: RecordSeal | None = None,
) -> RestoreReport:
    """Rebuild container ``container_id``'s metadata into the empty store ``target``
    (``found``: a journal replay already made, else one is made here). ``seal`` opens the
    sealed records of an encrypted store's copy (``KeyUnavailable`` without it).

    Raises ``InvalidArgument`` if ``target`` is not empty, ``MetadataCorrupted`` if
    tier-2 holds no restorable state or it is damaged, ``ChunkStorageError`` on I/O.
    """
    if target.last_sequence != 0:
        raise InvalidArgument(
            f"restore needs an empty metadata store; this one is at sequence {target.last_sequence}"
        )
    began = time.perf_counter()
    found = found or replay(binding, container_id, seal=seal)
    if found.max_epoch == 0:
        raise MetadataCorrupted(
            f"no system journal of container {container_id} on {binding.url or binding!r}"
        )
    with _collector_paused():
        snapshot_sequence, entries, read = _load_snapshot(binding, found, target, seal)
        records, log_read, sequence = _replay_log(binding, found, target, snapshot_sequence, seal)
    epoch = _raise_epoch(target, container_id, found.max_epoch, sequence)
    carry_over(binding, container_id, target, target.last_sequence)  # the restored metadata is this store's
    return RestoreReport(
        snapshot_sequence,
        entries,
        records,
        sequence,
        epoch,
        read + log_read + found.bytes_read,
        found.records,
        time.perf_counter() - began,
    )


#: Rows of the metadata snapshot loaded per ``replicate_rows`` (one write transaction).
SNAPSHOT_ROWS_PER_LOAD = 20_000
#: Operations of log records one window gathers before it is replicated (one write
#: transaction, ``replicate_rows``; the last operation on each key wins, so the window
#: holds at most this many rows, or one record's operations).
LOG_OPS_PER_WINDOW = 20_000


def _load_snapshot(
    binding: ChunkStorage, found: Replay, target: MetadataStore, seal: RecordSeal | None
) -> tuple[int, int, int]:
    layout = found.layout.segment(METADATA_SNAPSHOTS)
    if SNAPSHOT_SEQUENCE not in layout.attrs:
        return 0, 0, 0  # no snapshot yet: the log starts at the first commit
    sequence, end = layout.attrs[SNAPSHOT_SEQUENCE], layout.attrs[SNAPSHOT_END]
    entries = 0
    pieces = _Counted(iter_range(binding, layout, layout.start_offset, end, views=True))
    batch: dict[str, list[Any]] = {}
    batched = 0
    for header_sequence, table, rows in iter_snapshot(pieces, seal, raw_rows=True):
        if header_sequence != sequence:
            raise MetadataCorrupted(
                f"metadata snapshot says sequence {header_sequence}, journal says {sequence}"
            )
        if batched and batched + len(rows) > SNAPSHOT_ROWS_PER_LOAD:
            _replicate_rows(target, sequence, batch)
            batch, batched = {}, 0
        if rows:
            batch.setdefault(table, []).extend(rows)
            batched += len(rows)
            entries += len(rows)
    if batched or target.last_sequence < sequence:  # an empty snapshot still sets the sequence
        _replicate_rows(target, sequence, batch)
    return sequence, entries, pieces.bytes


def _replicate_rows(target: MetadataStore, sequence: int, rows: dict[str, Any]) -> None:
    """``target.replicate_rows``; rows it refuses came from tier-2 (restore made the
    sequences and the target is fresh), so they are damage: ``MetadataCorrupted``."""
    try:
        target.replicate_rows(sequence, rows)
    except InvalidArgument as exc:
        raise MetadataCorrupted(f"restored rows refused at sequence {sequence}: {exc}") from exc


class _Counted:
    """Pieces of a byte stream, counting the bytes that went by."""

    def __init__(self, pieces: Iterator[bytes | memoryview]) -> None:
        self._pieces = pieces
        self.bytes = 0

    def __iter__(self) -> Iterator[bytes | memoryview]:
        for piece in self._pieces:
            self.bytes += len(piece)
            yield piece


class _LogWindow:
    """The log records being restored, gathered for one ``replicate_rows``: per table, key
    -> (key, sequence, value or None), the last operation on each key winning. Applying
    it at the last sequence gathered leaves the store as applying each commit in turn,
    each put with its own commit's sequence as version, would."""

    def __init__(self, target: MetadataStore, after: int) -> None:
        self.target = target
        self.sequence = after  # the last commit gathered (or applied)
        self.records = 0
        self.ops = 0
        self.tables: dict[str, dict[bytes, Row]] = {table: {} for table in target.tables}

    def flush(self) -> None:
        if self.ops or self.sequence > self.target.last_sequence:
            # Sorted here (keys are distinct: tuples compare by key alone), so that the
            # store takes them as they come.
            rows = {table: sorted(rows.values()) for table, rows in self.tables.items() if rows}
            _replicate_rows(self.target, self.sequence, rows)
        self.tables = {table: {} for table in self.tables}
        self.ops = 0

    def feed(self, data: bytes | memoryview, offset: int, seal: RecordSeal | None) -> int:
        """Gather the records of ``data`` from ``offset``: runs of plain records by the
        compiled walk where it was built, every other record (all of them without it) one
        by one; return where the frame that ``data`` ends inside starts (``len(data)`` if
        none). (``changes_python``, the walk's twin, is a reference for tests: without the
        compiled walk, one by one is as fast.)"""
        walk = metadata_copy.NATIVE.changes if metadata_copy.NATIVE is not None else None
        size = len(data)
        while offset < size:
            if walk is not None:
                offset, self.sequence, records, ops, full = walk(
                    data, offset, self.sequence, self.tables, LOG_OPS_PER_WINDOW
                )
                self.records += records
                self.ops += ops
                if full:
                    self.flush()
                    continue
                if offset >= size:
                    break
            found = framing.read_record_strict(data, offset, seal)
            if found is None:
                break  # the frame goes on in the next piece
            offset, record = found
            self._gather(record)
        return offset

    def _gather(self, record: dict[str, Any]) -> None:
        """One record read one by one (sealed, or not plain: damage raises here)."""
        change_sequence, change = decode_change(record)
        if change_sequence <= self.sequence:
            return  # covered by the snapshot (the log is truncated at batch boundaries)
        if change_sequence != self.sequence + 1:
            raise MetadataCorrupted(f"metadata log jumps from {self.sequence} to {change_sequence}")
        if self.ops and self.ops + len(change) > LOG_OPS_PER_WINDOW:
            self.flush()
        for op in change:
            value = op.value if isinstance(op, Put) else None
            self.tables.setdefault(op.table, {})[op.key] = (op.key, change_sequence, value)
        self.sequence = change_sequence
        self.records += 1
        self.ops += len(change)


def _replay_log(
    binding: ChunkStorage, found: Replay, target: MetadataStore, after: int, seal: RecordSeal | None
) -> tuple[int, int, int]:
    """Apply the log's commits after ``after`` in order, in windows (``_LogWindow``): the
    same records and versions as one ``replicate`` per commit, in few write transactions.
    A record that spans two pieces of the segment is put together from both."""
    layout = found.layout.segment(METADATA_LOG)
    pieces = _Counted(iter_range(binding, layout, layout.start_offset, layout.length, views=True))
    window = _LogWindow(target, after)
    carry = b""
    for piece in pieces:
        offset = 0
        if carry:
            frame, offset = framing.completed(carry, piece)
            if frame is None:
                carry += bytes(piece)
                continue
            if window.feed(frame, 0, seal) != len(frame):
                raise AssertionError("a completed frame is whole")
            carry = b""
        stop = window.feed(piece, offset, seal)
        carry = bytes(piece[stop:])
    if carry:
        raise MetadataCorrupted(f"{len(carry)} bytes of a partial record at the end of the metadata log")
    window.flush()
    return window.records, pieces.bytes, window.sequence


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a restore decodes: it makes a tuple per
    operation, and the collector would scan the window's hundreds of thousands of them
    again and again (restore makes no cycles; msgpack's docs give the same advice for
    large unpacks). The window bounds what is alive meanwhile."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _raise_epoch(target: MetadataStore, container_id: int, journal_epoch: int, sequence: int) -> int:
    stored = target.get(CONTAINER, CONTAINER_KEY)
    recorded = ContainerRecord.decode(stored.value) if stored else None
    if recorded is not None and recorded.container_id != container_id:
        raise MetadataCorrupted(
            f"restored metadata belongs to container {recorded.container_id}, not {container_id}"
        )
    if recorded is not None and recorded.epoch >= journal_epoch:
        return recorded.epoch
    raised = ContainerRecord(container_id, journal_epoch, recorded.started_ms if recorded else 0)
    target.replicate(sequence + 1, [Put(CONTAINER, CONTAINER_KEY, raised.encode())])
    return journal_epoch


@dataclass
class CopyReport:
    """What ``verify_copy`` found about a container's tier-2 copy of its metadata."""

    exists: bool = False
    sequence: int = 0  # the sequence a restore would reach
    segments: int = 0  # live segments in the restorable state
    problems: list[str] = field(default_factory=list)


def _truncated_away(layout: SystemLayout, container_id: int, name: str) -> bool:
    """Does chunk ``name`` start below its system segment's start (dropped by a durable
    truncate whose delete failed: the owner deletes it again before its next change, a
    boot removes it too)?"""
    for segment, segment_layout in layout.segments.items():
        if name.startswith(system_names.segment_chunks_prefix(container_id, segment)):
            offset = leaf_offset(name)
            return offset is not None and offset < segment_layout.start_offset
    return False


def verify_copy(binding: ChunkStorage, container_id: int, seal: RecordSeal | None = None) -> CopyReport:
    """Check that tier-2 alone restores: replay the journal, check the system segments'
    layouts and chunks, restore into memory (every record decodes, the log has no gap),
    and find system-segment chunks of older epochs that nothing references (leaks).
    Reads only; never raises for damage, which it reports as problems."""
    from slts.journal.journal import stale_system_chunks

    from slts.metadata.memory_store import MemoryMetadataStore
    from slts.metadata.schema import SEGMENTS, TABLES

    report = CopyReport()
    found = replay(binding, container_id, seal=seal)
    if found.max_epoch == 0:
        return report
    report.exists = True
    report.problems.extend(found.layout.check())
    for layout in found.layout.segments.values():
        for chunk in layout.chunks:
            try:
                stored = binding.get_info(chunk.name).length
            except ChunkNotFound:
                report.problems.append(f"system chunk {chunk.name!r} of {layout.name} is missing")
                continue
            if stored < chunk.length:
                report.problems.append(
                    f"system chunk {chunk.name!r} holds {stored} bytes, {chunk.length} journaled"
                )
    report.problems.extend(
        f"system chunk {name!r} is referenced by no journal state (leak)"
        for name in stale_system_chunks(binding, container_id, found.layout, found.max_epoch)
        if not _truncated_away(found.layout, container_id, name)
    )
    if report.problems:
        return report
    with MemoryMetadataStore(TABLES) as target:
        try:
            restored = restore(binding, container_id, target, found, seal)
        except (MetadataCorrupted, ChunkStorageError) as exc:
            report.problems.append(f"tier-2 copy does not restore: {exc}")
            return report
        report.sequence = restored.sequence
        report.segments = sum(1 for _ in target.iterate(SEGMENTS))
    return report


def restore_to_folder(
    binding: ChunkStorage, container_id: int, folder: str, seal: RecordSeal | None = None
) -> RestoreReport:
    """``restore`` into a new LMDB store in ``folder`` (absent or empty), made durable at the
    end: loaded without a sync per commit, then the data file is synced once.

    The store is built in the sibling folder ``<folder>.restoring`` and renamed to
    ``folder`` only once complete (then the parent folder is synced), so ``folder`` never
    holds a partial store, whatever stops the restore (an error, or a crash: a partial
    store would open as a container lacking the tail of the log). A ``.restoring`` folder
    left by a restore that died is removed by the next one.

    Raises ``InvalidArgument`` if ``folder`` holds anything; on any error the partial
    store is removed again, so a failed restore can be retried as is.
    """
    import shutil

    from slts.metadata.lmdb_store import LmdbMetadataStore
    from slts.metadata.schema import TABLES

    if not isinstance(folder, str) or not folder:
        raise InvalidArgument(f"restore needs a target folder, got {folder!r}")
    if os.path.exists(folder) and (not os.path.isdir(folder) or os.listdir(folder)):
        raise InvalidArgument(f"restore target {folder!r} exists and is not an empty folder")
    final = os.path.abspath(folder)
    parent = os.path.dirname(final)
    staging = final + ".restoring"
    os.makedirs(parent, exist_ok=True)
    shutil.rmtree(staging, ignore_errors=True)  # left by a restore that died: never a complete store
    os.makedirs(staging)
    try:
        with LmdbMetadataStore(staging, TABLES, durable=False) as target:
            report = restore(binding, container_id, target, seal=seal)
        for name in sorted(os.listdir(staging)):
            _fsync(os.path.join(staging, name))
        os.rename(staging, final)  # replaces an empty ``folder`` atomically (POSIX rename)
        _fsync(parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return report


def _fsync(path: str) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
