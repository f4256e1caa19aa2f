"""The metadata log and metadata snapshots: the metadata store's copy on tier-2 (DESIGN.md §6).

Two system segments per container hold it:

* ``_system/metadata-log``: every committed metadata transaction, one framed record
  ``{"s": sequence, "o": [[table, key, value or None], ...]}`` each, in sequence order.
  The store captures each commit atomically with the commit itself (change capture,
  ``MetadataStore.changes``), whichever process made it, so a crash loses nothing
  and ``flush`` ships the captured changes in batches, then discards them locally.
  The log's last durable sequence is an attribute of its journal records
  (``last_sequence``), never read back from the data.
* ``_system/metadata-snapshots``: a consistent copy of the whole store: a header
  ``{"k": "metadata-snapshot", "sequence": S, "tables": [...]}``, pages
  ``{"t": table, "e": [[key, version, value], ...]}`` and a trailer
  ``{"k": "end", "entries": N}``. It is written to a new chunk, read back and checked,
  and only then does a ``truncate`` record move the segment's start to it with
  attributes ``sequence`` and ``end`` (a snapshot whose write failed half-way is never
  pointed at: the previous one stays). Then the log is truncated to its end: every
  record in it is covered by the snapshot.

The restorable state on tier-2 is therefore "snapshot at S, then log records S+1.. in
order", and ``durable_sequence`` is the newest sequence it includes.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import IO, Any

import msgpack
from slts.journal import framing
from slts.journal.system_names import METADATA_LOG, METADATA_SNAPSHOTS
from slts.journal.system_segments import SystemSegments, iter_range

from slts.compiled import twin
from slts.errors import MetadataCorrupted
from slts.metadata.store import Delete, MetadataStore, Operation, Put, Row, encode_operations
from slts.transforms.sealed import RecordSeal

SNAPSHOT_KIND = "metadata-snapshot"
END_KIND = "end"
#: Entries per snapshot page record.
PAGE_ENTRIES = 1000
#: A snapshot is spooled in memory up to this size, then on local disk.
SPOOL_MEMORY_BYTES = 64 << 20

LOG_LAST = "last_sequence"
SNAPSHOT_SEQUENCE = "sequence"
SNAPSHOT_END = "end"


class LogGap(MetadataCorrupted):
    """Changes between the log's durable sequence and the store's are no longer captured
    (capture was off, or another instance discarded them): only a snapshot can cover them."""


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """A metadata snapshot on tier-2: store sequence ``sequence``, bytes ``[start, end)``
    of the snapshot segment, ``entries`` records of all tables."""

    sequence: int
    start: int
    end: int
    entries: int


def encode_change(sequence: int, ops: Sequence[Operation], seal: RecordSeal | None = None) -> bytes:
    """The framed log record of one commit (sealed by ``seal``, if it seals): its
    operations encoded as a store's change log keeps them (``encode_operations``), in the
    record ``flush_batch`` ships."""
    return framing.frame(plain_change_payload(sequence, encode_operations(ops)), seal)


def plain_change_payload(sequence: int, operations: bytes) -> bytes:
    """The payload ``{"s": sequence, "o": operations}`` of a commit's log record, around
    its operations already encoded (``MetadataStore.encoded_changes``): byte for byte what
    ``encode_change`` encodes for the same commit (a map of two, "s" first)."""
    return b"\x82\xa1s" + msgpack.packb(sequence) + b"\xa1o" + operations


def decode_change(record: dict[str, Any]) -> tuple[int, list[Operation]]:
    """(sequence, operations) of a log record; ``MetadataCorrupted`` if malformed."""
    try:
        sequence = int(record["s"])
        ops: list[Operation] = [
            Put(str(table), bytes(key), bytes(value)) if value is not None else Delete(str(table), bytes(key))
            for table, key, value in record["o"]
        ]
    except (KeyError, TypeError, ValueError) as exc:
        raise MetadataCorrupted(f"malformed metadata log record: {exc!r}") from exc
    return sequence, ops


# -- the batch path of restore: runs of plain log records into a window ------------------------

#: The integers ``changes_python`` handles (the compiled twin works in signed 64 bits).
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class _Pairs(list[Any]):
    """A msgpack map as its (key, value) pairs: repeated keys stay visible."""


def changes_python(
    data: bytes | memoryview,
    offset: int,
    sequence: int,
    tables: dict[str, dict[bytes, Row]],
    ops_max: int,
) -> tuple[int, int, int, int, bool]:
    """The reference of the compiled ``changes`` (``_replay.c``): walk the log records of
    ``data`` from ``offset`` while each is a plain commit, and put the operations of those
    after ``sequence`` into the window ``tables`` (table -> key -> ``(key, sequence,
    value or None)``: the last operation on a key wins, with its commit's sequence);
    return ``(offset, sequence, records, ops, full)``: where the walk stopped, the last
    sequence taken, how many records and operations it took, and whether it stopped
    because the next record would take the window past ``ops_max``.

    A plain commit is a whole frame whose CRC holds, whose payload is not sealed and is
    exactly the map ``{"s": sequence, "o": [[table, key, value or nil], ...]}`` (each key
    once, the sequence within 64 bits, ``table`` a str naming a table of ``tables``, key
    and value bin). One at or below ``sequence`` (covered by the snapshot) is passed
    over; one after it must be ``sequence + 1``, and is left for the next window when it
    would take the window past ``ops_max`` operations (an empty window takes any). Anything
    else stops the walk: ``restore`` reads that frame one by one (``_one_record``), which
    raises for damage or a gap, or opens a sealed record."""
    if offset < 0 or type(sequence) is not int or not 0 <= sequence <= _INT64_MAX:
        return offset, sequence, 0, 0, False
    records = ops = 0
    full = False
    for stop, body in framing.plain_bodies(data, offset):
        change = _plain_change(body, tables)
        if change is None:
            break
        record_sequence, operations = change
        if record_sequence > sequence:
            if record_sequence != sequence + 1:
                break
            if ops and ops + len(operations) > ops_max:
                full = True
                break
            for table, key, value in operations:
                tables[table][key] = (key, record_sequence, value)
            sequence = record_sequence
            records += 1
            ops += len(operations)
        offset = stop
    return offset, sequence, records, ops, full


def plain_change_python(body: bytes, tables: dict[str, Any]) -> tuple[int, int] | None:
    """The reference of the compiled ``plain_change`` (``_replay.c``): ``(sequence,
    operations)`` if ``body`` is a plain commit's payload (see ``changes_python``) whose
    every operation names a table of ``tables``, else None."""
    change = _plain_change(body, tables)
    return None if change is None else (change[0], len(change[1]))


def _plain_change(body: bytes, tables: dict[str, Any]) -> tuple[int, list[tuple[str, bytes, Any]]] | None:
    """(sequence, operations) of a plain commit's payload (see ``changes_python``), or None."""
    try:
        pairs = msgpack.unpackb(body, raw=False, strict_map_key=False, object_pairs_hook=_Pairs)
    except (ValueError, msgpack.UnpackException):
        return None
    if type(pairs) is not _Pairs or len(pairs) != 2 or any(type(key) is not str for key, _ in pairs):
        return None
    if {key for key, _ in pairs} != {"s", "o"}:
        return None
    fields = dict(pairs)
    sequence, operations = fields["s"], fields["o"]
    if type(sequence) is not int or not _INT64_MIN <= sequence <= _INT64_MAX or type(operations) is not list:
        return None
    for operation in operations:
        if not (
            type(operation) is list
            and len(operation) == 3
            and type(operation[0]) is str
            and operation[0] in tables
            and type(operation[1]) is bytes
            and (operation[2] is None or type(operation[2]) is bytes)
        ):
            return None
    return sequence, operations


#: The compiled ``changes`` (``slts.journal._replay``), or None: ``changes_python`` walks.
NATIVE = twin("slts.journal._replay")
#: What checks each commit the log ships: the compiled ``plain_change`` where built.
check_plain_change: Callable[[bytes, dict[str, Any]], tuple[int, int] | None] = (
    NATIVE.plain_change if NATIVE is not None else plain_change_python
)


class MetadataLog:
    """Ships captured commits to the log segment. Not thread-safe: the caller serialises
    ``flush`` and ``write_snapshot`` (``DurableCopy`` holds one lock for both).

    ``discard_changes`` trims the store's change log once a batch or a snapshot is on
    tier-2 (default: the store's own); an owner passes its ownership's, which trims only
    while the instance owns the container and raises ``Fenced`` otherwise."""

    def __init__(
        self,
        store: MetadataStore,
        segments: SystemSegments,
        batch_bytes: int,
        discard_changes: Callable[[int], int] | None = None,
        seal: RecordSeal | None = None,
    ) -> None:
        self.store = store
        #: Seals the log's and the snapshots' records (an encrypted store's; ``journal.framing``).
        self.seal = seal
        self.segments = segments
        self.batch_bytes = batch_bytes
        self._discard_changes = discard_changes if discard_changes is not None else store.discard_changes
        log = segments.layout(METADATA_LOG)
        snapshots = segments.layout(METADATA_SNAPSHOTS)
        self.durable_sequence = max(log.attrs.get(LOG_LAST, 0), snapshots.attrs.get(SNAPSHOT_SEQUENCE, 0))
        #: The store's tables, in the shape ``check_plain_change`` takes (names; rows unused).
        self._tables: dict[str, dict[bytes, Row]] = {name: {} for name in store.tables}

    def pending(self) -> bool:
        """True if the store has commits the log does not hold yet."""
        return self.store.last_sequence > self.durable_sequence

    def flush_batch(self) -> int:
        """Ship one batch of captured changes; return how many commits it held (0: none
        pending). Raises ``LogGap`` if the next change is no longer captured,
        ``ChunkStorageError`` if tier-2 fails (nothing is discarded then), ``Fenced``
        from ``discard_changes`` (the batch is on tier-2; the change log is left as it is)."""
        durable = self.durable_sequence
        self.store.make_durable()  # ship only what survives a power loss here (shared syncs)
        newest = self.store.last_sequence  # read before the changes: no false gap from a later commit
        changes = self.store.encoded_changes(after=durable, limit=PAGE_ENTRIES)
        if newest > durable and (not changes or changes[0][0] != durable + 1):
            raise LogGap(
                f"metadata log holds up to {durable}, next captured change is "
                f"{changes[0][0] if changes else 'none'} (store at {newest})"
            )
        pieces: list[bytes] = []
        size, last = 0, durable
        for sequence, operations in changes:
            if sequence != last + 1 or (pieces and size >= self.batch_bytes):
                break
            piece = framing.frame(self._checked_payload(sequence, operations), self.seal)
            pieces.append(piece)
            size += len(piece)
            last = sequence
        if not pieces:
            return 0
        self.segments.append(METADATA_LOG, b"".join(pieces), {LOG_LAST: last})
        self.durable_sequence = last
        self._discard_changes(last)
        return len(pieces)

    def _checked_payload(self, sequence: int, operations: bytes) -> bytes:
        """The log record payload of captured change ``sequence``, checked to be a plain
        commit of this store's tables before it is shipped (restore must be able to take
        every record of the log): ``MetadataCorrupted`` if the store's change-log entry is
        not a msgpack array of ``[table, key, value or nil]`` operations."""
        payload = plain_change_payload(sequence, operations)
        checked = check_plain_change(payload, self._tables)
        if checked is None:
            raise MetadataCorrupted(
                f"captured change {sequence} is not a list of [table, key, value or nil] operations "
                f"of the tables {sorted(self._tables)}"
            )
        assert checked[0] == sequence, (checked, sequence)
        return payload

    def write_snapshot(self, piece_bytes: int) -> SnapshotInfo:
        """Write, read back and adopt a snapshot of the whole store, then truncate the log.

        Raises ``ChunkStorageError`` or ``MetadataCorrupted`` (the read-back failed); the
        previous snapshot then stays the one restore uses.
        """
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES) as spool:
            sequence, entries = _dump(self.store, spool, self.seal)
            spool.seek(0)
            start = None
            while piece := spool.read(piece_bytes):
                offset = self.segments.append(METADATA_SNAPSHOTS, piece, new_chunk=start is None)
                start = offset if start is None else start
        assert start is not None
        layout = self.segments.layout(METADATA_SNAPSHOTS)
        end = layout.length
        checked = check_snapshot(iter_range(self.segments.binding, layout, start, end), self.seal)
        if checked != (sequence, entries):
            raise MetadataCorrupted(f"metadata snapshot read back as {checked}, wrote {(sequence, entries)}")
        self.segments.truncate(METADATA_SNAPSHOTS, start, {SNAPSHOT_SEQUENCE: sequence, SNAPSHOT_END: end})
        log = self.segments.layout(METADATA_LOG)
        assert sequence >= self.durable_sequence, (sequence, self.durable_sequence)
        if log.length > log.start_offset:
            self.segments.truncate(METADATA_LOG, log.length)  # every log record is <= sequence
        self.durable_sequence = sequence
        self._discard_changes(sequence)
        return SnapshotInfo(sequence, start, end, entries)


def _dump(store: MetadataStore, out: IO[bytes], seal: RecordSeal | None) -> tuple[int, int]:
    """Write the framed snapshot of one consistent view to ``out``; (sequence, entries)."""
    entries = 0
    store.make_durable()  # the snapshot holds only commits that survive a power loss here
    with store.snapshot() as view:
        sequence = view.sequence
        out.write(
            framing.encode_record(
                {"k": SNAPSHOT_KIND, "sequence": sequence, "tables": list(store.tables)}, seal
            )
        )
        for table in store.tables:
            start = b""
            while True:
                page = view.scan(table, start, None, PAGE_ENTRIES)
                if page:
                    rows = [[key, stored.version, stored.value] for key, stored in page]
                    out.write(framing.encode_record({"t": table, "e": rows}, seal))
                    entries += len(page)
                if len(page) < PAGE_ENTRIES:
                    break
                start = page[-1][0] + b"\x00"
    out.write(framing.encode_record({"k": END_KIND, "entries": entries}, seal))
    return sequence, entries


def iter_snapshot(
    pieces: Iterable[bytes | memoryview], seal: RecordSeal | None = None, *, raw_rows: bool = False
) -> Iterator[tuple[int, str, list[Any]]]:
    """(sequence, table, rows) for each page of a snapshot stream, after one
    ``(sequence, "", [])`` for the header; the header and trailer are checked.
    Raises ``MetadataCorrupted`` for anything but one whole snapshot.

    Rows are ``(key, version, value)`` tuples of bytes, int and bytes; with ``raw_rows``
    they are the page's rows as decoded (lists), only checked to have a value that is not
    nil: for ``MetadataStore.replicate_rows``, which checks the rest (the restore then
    turns what it refuses into ``MetadataCorrupted``)."""
    records = framing.iter_records_strict(pieces, seal)
    header = next(records, None)
    if header is None or header.get("k") != SNAPSHOT_KIND or not isinstance(header.get("sequence"), int):
        raise MetadataCorrupted(f"metadata snapshot has no valid header: {header!r}"[:200])
    sequence, entries, ended = header["sequence"], 0, False
    yield sequence, "", []
    for record in records:
        if ended:
            raise MetadataCorrupted("metadata snapshot has records after its trailer")
        if record.get("k") == END_KIND:
            if record.get("entries") != entries:
                raise MetadataCorrupted(
                    f"metadata snapshot trailer says {record.get('entries')} entries, read {entries}"
                )
            ended = True
            continue
        try:
            if raw_rows:
                table, rows = record["t"], record["e"]
                if type(table) is not str or type(rows) is not list or None in map(_VALUE, rows):
                    raise TypeError(f"page of {table!r}: a row without a value")
            else:
                table = str(record["t"])
                rows = [(bytes(k), int(v), bytes(value)) for k, v, value in record["e"]]
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise MetadataCorrupted(f"malformed metadata snapshot page: {exc!r}"[:300]) from exc
        entries += len(rows)
        yield sequence, table, rows
    if not ended:
        raise MetadataCorrupted("metadata snapshot has no trailer (cut short)")


#: A row's value (the store checks the rest of each row: ``raw_rows``).
_VALUE = itemgetter(2)


def check_snapshot(pieces: Iterable[bytes | memoryview], seal: RecordSeal | None = None) -> tuple[int, int]:
    """(sequence, entries) of a whole, valid snapshot stream (``MetadataCorrupted`` if not)."""
    last_sequence, entries = 0, 0
    for sequence, _, rows in iter_snapshot(pieces, seal):
        last_sequence = sequence
        entries += len(rows)
    return last_sequence, entries
