"""The PIP-17 ledger offloader on SLTS segments.

``offload(handle, uid)`` copies a closed ledger into two SLTS segments in Pulsar's formats
(``slts.offload.formats``)::

    offload/<uid>-ledger-<ledger id>          the data object: 128-byte-header blocks
    offload/<uid>-ledger-<ledger id>-index    the index object

named as Pulsar names the objects, so defrag, GC, verify and the metadata's copy on tier-2
apply to them like to any segment (on S3 a data object is a chain of chunks that defrag
can merge server-side). The attempt is recorded before it writes anything
(``slts.offload.records``): an attempt that fails deletes what it wrote and its record;
one that crashed is cleaned up by the next owner (``cleanup``, also run by ``offload``).

``read_offloaded(ledger_id, uid)`` returns a handle that reads like the source: the index
is read once; a read finds the block of its first entry by binary search in the index,
checks the block's header, and walks the framed entries with ranged reads of at least
``read_ahead_bytes``, continuing where the previous read stopped (sequential readers read
each byte once). ``delete_offloaded`` marks the attempt DELETING, deletes both objects
(their chunks go to the GC), then the record.

Reads of the source go through PIP-211's flow permits (``slts.offload.throttle``): the
offloader's own, or the ones every offloader of the process shares.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
import weakref
from collections.abc import Mapping, Sequence

from slts.errors import (
    EntryTooLarge,
    InvalidArgument,
    InvalidOffloadObject,
    OffloadNotFound,
    SegmentNotFound,
)
from slts.limiter import TrafficClass, traffic_class
from slts.metadata.schema import OFFLOAD_LEDGERS
from slts.metadata.store import Delete, Expect, Put, prefix_stop, scan_all
from slts.offload import formats, framing
from slts.offload.ledger_metadata import decode_ledger_metadata, encode_ledger_metadata
from slts.offload.ledgers import ENTRY_TYPES, Entry, LedgerReadHandle, check_ledger_id
from slts.offload.names import data_name, index_name
from slts.offload.reading import OffloadedLedger
from slts.offload.records import OffloadRecord, OffloadState, ledger_prefix, record_key
from slts.offload.throttle import FlowPermits, ThrottledReadHandle, process_flow_permits
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.types import SegmentHandle

#: Entries asked of the source per read (Pulsar's ``ENTRIES_PER_READ``).
ENTRIES_PER_READ = 100
#: Bytes per SLTS write while a block is written.
WRITE_BYTES_DEFAULT = 8 << 20
#: Bytes per ranged read of a reader (Pulsar's ``managedLedgerOffloadReadBufferSizeInBytes``).
READ_AHEAD_BYTES_DEFAULT = 1 << 20


#: The keys of the attempts in progress, per instance (every offloader of one instance
#: shares them: an attempt of this epoch not among them is a failed one's leftover).
_IN_PROGRESS: weakref.WeakKeyDictionary[ChunkedSegmentStorage, set[bytes]] = weakref.WeakKeyDictionary()
_IN_PROGRESS_LOCK = threading.Lock()


def _in_progress(storage: ChunkedSegmentStorage) -> set[bytes]:
    with _IN_PROGRESS_LOCK:
        return _IN_PROGRESS.setdefault(storage, set())


class LedgerOffloader:
    """PIP-17's ``LedgerOffloader`` on the container of ``storage`` (the owner; a
    read-only instance can read what was offloaded)."""

    def __init__(
        self,
        storage: ChunkedSegmentStorage,
        *,
        max_block_bytes: int = formats.MAX_BLOCK_BYTES_DEFAULT,
        read_ahead_bytes: int = READ_AHEAD_BYTES_DEFAULT,
        write_bytes: int = WRITE_BYTES_DEFAULT,
        flow_permits: FlowPermits | None = None,
    ) -> None:
        if not isinstance(storage, ChunkedSegmentStorage):
            raise InvalidArgument(f"{storage!r} is not a ChunkedSegmentStorage")
        for value, what, low in (
            (max_block_bytes, "max_block_bytes", formats.HEADER_SIZE + formats.ENTRY_HEADER_SIZE),
            (read_ahead_bytes, "read_ahead_bytes", 1),
            (write_bytes, "write_bytes", 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= formats.INT32_MAX:
                raise InvalidArgument(f"{what} must be an integer in {low}..2**31-1, got {value!r}")
        self.storage = storage
        self.max_block_bytes = max_block_bytes
        self.read_ahead_bytes = read_ahead_bytes
        self.write_bytes = write_bytes
        if flow_permits is not None and not isinstance(flow_permits, FlowPermits):
            raise InvalidArgument(f"{flow_permits!r} is not FlowPermits")
        #: PIP-211's throttle on reads of the source (None: the process-wide permits).
        self.flow_permits = flow_permits
        self._ctx = storage.context
        self._store = storage.context.store

    # -- offload ----------------------------------------------------------------------------------

    def offload(
        self, handle: LedgerReadHandle, uid: uuid.UUID, extra_metadata: Mapping[str, str] | None = None
    ) -> OffloadRecord:
        """Offload the closed ledger ``handle`` as attempt ``uid``; return its COMPLETE record.

        Raises ``InvalidArgument`` (not a read handle, an open or empty ledger, ``uid`` not
        a UUID or already used for this ledger, bad ``extra_metadata``), ``EntryTooLarge``
        (an entry larger than a block's payload), ``Fenced``, ``ReadOnlyInstance``, and
        errors of the source or the storage. On any error nothing of the attempt remains.
        """
        if not isinstance(handle, LedgerReadHandle):
            raise InvalidArgument(f"{handle!r} is not a ledger read handle")
        ledger_id = check_ledger_id(handle.ledger_id)
        if not isinstance(uid, uuid.UUID):
            raise InvalidArgument(f"uid {uid!r} is not a uuid.UUID")
        extra = dict(extra_metadata or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in extra.items()):
            raise InvalidArgument("extra metadata maps str keys to str values")
        if not handle.closed:
            raise InvalidArgument(f"ledger {ledger_id} is not closed: only closed ledgers are offloaded")
        if handle.last_entry_id < 0:
            raise InvalidArgument(f"ledger {ledger_id} has no entries: nothing to offload")
        self.cleanup()
        started = OffloadRecord(
            ledger_id, uid.bytes, OffloadState.STARTED, self.storage.epoch, self.max_block_bytes, extra
        )
        with self._store.snapshot() as view:
            if view.get(OFFLOAD_LEDGERS, started.key) is not None:
                raise InvalidArgument(f"ledger {ledger_id}: uid {uid} was used before")
        in_progress = _in_progress(self.storage)
        in_progress.add(started.key)  # before the commit: cleanup never takes a live attempt
        try:
            self._ctx.ownership.commit(
                [Put(OFFLOAD_LEDGERS, started.key, started.encode())],
                [Expect(OFFLOAD_LEDGERS, started.key, 0)],
            )
            return self._write_attempt(handle, started)
        finally:
            in_progress.discard(started.key)

    def _write_attempt(self, handle: LedgerReadHandle, started: OffloadRecord) -> OffloadRecord:
        """Write the data and index objects of the attempt ``started`` records; return its
        COMPLETE record (on any error, remove what it wrote and its record, then raise)."""
        ledger_id, uid = started.ledger_id, started.id
        written: list[str] = []
        try:
            with traffic_class(TrafficClass.OFFLOAD):  # for the chunk storage's limiter
                index = self._write_data(handle, data_name(ledger_id, uid), written)
                self._write_whole(index_name(ledger_id, uid), index.encode(), written)
            complete = started.replace(
                state=OffloadState.COMPLETE,
                entries=handle.last_entry_id + 1,
                length=handle.length,
                data_length=index.data_object_length,
                blocks=len(index.entries),
            )
            self._replace(started, complete)
        except BaseException:
            self._forget(started, written)
            raise
        return complete

    def _write_data(self, handle: LedgerReadHandle, name: str, written: list[str]) -> formats.OffloadIndex:
        """Write the ledger's blocks into segment ``name``; return the index of them."""
        written.append(name)  # before: a creation whose answer is lost may have landed
        self.storage.create(name)
        segment = self.storage.open_write(name)
        out = _Appender(self.storage, segment, self.write_bytes)
        permits = self.flow_permits if self.flow_permits is not None else process_flow_permits()
        entries = _EntrySource(ThrottledReadHandle(handle, permits))
        index: list[formats.IndexEntry] = []
        payload_written = 0
        last = handle.last_entry_id
        while entries.next_id <= last:
            first = entries.next_id
            size = formats.block_size(self.max_block_bytes, last - first + 1, handle.length - payload_written)
            out.append(formats.BlockHeader(size, first).encode())
            used = formats.HEADER_SIZE
            while entries.next_id <= last:
                taken, framed = entries.frame_fitting(out, size - used)
                if not taken:
                    break
                used += framed
                payload_written += framed - formats.ENTRY_HEADER_SIZE * taken
            if entries.next_id == first:
                raise EntryTooLarge(
                    f"ledger {handle.ledger_id}: entry {first} of {len(entries.peek())} bytes does not fit"
                    f" in a block of {self.max_block_bytes} bytes (payload at most"
                    f" {self.max_block_bytes - formats.HEADER_SIZE - formats.ENTRY_HEADER_SIZE})",
                    ledger=handle.ledger_id,
                    entry=first,
                )
            out.append(formats.padding(size - used))
            index.append(formats.IndexEntry(first, len(index) + 1, out.position - size))
        out.flush()
        self.storage.seal(segment)
        return formats.OffloadIndex(encode_ledger_metadata(handle.metadata), index, out.position)

    def _write_whole(self, name: str, data: bytes, written: list[str]) -> None:
        written.append(name)
        self.storage.create(name)
        segment = self.storage.open_write(name)
        self.storage.write(segment, 0, data)
        self.storage.seal(segment)

    def _replace(self, current: OffloadRecord, updated: OffloadRecord) -> None:
        with self._store.snapshot() as view:
            stored = view.get(OFFLOAD_LEDGERS, current.key)
        assert stored is not None and OffloadRecord.decode(stored.value) == current, current
        self._ctx.ownership.commit(
            [Put(OFFLOAD_LEDGERS, updated.key, updated.encode())],
            [Expect(OFFLOAD_LEDGERS, current.key, stored.version)],
        )

    def _forget(self, record: OffloadRecord, written: list[str]) -> None:
        """Best effort, after a failed attempt: delete what it wrote (or may have: a
        creation that raised may have landed), then its record (what is left is
        ``cleanup``'s)."""
        with contextlib.suppress(Exception):
            for name in written:
                with contextlib.suppress(SegmentNotFound):
                    self.storage.delete(self.storage.open_write(name))
            self._ctx.ownership.commit([Delete(OFFLOAD_LEDGERS, record.key)], [])

    # -- listing and clean-up ---------------------------------------------------------------------

    def attempts(self, ledger_id: int | None = None) -> list[OffloadRecord]:
        """Every recorded attempt (of ``ledger_id``), by ledger id and uid bytes."""
        start = b"" if ledger_id is None else ledger_prefix(check_ledger_id(ledger_id))
        stop = None if ledger_id is None else prefix_stop(start)
        with self._store.snapshot() as view:
            return [
                OffloadRecord.decode(stored.value)
                for _, stored in scan_all(view, OFFLOAD_LEDGERS, start, stop)
            ]

    def cleanup(self) -> list[OffloadRecord]:
        """Delete the objects and records of attempts a crash or a failure left behind:
        STARTED by an earlier epoch, or by this one and no longer in progress (a failed
        attempt whose own clean-up failed too), or DELETING. Returns them. Attempts in
        progress on this instance are left alone, so two attempts never interfere."""
        if self._ctx.ownership.read_only:
            return []
        live = _in_progress(self.storage)
        left = [
            r
            for r in self.attempts()
            if r.state == OffloadState.DELETING
            or (
                r.state == OffloadState.STARTED
                and (r.epoch < self.storage.epoch or (r.epoch == self.storage.epoch and r.key not in live))
            )
        ]
        for record in left:
            self._delete(record)
        return left

    # -- read and delete --------------------------------------------------------------------------

    def read_offloaded(self, ledger_id: int, uid: uuid.UUID) -> OffloadedLedger:
        """A read handle of the COMPLETE attempt ``uid`` of ``ledger_id``. Raises
        ``OffloadNotFound``, ``InvalidOffloadObject`` (the index does not parse, or the
        objects are in a format version this reader does not know), ``InvalidArgument``."""
        record = self._complete(ledger_id, uid)
        name = index_name(ledger_id, uid)
        formats.check_format_version(record.format_version, name)
        handle = self.storage.open_read(name)
        data = self.storage.read(handle, 0, self.storage.info(name).length)
        index = formats.parse_index(data, name=name)
        if index.data_object_length != record.data_length or len(index.entries) != record.blocks:
            raise InvalidOffloadObject(
                f"offload object {name!r}: the index disagrees with the attempt's record"
                f" ({index.data_object_length} bytes in {len(index.entries)} blocks, recorded"
                f" {record.data_length} in {record.blocks})",
                object=name,
                offset=0,
            )
        return OffloadedLedger(
            self.storage,
            record,
            index,
            decode_ledger_metadata(index.ledger_metadata, name=name),
            read_ahead_bytes=self.read_ahead_bytes,
        )

    def delete_offloaded(self, ledger_id: int, uid: uuid.UUID) -> None:
        """Delete attempt ``uid`` of ``ledger_id``: DELETING, both objects, the record.
        Raises ``OffloadNotFound``, ``InvalidArgument``, ``Fenced``, ``ReadOnlyInstance``;
        a delete interrupted by an error is finished by ``cleanup``."""
        record = self._record(ledger_id, uid)
        if record.state == OffloadState.COMPLETE:
            deleting = record.replace(state=OffloadState.DELETING)
            self._replace(record, deleting)
            record = deleting
        self._delete(record)

    def _delete(self, record: OffloadRecord) -> None:
        for name in (data_name(record.ledger_id, record.id), index_name(record.ledger_id, record.id)):
            with contextlib.suppress(SegmentNotFound):
                self.storage.delete(self.storage.open_write(name))
        self._ctx.ownership.commit([Delete(OFFLOAD_LEDGERS, record.key)], [])

    def _record(self, ledger_id: int, uid: uuid.UUID) -> OffloadRecord:
        check_ledger_id(ledger_id)
        if not isinstance(uid, uuid.UUID):
            raise InvalidArgument(f"uid {uid!r} is not a uuid.UUID")
        with self._store.snapshot() as view:
            stored = view.get(OFFLOAD_LEDGERS, record_key(ledger_id, uid))
        if stored is None:
            raise OffloadNotFound(f"no offload {uid} of ledger {ledger_id}", ledger=ledger_id, uid=str(uid))
        return OffloadRecord.decode(stored.value)

    def _complete(self, ledger_id: int, uid: uuid.UUID) -> OffloadRecord:
        record = self._record(ledger_id, uid)
        if record.state != OffloadState.COMPLETE:
            raise OffloadNotFound(
                f"offload {uid} of ledger {ledger_id} is {OffloadState(record.state).name}, not complete",
                ledger=ledger_id,
                uid=str(uid),
            )
        return record


class _EntrySource:
    """The source's entries in order, read ``ENTRIES_PER_READ`` at a time."""

    def __init__(self, handle: LedgerReadHandle) -> None:
        self._handle = handle
        self._read: Sequence[Entry] = ()  # the last read of the source
        self._at = 0  # the next entry's index in it
        self.next_id = 0

    def peek(self) -> Entry:
        if self._at == len(self._read):
            last = min(self.next_id + ENTRIES_PER_READ - 1, self._handle.last_entry_id)
            read = self._handle.read(self.next_id, last)
            # The distinct types, gathered in C: as strict as isinstance on each entry (the
            # entry types are plain classes), without a Python step per entry.
            wrong = [kind for kind in set(map(type, read)) if not issubclass(kind, ENTRY_TYPES)]
            if len(read) != last - self.next_id + 1 or wrong:
                raise InvalidArgument(
                    f"ledger {self._handle.ledger_id}: read({self.next_id}, {last}) returned"
                    f" {len(read)} entries, not {last - self.next_id + 1} byte strings"
                )
            self._read, self._at = read, 0
        return self._read[self._at]

    def frame_fitting(self, out: _Appender, room: int) -> tuple[int, int]:
        """Frame into ``out`` the entries from the next one on that fit in ``room`` bytes
        framed, at most those of one read of the source (none if the next one does not
        fit); return (entries, bytes framed)."""
        self.peek()
        taken, framed = out.append_entries(self.next_id, self._read, self._at, room)
        self._at += taken
        self.next_id += taken
        return taken, framed


class _Appender:
    """Appends to an SLTS segment in writes of at least ``write_bytes`` (the last smaller)."""

    def __init__(self, storage: ChunkedSegmentStorage, segment: SegmentHandle, write_bytes: int) -> None:
        self._storage = storage
        self._segment = segment
        self._write_bytes = write_bytes
        self._pending: list[Entry] = []
        self._pending_bytes = 0
        self._written = 0

    @property
    def position(self) -> int:
        """Bytes appended so far (written or pending)."""
        return self._written + self._pending_bytes

    def append(self, data: bytes) -> None:
        self._pending.append(data)
        self._pending_bytes += len(data)
        if self._pending_bytes >= self._write_bytes:
            self.flush()

    def append_entries(
        self, first_entry_id: int, payloads: Sequence[Entry], start: int, room: int
    ) -> tuple[int, int]:
        """Append ``payloads[start:]`` framed, ids from ``first_entry_id``, while each fits in
        what is left of ``room`` (``framing.frame_entries``: the framing and each payload as
        separate pieces, the write joins them once), writing whenever ``write_bytes`` are
        pending; return (entries, bytes appended)."""
        assert self._pending_bytes < self._write_bytes, "a write is made as soon as it is due"
        taken = framed = 0
        while start + taken < len(payloads):
            count, size = framing.frame_entries(
                self._pending,
                first_entry_id + taken,
                payloads,
                start + taken,
                room - framed,
                self._write_bytes - self._pending_bytes,
            )
            taken += count
            framed += size
            self._pending_bytes += size
            if self._pending_bytes < self._write_bytes:
                break  # the next entry does not fit, or none is left
            self.flush()
        return taken, framed

    def flush(self) -> None:
        if self._pending_bytes:
            self._storage.write(self._segment, self._written, b"".join(self._pending))
            self._written += self._pending_bytes
            self._pending.clear()
            self._pending_bytes = 0
