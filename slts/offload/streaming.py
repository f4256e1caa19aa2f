"""The PIP-76 streaming offloader on SLTS segments.

A managed ledger (a topic's log of ledgers) offers its entries as they are written; they
are offloaded into *segments* that roll over by size and age, one open at a time::

    offload/<managed ledger>/<uid>          the segment object: streaming blocks
    offload/<managed ledger>/<uid>-index    its index (written when the segment closes)

``streaming_offload(uid, driver_metadata, begin_ledger, begin_entry)`` opens a segment and
returns its ``OffloadHandle``. ``offer_entry`` takes entries into a bounded buffer (a full
buffer refuses: back-pressure, never unbounded memory; a closed segment refuses too) and a
writer thread turns them into blocks: one ledger's consecutive entries, at least
``block_bytes`` (or what is left when the segment closes), padded with the fill pattern.
Each block is one SLTS write (atomic and durable) whose one commit also records it: the
segment's record (``StreamSegmentRecord``: blocks, per-ledger counts, the last durable
entry) and the ledger records it touches (``StreamLedgerRecord``: PIP-76's offload
context) change in the transaction that makes the block's bytes readable
(``ChunkedSegmentStorage.write(..., also=...)``): one metadata sync per block, and no
moment where a block is durable but not recorded.

Durability and resuming: what ``last_offered`` reports after a crash is the last entry of
the last durable block. ``streaming_offload`` with the uid of the managed ledger's open
segment resumes it: the segment continues exactly after its last durable entry; the
caller offers again from there. Nothing is lost and nothing is written twice.

A segment closes when the entries offered to it reach ``max_segment_bytes`` (so it ends
at most one block's headers and padding past it), when it is older than
``max_segment_age_s`` (checked on every offer and by the writer), or on ``close``: the
rest of the buffer is written, the index object follows, both are sealed and the record
turns COMPLETE. A new segment of the managed ledger can be opened only after that.

``read_ledger(ledger_id)`` reads one ledger across every segment holding it, in order.
``delete_ledger`` marks the ledger deleted; a complete segment is deleted once every
ledger in it is.
"""

from __future__ import annotations

import contextlib
import enum
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NoReturn

from slts.errors import (
    EntryOutOfOrder,
    InvalidArgument,
    InvalidOffloadObject,
    OffloadNotFound,
    SegmentNotFound,
)
from slts.limiter import TrafficClass, traffic_class
from slts.metadata.schema import OFFLOAD_STREAM_LEDGERS, OFFLOAD_STREAM_SEGMENTS
from slts.metadata.store import Delete, Expect, Operation, Put, prefix_stop, scan_all
from slts.offload import formats
from slts.offload.ledger_metadata import LedgerInfo, encode_ledger_info
from slts.offload.ledgers import check_ledger_id
from slts.offload.names import segment_index_name, segment_name
from slts.offload.pending import (
    CLOSED,
    FULL,
    HANDED,
    INVALID,
    PAUSE,
    ROLLOVER,
    TAKEN,
    UNORDERED,
    FillingBlock,
    OfferLimits,
    encode,
    new_offer_buffer,
    new_offer_gate,
)
from slts.offload.reading import StreamingLedgerHandle
from slts.offload.records import (
    StreamLedgerRecord,
    StreamSegmentRecord,
    StreamState,
    stream_key,
    stream_prefix,
)
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.segment_names import check_segment_name

#: Pulsar's defaults: ``minBlockSizeInBytes``, ``writeBufferSizeInBytes``,
#: ``maxOffloadSegmentSizeInBytes``, ``maxOffloadSegmentRolloverTimeInSeconds``.
BLOCK_BYTES_DEFAULT = 5 << 20
BUFFER_BYTES_DEFAULT = 10 << 20
MAX_SEGMENT_BYTES_DEFAULT = 1 << 30
MAX_SEGMENT_AGE_S_DEFAULT = 600.0
#: Pulsar's ``minOffloadSegmentRolloverTimeInSeconds``: a segment younger than this does not
#: roll over by size.
MIN_SEGMENT_AGE_S_DEFAULT = 0.0
#: The most bytes of blocks one SLTS write of the writer carries (a block larger goes alone).
WRITE_BATCH_BYTES_MAX = 64 << 20
#: How often (real seconds) the writer looks at the segment's age when nothing arrives.
AGE_CHECK_INTERVAL_S = 1.0
_B = 4  # position of a block's length in its record row: [ledger, first, part, offset, length, last]


class OfferResult(enum.Enum):
    """What ``offer_entry`` did (Pulsar's ``OfferEntryResult``)."""

    OK = "ok"
    FAIL_BUFFER_FULL = "buffer full"
    FAIL_SEGMENT_CLOSED = "segment closed"


@dataclass(frozen=True, slots=True)
class OffloadResult:
    """A closed segment's first and last entries (Pulsar's ``OffloadResult``)."""

    uid: uuid.UUID
    begin_ledger: int
    begin_entry: int
    end_ledger: int
    end_entry: int


class StreamingOffloader:
    """PIP-76's streaming offload of one managed ledger on the container of ``storage``.

    ``threads=False`` runs each handle's writer in the caller's thread instead of its own:
    whole blocks are written during ``offer_entry`` once a block's worth is buffered, and
    ``flush``, ``close`` and ``check_age`` do their writing before they return
    (deterministic: the simulator's mode)."""

    def __init__(
        self,
        storage: ChunkedSegmentStorage,
        managed_ledger: str,
        *,
        block_bytes: int = BLOCK_BYTES_DEFAULT,
        buffer_bytes: int = BUFFER_BYTES_DEFAULT,
        max_segment_bytes: int = MAX_SEGMENT_BYTES_DEFAULT,
        max_segment_age_s: float = MAX_SEGMENT_AGE_S_DEFAULT,
        min_segment_age_s: float = MIN_SEGMENT_AGE_S_DEFAULT,
        clock: Callable[[], float] = time.time,
        threads: bool = True,
    ) -> None:
        if not isinstance(storage, ChunkedSegmentStorage):
            raise InvalidArgument(f"{storage!r} is not a ChunkedSegmentStorage")
        if not isinstance(managed_ledger, str) or not managed_ledger or "\x00" in managed_ledger:
            raise InvalidArgument(f"managed ledger name {managed_ledger!r} must be a non-empty string")
        check_segment_name(segment_index_name(managed_ledger, uuid.UUID(int=0)))
        for value, what in (
            (block_bytes, "block_bytes"),
            (buffer_bytes, "buffer_bytes"),
            (max_segment_bytes, "max_segment_bytes"),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not 256 <= value <= 1 << 40:
                raise InvalidArgument(f"{what} must be an integer in 256..2**40, got {value!r}")
        for seconds, what, low in (
            (max_segment_age_s, "max_segment_age_s", 1e-9),
            (min_segment_age_s, "min_segment_age_s", 0.0),
        ):
            if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds >= low:
                raise InvalidArgument(f"{what} must be a number >= {low:g}, got {seconds!r}")
        if not isinstance(threads, bool):
            raise InvalidArgument(f"threads must be a bool, got {threads!r}")
        self.storage = storage
        self.managed_ledger = managed_ledger
        self.block_bytes = block_bytes
        #: As Pulsar: the buffer holds at least one block's worth.
        self.buffer_bytes = max(buffer_bytes, block_bytes)
        self.max_segment_bytes = max_segment_bytes
        self.max_segment_age_s = float(max_segment_age_s)
        self.min_segment_age_s = float(min_segment_age_s)
        self.clock = clock
        self.threads = threads
        self._ctx = storage.context
        self._store = storage.context.store
        self._live: OffloadHandle | None = None
        self._lock = threading.Lock()
        #: Held by every read-modify-commit of the ledger contexts (the writer and deletes race on them).
        self._records_lock = threading.RLock()

    # -- segments ---------------------------------------------------------------------------------

    def segments(self) -> list[StreamSegmentRecord]:
        """The managed ledger's segments, in sequence."""
        prefix = stream_prefix(self.managed_ledger)
        with self._store.snapshot() as view:
            return [
                StreamSegmentRecord.decode(s.value)
                for _, s in scan_all(view, OFFLOAD_STREAM_SEGMENTS, prefix, prefix_stop(prefix))
            ]

    def open_segment(self) -> StreamSegmentRecord | None:
        """The managed ledger's OPEN segment (being offloaded, or left by a crash), if any."""
        return next((s for s in self.segments() if s.state == StreamState.OPEN), None)

    def failed_segment(self) -> StreamSegmentRecord | None:
        """The FAILED segment awaiting its redo, if any (see ``streaming_offload``)."""
        return next((s for s in self.segments() if s.state == StreamState.FAILED), None)

    def ledger(self, ledger_id: int) -> StreamLedgerRecord:
        """The offload context of ``ledger_id``; ``OffloadNotFound`` if it has none."""
        check_ledger_id(ledger_id)
        with self._store.snapshot() as view:
            stored = view.get(OFFLOAD_STREAM_LEDGERS, stream_key(self.managed_ledger, ledger_id))
        if stored is None:
            raise OffloadNotFound(f"{self.managed_ledger}: ledger {ledger_id} has no offloaded entries")
        return StreamLedgerRecord.decode(stored.value)

    def streaming_offload(
        self,
        uid: uuid.UUID,
        driver_metadata: Mapping[str, str] | None = None,
        begin_ledger: int = 0,
        begin_entry: int = 0,
    ) -> OffloadHandle:
        """Open segment ``uid`` starting at (``begin_ledger``, ``begin_entry``); return its
        handle. One segment is written at a time, and the one before decides:

        * none, or a closed one: a new segment, beginning after the last one's end;
        * an OPEN one with this ``uid``: it is resumed (the begin arguments are then its
          own). Blocks a crash left written but unrecorded are recorded, and the handle
          goes on after the last durable entry (``last_offered``). If the crash came
          during the close (its data object is sealed), the close is finished: the handle
          is closed already (offers return ``FAIL_SEGMENT_CLOSED``, ``result`` has it);
        * a FAILED one, or an OPEN one of another ``uid`` (whose writer is gone): this is
          its redo (PIP-76: a failed segment must be offloaded again before any other),
          which must begin at its begin. Its objects are removed, and one commit drops
          its record and its ledgers' references to it and records the new segment.

        Raises ``InvalidArgument`` (a handle of this offloader is still writing, ``uid``
        used before, a begin that is not the one expected, bad arguments), ``Fenced``,
        ``ReadOnlyInstance``, storage errors (nothing recorded changed then, except that
        a failed segment being redone may have lost some of its objects already)."""
        if not isinstance(uid, uuid.UUID):
            raise InvalidArgument(f"uid {uid!r} is not a uuid.UUID")
        driver = dict(driver_metadata or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in driver.items()):
            raise InvalidArgument("driver metadata maps str keys to str values")
        check_ledger_id(begin_ledger)
        check_ledger_id(begin_entry)
        with self._lock:
            if self._live is not None and self._live.alive:
                raise InvalidArgument(f"{self.managed_ledger}: segment {self._live.uid} is being offloaded")
            segments = self.segments()
            if any(s.uid == uid.bytes for s in segments if s.state != StreamState.OPEN):
                raise InvalidArgument(f"{self.managed_ledger}: uid {uid} was used before")
            last = segments[-1] if segments else None
            if last is not None and last.state == StreamState.OPEN and last.id == uid:
                record, result = self._resume(last)
            elif last is not None and last.state in (StreamState.OPEN, StreamState.FAILED):
                if (begin_ledger, begin_entry) != (last.begin_ledger, last.begin_entry):
                    raise InvalidArgument(
                        f"{self.managed_ledger}: segment {last.id} is {StreamState(last.state).name}:"
                        f" resume it, or redo it from its begin ({last.begin_ledger}, {last.begin_entry}),"
                        f" not from ({begin_ledger}, {begin_entry})"
                    )
                record, result = self._open(last, uid, driver, begin_ledger, begin_entry), None
            else:
                record, result = self._open(last, uid, driver, begin_ledger, begin_entry), None
            self._live = OffloadHandle(
                self,
                record,
                result,
                write_blocks=self._write_blocks,
                close_segment=self._close_segment,
                abandon=self._abandon,
            )
            return self._live

    def _open(
        self,
        last: StreamSegmentRecord | None,
        uid: uuid.UUID,
        driver: dict[str, str],
        begin_ledger: int,
        begin_entry: int,
    ) -> StreamSegmentRecord:
        """Record a new OPEN segment after ``last`` (replacing it if it is to be redone)
        and create its data object."""
        redo = last is not None and last.state in (StreamState.OPEN, StreamState.FAILED)
        reached = max(
            (_reached(s) for s in self.segments() if s.state in (StreamState.COMPLETE, StreamState.DELETING)),
            default=(-1, -1),
        )
        if (begin_ledger, begin_entry) <= reached:
            raise InvalidArgument(
                f"{self.managed_ledger}: a segment must begin after the last one's end"
                f" {reached}, not at ({begin_ledger}, {begin_entry})"
            )
        record = StreamSegmentRecord(
            self.managed_ledger,
            last.sequence + 1 if last is not None else 0,
            uid.bytes,
            StreamState.OPEN,
            self.storage.epoch,
            begin_ledger,
            begin_entry,
            -1,
            -1,
            0,
            [],
            {},
            int(self.clock() * 1000),
            0,
            self.block_bytes,
            driver,
        )
        ops: list[Operation] = [Put(OFFLOAD_STREAM_SEGMENTS, record.key, record.encode())]
        expects = [Expect(OFFLOAD_STREAM_SEGMENTS, record.key, 0)]
        if redo:
            assert last is not None
            failed = self._fail(last)
            self._remove_objects(failed)
            more_ops, more_expects = self._forget_segment(failed)
            ops += more_ops
            expects += more_expects
        self._ctx.ownership.commit(ops, expects)
        self.storage.create(segment_name(self.managed_ledger, uid))
        return record

    def _resume(self, record: StreamSegmentRecord) -> tuple[StreamSegmentRecord, OffloadResult | None]:
        """Take an open segment over after a crash: create its object if the crash came
        before, finish the close if it came during it. Returns the record and, if closed,
        the segment's result."""
        name = segment_name(self.managed_ledger, record.id)
        try:
            info = self.storage.info(name)
        except SegmentNotFound:  # the crash came between the record and the segment's creation
            self.storage.create(name)
            return record, None
        if info.length != record.data_length:  # a block and its record commit together
            raise InvalidOffloadObject(
                f"offload object {name!r} holds {info.length} bytes, its record {record.data_length}",
                object=name,
            )
        if not info.sealed:
            return record, None
        complete = self._close_segment(record)  # sealed only by a close: finish it
        return complete, _result_of(complete)

    def _recorded(self, record: StreamSegmentRecord, block: FillingBlock, length: int) -> StreamSegmentRecord:
        """``record`` with ``block`` (``length`` bytes, written at its end) recorded."""
        ledger_id = block.ledger_id
        counts = dict(record.ledgers)
        seen = counts.get(ledger_id, [0, 0])
        counts[ledger_id] = [seen[0] + block.count, seen[1] + block.payload]
        row = [ledger_id, block.first, len(record.blocks) + 1, record.data_length, length, block.last]
        return record.replace(
            blocks=[*record.blocks, row],
            ledgers=counts,
            data_length=record.data_length + length,
            end_ledger=ledger_id,
            end_entry=block.last,
            epoch=self.storage.epoch,
        )

    def _block_commit(
        self, record: StreamSegmentRecord, updated: StreamSegmentRecord
    ) -> tuple[list[Operation], list[Expect]]:
        """The commit recording blocks: ``updated`` over ``record``, and, for each ledger of
        theirs new to the segment, the segment in that ledger's context."""
        ops: list[Operation] = [Put(OFFLOAD_STREAM_SEGMENTS, updated.key, updated.encode())]
        expects = [
            Expect(OFFLOAD_STREAM_SEGMENTS, record.key, self._version(OFFLOAD_STREAM_SEGMENTS, record.key))
        ]
        for ledger_id in updated.ledgers.keys() - record.ledgers.keys():
            key = stream_key(self.managed_ledger, ledger_id)
            version = self._version(OFFLOAD_STREAM_LEDGERS, key)
            ledger = (
                self.ledger(ledger_id)
                if version
                else StreamLedgerRecord(self.managed_ledger, ledger_id, [], False)
            )
            if record.sequence not in ledger.segments:
                ledger = ledger.replace(segments=[*ledger.segments, record.sequence])
                ops.append(Put(OFFLOAD_STREAM_LEDGERS, key, ledger.encode()))
                expects.append(Expect(OFFLOAD_STREAM_LEDGERS, key, version))
        return ops, expects

    def _replace(self, table: str, record: StreamSegmentRecord | StreamLedgerRecord) -> None:
        """Commit ``record`` over the stored one of its key, expecting its version as read now."""
        self._ctx.ownership.commit(
            [Put(table, record.key, record.encode())],
            [Expect(table, record.key, self._version(table, record.key))],
        )

    def _version(self, table: str, key: bytes) -> int:
        with self._store.snapshot() as view:
            stored = view.get(table, key)
        return 0 if stored is None else stored.version

    def _write_blocks(self, record: StreamSegmentRecord, blocks: list[FillingBlock]) -> StreamSegmentRecord:
        """Write blocks (each one ledger's consecutive entries, framed as offered; in
        order) as one SLTS write whose commit records them too: they are durable and
        recorded at once, or none is (no window for a crash between bytes and record)."""
        assert blocks
        updated = record
        pieces = []
        for block in blocks:
            header, data = encode(block, record.block_bytes)
            updated = self._recorded(updated, block, header.block_length)
            pieces.append(data)
        name = segment_name(self.managed_ledger, record.id)
        with self._records_lock:
            ops, expects = self._block_commit(record, updated)
            handle = self.storage.open_write(name)
            data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            self.storage.write(handle, record.data_length, data, also=ops, expect=expects)
        return updated

    def _close_segment(self, record: StreamSegmentRecord) -> StreamSegmentRecord:
        """Write the index object, seal both objects, record the segment COMPLETE (each
        step may be repeated: a crash in between leaves a close that ``_resume``
        finishes). If every ledger in it was deleted while it was open, delete it."""
        data = segment_name(self.managed_ledger, record.id)
        index = segment_index_name(self.managed_ledger, record.id)
        groups: dict[int, list[formats.IndexEntry]] = {}
        for ledger_id, first, part, offset, _, _ in record.blocks:
            groups.setdefault(ledger_id, []).append(formats.IndexEntry(first, part, offset))
        last_entry = {row[0]: row[5] for row in record.blocks}
        ledgers = {
            ledger_id: formats.LedgerGroup(
                encode_ledger_info(
                    LedgerInfo(ledger_id, last_entry[ledger_id] + 1, record.ledgers[ledger_id][1])
                ),
                entries,
            )
            for ledger_id, entries in groups.items()
        }
        with contextlib.suppress(SegmentNotFound):  # a retry after a crash mid-close starts over
            self.storage.delete(self.storage.open_write(index))
        self.storage.create(index)
        handle = self.storage.open_write(index)
        self.storage.write(handle, 0, formats.StreamingIndex(ledgers, record.data_length).encode())
        self.storage.seal(handle)
        self.storage.seal(self.storage.open_write(data))
        complete = record.replace(state=StreamState.COMPLETE, offloaded_ms=int(self.clock() * 1000))
        with self._records_lock:  # so that a ledger deleted meanwhile is seen here or sees this
            self._replace(OFFLOAD_STREAM_SEGMENTS, complete)
            if complete.ledgers and self._all_deleted(complete):
                self._delete_segment(complete)
        return complete

    # -- failure ----------------------------------------------------------------------------------

    def _fail(self, record: StreamSegmentRecord) -> StreamSegmentRecord:
        """Record the segment of ``record`` FAILED (before any of its objects goes, so a
        crash leaves either a resumable OPEN segment or a FAILED one); return its record."""
        stored = self._stored_segment(record.key)
        if stored is None or stored.uid != record.uid:
            raise InvalidArgument(f"{self.managed_ledger}: segment {record.id} is gone")
        if stored.state == StreamState.FAILED:
            return stored
        assert stored.state == StreamState.OPEN, stored
        failed = stored.replace(state=StreamState.FAILED, epoch=self.storage.epoch)
        self._replace(OFFLOAD_STREAM_SEGMENTS, failed)
        return failed

    def _abandon(self, record: StreamSegmentRecord) -> None:
        """After a writer failed: record its segment FAILED and remove its objects, each
        step best effort (what is left is the redo's or ``cleanup``'s)."""
        with contextlib.suppress(Exception):
            self._remove_objects(self._fail(record))

    def _remove_objects(self, record: StreamSegmentRecord) -> bool:
        """Delete both objects of a FAILED or DELETING segment (those that exist); return
        whether there were any."""
        assert record.state in (StreamState.FAILED, StreamState.DELETING), record
        removed = False
        for name in (
            segment_name(self.managed_ledger, record.id),
            segment_index_name(self.managed_ledger, record.id),
        ):
            with contextlib.suppress(SegmentNotFound):
                self.storage.delete(self.storage.open_write(name))
                removed = True
        return removed

    def _stored_segment(self, key: bytes) -> StreamSegmentRecord | None:
        with self._store.snapshot() as view:
            stored = view.get(OFFLOAD_STREAM_SEGMENTS, key)
        return None if stored is None else StreamSegmentRecord.decode(stored.value)

    # -- read, delete and clean-up ----------------------------------------------------------------

    def read_ledger(self, ledger_id: int) -> StreamingLedgerHandle:
        """A read handle of ``ledger_id`` across every segment holding its entries (durable
        blocks of the open segment included, a FAILED segment's left out: its entries are
        the redo's). Raises ``OffloadNotFound`` (no readable entries, or deleted),
        ``InvalidOffloadObject`` (a segment in a format version this reader does not know)."""
        ledger = self.ledger(ledger_id)
        if ledger.deleted:
            raise OffloadNotFound(f"{self.managed_ledger}: ledger {ledger_id} was deleted")
        by_sequence = {s.sequence: s for s in self.segments()}
        readable = [
            by_sequence[sequence]
            for sequence in ledger.segments
            if by_sequence[sequence].state in (StreamState.OPEN, StreamState.COMPLETE)
        ]
        for segment in readable:
            formats.check_format_version(
                segment.format_version, segment_name(self.managed_ledger, segment.id)
            )
        blocks = [(segment, row) for segment in readable for row in segment.blocks if row[0] == ledger_id]
        if not blocks:
            raise OffloadNotFound(f"{self.managed_ledger}: ledger {ledger_id} has no offloaded entries")
        return StreamingLedgerHandle(self.storage, self.managed_ledger, ledger_id, blocks)

    def delete_ledger(self, ledger_id: int) -> list[uuid.UUID]:
        """Mark ``ledger_id`` deleted and delete the complete segments whose ledgers are
        all deleted now; return their uids. A segment still open is deleted when it
        closes, a failed one is its redo's. Raises ``OffloadNotFound``, ``Fenced``,
        ``ReadOnlyInstance``."""
        with self._records_lock:
            ledger = self.ledger(ledger_id)
            if not ledger.deleted:
                self._replace(OFFLOAD_STREAM_LEDGERS, ledger.replace(deleted=True))
            removed = []
            for segment in self.segments():
                if (
                    segment.sequence in ledger.segments
                    and segment.state in (StreamState.COMPLETE, StreamState.DELETING)
                    and self._all_deleted(segment)
                ):
                    self._delete_segment(segment)
                    removed.append(segment.id)
            return removed

    def cleanup(self) -> list[uuid.UUID]:
        """Free what deletes and failures left behind: finish the deletes a crash
        interrupted (DELETING), delete the complete segments whose ledgers are all deleted,
        remove the objects a FAILED segment still has (its record stays until its redo).
        Returns the uids of the segments deleted or whose objects were removed. A read-only instance does
        nothing. Raises ``Fenced``, storage errors (what is left stays for the next run)."""
        if self._ctx.ownership.read_only:
            return []
        removed = []
        with self._records_lock:
            for segment in self.segments():
                if segment.state == StreamState.DELETING or (
                    segment.state == StreamState.COMPLETE and self._all_deleted(segment)
                ):
                    self._delete_segment(segment)
                    removed.append(segment.id)
                elif segment.state == StreamState.FAILED and self._remove_objects(segment):
                    removed.append(segment.id)
            self._drop_empty_deleted_contexts()
        return removed

    def _drop_empty_deleted_contexts(self) -> None:
        """Drop the tombstones (deleted ledgers' contexts without segments) of ledgers no
        segment can take entries of again: below the ledger of the last closed segment's
        end (later segments begin after it) and below the begin of a segment being written
        or awaiting its redo; all of them once the managed ledger has no segment."""
        segments = self.segments()
        closed = [_reached(s)[0] for s in segments if s.state in (StreamState.COMPLETE, StreamState.DELETING)]
        writing = [s.begin_ledger for s in segments if s.state in (StreamState.OPEN, StreamState.FAILED)]
        prefix = stream_prefix(self.managed_ledger)
        # No segment left: no redo can offer a deleted ledger again, every tombstone goes.
        below = min(closed[-1:] + writing, default=None)
        stop = prefix_stop(prefix) if below is None else stream_key(self.managed_ledger, max(below, 0))
        with self._store.snapshot() as view:
            gone = [
                (key, stored.version)
                for key, stored in scan_all(view, OFFLOAD_STREAM_LEDGERS, prefix, stop)
                if (ledger := StreamLedgerRecord.decode(stored.value)).deleted and not ledger.segments
            ]
        if gone:
            self._ctx.ownership.commit(
                [Delete(OFFLOAD_STREAM_LEDGERS, key) for key, _ in gone],
                [Expect(OFFLOAD_STREAM_LEDGERS, key, version) for key, version in gone],
            )

    def _all_deleted(self, segment: StreamSegmentRecord) -> bool:
        """Whether every ledger with entries in ``segment`` was deleted (a ledger without
        a context counts as deleted: its context went with its last segment)."""
        with self._store.snapshot() as view:
            for ledger_id in segment.ledgers:
                stored = view.get(OFFLOAD_STREAM_LEDGERS, stream_key(self.managed_ledger, ledger_id))
                if stored is not None and not StreamLedgerRecord.decode(stored.value).deleted:
                    return False
        return True

    def _delete_segment(self, segment: StreamSegmentRecord) -> None:
        """DELETING, both objects, then the record and its ledgers' references to it."""
        with self._records_lock:
            if segment.state != StreamState.DELETING:
                deleting = segment.replace(state=StreamState.DELETING)
                self._replace(OFFLOAD_STREAM_SEGMENTS, deleting)
                segment = deleting
            self._remove_objects(segment)
            self._ctx.ownership.commit(*self._forget_segment(segment))

    def _forget_segment(self, segment: StreamSegmentRecord) -> tuple[list[Operation], list[Expect]]:
        """The operations (and their expectations) that drop ``segment``'s record and its
        ledgers' references to it. A context left without segments goes too, unless its
        ledger was deleted: that one stays as a tombstone, so that entries of the ledger
        offered again (a redo offers a failed segment's entries again, from its begin) land
        deleted, not in a fresh context that would make them readable; ``cleanup`` drops
        tombstones once nothing can offer their ledger again."""
        ops: list[Operation] = [Delete(OFFLOAD_STREAM_SEGMENTS, segment.key)]
        expects = [
            Expect(OFFLOAD_STREAM_SEGMENTS, segment.key, self._version(OFFLOAD_STREAM_SEGMENTS, segment.key))
        ]
        with self._store.snapshot() as view:
            for ledger_id in segment.ledgers:
                key = stream_key(self.managed_ledger, ledger_id)
                stored = view.get(OFFLOAD_STREAM_LEDGERS, key)
                if stored is None:
                    continue
                ledger = StreamLedgerRecord.decode(stored.value)
                rest = [s for s in ledger.segments if s != segment.sequence]
                ops.append(
                    Put(OFFLOAD_STREAM_LEDGERS, key, ledger.replace(segments=rest).encode())
                    if rest or ledger.deleted
                    else Delete(OFFLOAD_STREAM_LEDGERS, key)
                )
                expects.append(Expect(OFFLOAD_STREAM_LEDGERS, key, stored.version))
        return ops, expects


def managed_ledgers(storage: ChunkedSegmentStorage) -> list[str]:
    """The managed ledgers with streaming segments on the container of ``storage``, sorted."""
    names: list[str] = []
    with storage.context.store.snapshot() as view:
        start = b""
        while True:
            found = next(iter(view.scan(OFFLOAD_STREAM_SEGMENTS, start, None, limit=1)), None)
            if found is None:
                return names
            name = found[0][: found[0].index(b"\x00")]
            names.append(name.decode())
            after = prefix_stop(name + b"\x00")
            if after is None:
                return names
            start = after


def _reached(segment: StreamSegmentRecord) -> tuple[int, int]:
    """The (ledger, entry) a closed segment reaches: its end, or just before its begin if
    it closed empty (its successors must not begin before it)."""
    if (segment.end_ledger, segment.end_entry) != (-1, -1):
        return segment.end_ledger, segment.end_entry
    return segment.begin_ledger, segment.begin_entry - 1


def _result_of(record: StreamSegmentRecord) -> OffloadResult:
    return OffloadResult(
        record.id, record.begin_ledger, record.begin_entry, record.end_ledger, record.end_entry
    )


_OK = OfferResult.OK


class OffloadHandle:
    """One streaming segment being written (Pulsar's ``OffloadHandle``). A writer (its own
    thread, or the caller's with ``threads=False``) turns the offered entries into blocks.
    Thread-safe.

    Sizes, as Pulsar counts them: the segment's size is the payload of the entries offered
    to it (framing, headers and padding are not counted); the buffer holds payload, and an
    offer is refused only once the buffer already holds ``buffer_bytes`` (so it may overfill
    by one entry, and an entry larger than the buffer is taken when the buffer is empty).
    """

    def __init__(
        self,
        offloader: StreamingOffloader,
        record: StreamSegmentRecord,
        result: OffloadResult | None,
        *,
        write_blocks: Callable[[StreamSegmentRecord, list[FillingBlock]], StreamSegmentRecord],
        close_segment: Callable[[StreamSegmentRecord], StreamSegmentRecord],
        abandon: Callable[[StreamSegmentRecord], None],
    ) -> None:
        self._offloader = offloader
        self._write_blocks = write_blocks
        self._close_segment = close_segment
        self._abandon = abandon
        self._record = record
        self.uid = record.id
        self._assigned_s = record.assigned_ms / 1000
        #: One lock: ``with self._lock`` (taken per offer, in C) and ``self._cond`` on it.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        last = (record.end_ledger, record.end_entry)
        #: The entries offered and not yet taken by the writer, and what offers count
        #: (``slts.offload.pending.OfferBuffer``); its ``closing``: the segment closes.
        self._offers = new_offer_buffer(
            (record.begin_ledger, record.begin_entry),
            None if last == (-1, -1) else last,
            sum(payload for _, payload in record.ledgers.values()),
            OfferLimits(
                offloader.buffer_bytes,
                offloader.block_bytes,
                offloader.max_segment_bytes,
                record.assigned_ms / 1000,
                offloader.max_segment_age_s,
                offloader.min_segment_age_s,
            ),
            result is not None,
        )
        #: ``offer_entry``, bound per handle (see there).
        self._gate = new_offer_gate(
            self._lock, self._offers, offloader.clock, _OK, self._offer_locked, self._offered
        )
        self.offer_entry = self._gate  # type: ignore[method-assign,assignment]
        self._finished = result is not None
        self._flushes = 0
        self._done_flushes = 0
        self._error: BaseException | None = None
        self._result = result
        self._writer: threading.Thread | None = None
        if offloader.threads and result is None:
            self._writer = threading.Thread(target=self._run, name=f"slts-offload-{self.uid}", daemon=True)
            self._writer.start()

    @property
    def alive(self) -> bool:
        """Whether the segment is still being written (neither closed nor failed)."""
        if self._writer is not None:
            return self._writer.is_alive()
        with self._lock:
            return self._alive_locked()

    def _alive_locked(self) -> bool:
        """``alive``, for a caller that holds the lock."""
        return self._writer.is_alive() if self._writer is not None else not self._finished

    def last_offered(self) -> tuple[int, int] | None:
        """The (ledger, entry) last taken (after a resume: the last durable one)."""
        with self._lock:
            return self._offers.last

    def can_offer(self, size: int) -> bool:
        """Whether an entry (of any ``size``) would be taken now."""
        with self._lock:
            return not self._offers.closing and self._offers.buffered < self._offloader.buffer_bytes

    def offer_entry(self, ledger_id: int, entry_id: int, data: bytes) -> OfferResult:
        """Take an entry. It must follow the last one offered: the next entry of the same
        ledger, or entry 0 of a later ledger (the first one: the segment's begin). The offer
        that brings the segment's payload to ``max_segment_bytes`` (once the segment is
        ``min_segment_age_s`` old) closes it, as does its age.
        Raises ``EntryOutOfOrder`` (nothing taken), ``InvalidArgument``, and the writer's
        error once it failed.

        (Each handle binds ``offer_entry`` to its offer gate, ``pending.OfferGate``: an
        offer runs per entry, and the gate takes an entry with no Python frame at all.)"""
        return self._gate(ledger_id, entry_id, data)  # type: ignore[return-value]

    def _offer_locked(self, outcome: int, ledger_id: int, entry_id: int, data: bytes) -> OfferResult | None:
        """The gate's ``locked``: under the lock, an offer that did more than take the
        entry (``outcome``): the refusal to answer, or None once taken (a block's worth
        for the writer, or the segment's size reached)."""
        if not outcome & TAKEN:
            return self._refused(outcome, ledger_id, entry_id, data)
        if outcome & ROLLOVER:
            self._start_closing()
        elif outcome & HANDED:
            self._cond.notify_all()  # a block's worth: the writer has work (not before)
        return None

    def _offered(self, outcome: int) -> None:
        """The gate's ``after``: the lock released, the writer's turn."""
        if self._writer is None:
            self._drive()  # the caller's thread writes what is due
        elif outcome & (HANDED | PAUSE):
            time.sleep(0)  # let the writer in: to take the block, or back after an I/O call

    def _refused(self, outcome: int, ledger_id: int, entry_id: int, data: bytes) -> OfferResult:
        """Under the lock: what an offer the buffer did not take (``outcome``) answers."""
        if outcome & INVALID:
            check_ledger_id(ledger_id)
            check_ledger_id(entry_id)
            raise InvalidArgument("an entry is a bytes object of at most 2**31-1 bytes")
        if self._error is not None:
            raise self._error
        if outcome & CLOSED:
            self._start_closing()
            return OfferResult.FAIL_SEGMENT_CLOSED
        if outcome & UNORDERED:
            self._unordered(ledger_id, entry_id)
        assert outcome == FULL, outcome
        return OfferResult.FAIL_BUFFER_FULL

    def _unordered(self, ledger_id: int, entry_id: int) -> NoReturn:
        """Raise ``EntryOutOfOrder``: the entry does not follow the last one offered."""
        expected = self._offers.last
        raise EntryOutOfOrder(
            f"{self._offloader.managed_ledger}: entry ({ledger_id}, {entry_id}) does not follow"
            f" {expected if expected is not None else 'the segment begin'}"
            f" ({self._record.begin_ledger}, {self._record.begin_entry})",
            ledger=ledger_id,
            entry=entry_id,
        )

    def wait_for_room(self, timeout: float | None = None) -> None:
        """After ``FAIL_BUFFER_FULL``: wait until an offer would find room (the writer took
        a block out of the buffer), the segment closed, or the writer failed (its error is
        raised). Unlike ``flush`` it writes no short, padded block. Without a writer thread
        the due blocks are written here. Raises ``TimeoutError``."""
        self._drive()
        with self._lock:
            if not self._cond.wait_for(
                lambda: (
                    self._offers.buffered < self._offloader.buffer_bytes
                    or self._offers.closing
                    or self._error is not None
                    or not self._alive_locked()
                ),
                timeout,
            ):
                raise TimeoutError(f"segment {self.uid}: no room in the buffer after {timeout} s")
            if self._error is not None:
                raise self._error

    def flush(self, timeout: float | None = None) -> None:
        """Write every entry offered so far (the last block may be short of
        ``block_bytes``: it is padded) and wait until it is durable. Raises the writer's
        error."""
        with self._lock:
            self._flushes += 1
            target = self._flushes
            self._cond.notify_all()
        self._drive()
        with self._lock:
            if not self._cond.wait_for(
                lambda: self._done_flushes >= target or self._error is not None or not self._alive_locked(),
                timeout,
            ):
                raise TimeoutError(f"segment {self.uid}: flush did not finish in {timeout} s")
            if self._error is not None:
                raise self._error

    def close(self, timeout: float | None = None) -> OffloadResult:
        """Write what is buffered and close the segment; return its result."""
        with self._lock:
            self._start_closing()
        self._drive()
        return self.result(timeout)

    def result(self, timeout: float | None = None) -> OffloadResult:
        """Wait until the segment is closed (by size, age or ``close``); its result.
        Raises the writer's error, ``TimeoutError``, and ``InvalidArgument`` for a segment
        still open without a writer thread (``threads=False``: close it first)."""
        if self._writer is not None:
            self._writer.join(timeout)
            if self._writer.is_alive():
                raise TimeoutError(f"segment {self.uid} is still open after {timeout} s")
        with self._lock:
            if self._error is not None:
                raise self._error
            if self._result is None:
                raise InvalidArgument(f"segment {self.uid} is still open")
            return self._result

    def check_age(self) -> None:
        """Close the segment if it is older than ``max_segment_age_s`` (the writer thread
        does this on its own about every second)."""
        with self._lock:
            if self._age() >= self._offloader.max_segment_age_s:
                self._start_closing()
        self._drive()

    def _age(self) -> float:
        return self._offloader.clock() - self._assigned_s

    def _start_closing(self) -> None:
        self._offers.closing = True
        self._cond.notify_all()

    # -- the writer -------------------------------------------------------------------------------

    def _drive(self) -> None:
        """Without a writer thread: do the writer's work that is due, in this thread."""
        if self._writer is not None:
            return
        while self._step(wait=False):
            pass

    def _run(self) -> None:
        while self._step(wait=True):
            pass

    def _step(self, *, wait: bool) -> bool:
        """One piece of the writer's work: a block, a flush's completion or the close.
        Returns whether to go on: False once finished or failed, or when idle and not
        ``wait``ing (the caller's thread then returns; a writer thread waits for work)."""
        with self._lock:
            if self._finished:
                return False
            while not self._ready():
                if not wait:
                    return False
                self._cond.wait(AGE_CHECK_INTERVAL_S)
                if self._age() >= self._offloader.max_segment_age_s:
                    self._offers.closing = True
            blocks, flushing = self._take_blocks()
        try:
            with traffic_class(TrafficClass.OFFLOAD):  # the writer's blocks are offload traffic
                if blocks:
                    self._offers.writing = self._writer is not None  # (see PAUSE_EVERY)
                    try:
                        self._record = self._write_blocks(self._record, blocks)
                    finally:
                        self._offers.writing = False
                    return True
                with self._lock:
                    self._done_flushes = max(self._done_flushes, flushing)
                    self._cond.notify_all()
                    offers = self._offers
                    if not offers.closing or offers.has_full or offers.has_filling:
                        return wait  # idle: a thread waits for more, the caller's thread returns
                self._record = self._close_segment(self._record)
                with self._lock:
                    self._result = _result_of(self._record)
                    self._finished = True
                    self._cond.notify_all()
                return False
        except BaseException as exc:  # noqa: BLE001 - kept for the caller: result(), flush(), offers raise it
            self._abandon(self._record)
            with self._lock:
                self._error = exc
                self._finished = True
                self._offers.closing = True  # offers now raise the error
                self._cond.notify_all()
            return False

    def _ready(self) -> bool:
        return self._offers.has_full or self._offers.closing or self._flushes > self._done_flushes

    def _take_blocks(self) -> tuple[list[FillingBlock], int]:
        """Under the lock: the blocks to write next, in order: the full ones (as many as
        fit in ``WRITE_BATCH_BYTES_MAX``, at least one), then, with a flush or the close
        asked for and none left full, the one being filled; with the flush number they
        satisfy. Several blocks are there when the writer fell behind the offers: they go
        in one write and one commit (one data sync and one metadata sync for all), so a
        writer slower than its producer catches up instead of falling further behind."""
        flushing = self._flushes
        offers = self._offers
        blocks = offers.take(WRITE_BATCH_BYTES_MAX, offers.closing or self._flushes > self._done_flushes)
        if blocks:
            self._cond.notify_all()
        return blocks, flushing
