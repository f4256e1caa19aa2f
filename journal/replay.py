"""Reading the system journal back: the boot replay of DESIGN.md §6, without side effects.

``replay(binding, container_id)`` rebuilds the layout of the system segments from
tier-2 alone. It is what a booting owner, a restore and ``slts journal show`` share:

1. **Latest valid snapshot**: checkpoints in descending (epoch, number, attempt) order;
   the first one that decodes and names a journal snapshot that decodes and validates
   is the base (a snapshot whose write failed half-way has no checkpoint, or fails
   validation, and the previous one is used). No valid checkpoint: an empty base.
2. **Journal files after it**, in (epoch, file number) order, records in file order.
   Ignored, and counted: torn or CRC-bad records (``framing``), duplicates (an id not
   newer than the last applied of its epoch: a retried write that had landed), records
   that do not fit the layout, files that vanished between listing and reading, gaps
   in file numbering (a failed create).
   Within a file, runs of plain appends are applied in one call each
   (``SystemLayout.apply_appends``, compiled where built), every other frame one by one;
   with ``on_record``, or without the compiled walk, every record one by one.
3. **Zombies** need no special case: every epoch's journal starts with a full
   ``snapshot`` record (the boot record), and epochs replay in order, so whatever an
   older epoch appended after a newer one booted is replaced by the newer one's boot
   record (Pravega #6200).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from slts.bindings.base import ChunkHandle, ChunkStorage
from slts.journal import framing, system_layout, system_names
from slts.journal.system_layout import SNAPSHOT, InconsistentRecord, SystemLayout, record_id

from slts.errors import ChunkCorrupted, ChunkNotFound
from slts.transforms.sealed import RecordSeal

CHECKPOINT = "checkpoint"


@dataclass
class Replay:
    """The rebuilt layout and what replay met on the way (for boot, restore, operators)."""

    layout: SystemLayout = field(default_factory=SystemLayout)
    checkpoint: str | None = None  # the checkpoint the base came from
    snapshot: str | None = None  # the journal snapshot it named
    covered: tuple[int, int] = (0, 0)  # (epoch, file) the base snapshot covers
    invalid_checkpoints: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # journal files replayed, in order
    records: int = 0  # records applied
    bytes_read: int = 0
    duplicates: int = 0
    inconsistent: int = 0
    corrupt: int = 0
    torn: int = 0
    vanished: int = 0
    # Highest numbers seen per kind, so a (re)booting writer never reuses a name.
    max_epoch: int = 0
    max_file: dict[int, int] = field(default_factory=dict)
    max_snapshot: dict[int, int] = field(default_factory=dict)
    max_record: dict[int, int] = field(default_factory=dict)
    all_files: list[system_names.Numbered] = field(default_factory=list)
    all_snapshots: list[system_names.Numbered] = field(default_factory=list)
    all_checkpoints: list[system_names.Numbered] = field(default_factory=list)


def read_object(binding: ChunkStorage, name: str) -> bytes:
    """All bytes of object ``name`` (``ChunkNotFound`` if missing, also if it vanishes
    between the length and the read). Two calls: the length, then a read of exactly that
    many bytes (a limiter pays what is asked for); the handle is made here, because
    ``open_read`` would only check again that the object exists (a HEAD on S3)."""
    length = binding.get_info(name).length
    return binding.read(ChunkHandle(name, readonly=True), 0, length) if length else b""


def read_view(binding: ChunkStorage, name: str) -> memoryview:
    """``read_object``'s bytes as a read-only view: no copy where the binding maps its
    objects (``ChunkStorage.read_view``), a view of a copy elsewhere.

    Replay reads a journal file this way only when a newer file of its epoch exists: no
    instance appends to it any more, so its length is final. The newest file of an epoch
    is read by copy: its writer (or a zombie) may be appending, its length may count
    bytes of an append that then fails and is cut back, and a mapped page cut off a file
    ends the process (SIGBUS) where a copy just holds a torn record."""
    length = binding.get_info(name).length
    return binding.read_view(ChunkHandle(name, readonly=True), 0, length) if length else memoryview(b"")


def read_single_record(
    binding: ChunkStorage, name: str, seal: RecordSeal | None = None
) -> dict[str, Any] | None:
    """The one valid record object ``name`` holds, or None (missing, torn, corrupt, extra
    bytes); sealed records opened with ``seal`` (``journal.framing``)."""
    try:
        data = read_object(binding, name)
    except ChunkNotFound:
        return None
    result = framing.read_records(data, seal)
    if len(result.records) != 1 or result.corrupt or result.torn_at is not None or result.end != len(data):
        return None
    return result.records[0][1]


def listing(binding: ChunkStorage, container_id: int) -> tuple[list[system_names.Numbered], ...]:
    """(journal files, journal snapshots, checkpoints) of the container, each sorted."""
    files = [
        n
        for name in binding.list(system_names.journal_prefix(container_id))
        if (n := system_names.parse_journal_file(container_id, name))
    ]
    snapshots = [
        n
        for name in binding.list(system_names.snapshots_prefix(container_id))
        if (n := system_names.parse_journal_snapshot(container_id, name))
    ]
    checkpoints = [
        n
        for name in binding.list(system_names.checkpoints_prefix(container_id))
        if (n := system_names.parse_checkpoint(container_id, name))
    ]
    return sorted(files), sorted(snapshots), sorted(checkpoints)


def valid_snapshot(record: Mapping[str, Any] | None, epoch: int) -> bool:
    """True if ``record`` is a journal snapshot of ``epoch`` whose layout validates."""
    return snapshot_layout(record, epoch) is not None


def snapshot_layout(record: Mapping[str, Any] | None, epoch: int) -> SystemLayout | None:
    """The layout of ``record`` if it is a journal snapshot of ``epoch`` that validates
    and names the (epoch, file) it covers; None otherwise."""
    if record is None or record.get("k") != SNAPSHOT:
        return None
    covered = record.get("journal")
    if not (isinstance(covered, list) and len(covered) == 2 and all(type(v) is int for v in covered)):
        return None
    if covered[0] != epoch:
        return None
    layout = SystemLayout()
    try:
        if record_id(record)[0] != epoch:
            return None
        layout.apply(record)
    except InconsistentRecord:
        return None
    return layout


def check_keys(binding: ChunkStorage, container_id: int, seal: RecordSeal | None) -> None:
    """``KeyUnavailable`` (naming the key) if the newest journal file holds sealed records
    ``seal`` cannot open: an owner checks this before its epoch commit, so that opening an
    encrypted store without its key ring fences nobody and changes nothing."""
    files, _, _ = listing(binding, container_id)
    if files:
        with contextlib.suppress(ChunkNotFound):
            framing.read_records(read_object(binding, files[-1].name), seal)


def replay(
    binding: ChunkStorage,
    container_id: int,
    on_record: Callable[[str, dict[str, Any]], None] | None = None,
    seal: RecordSeal | None = None,
) -> Replay:
    """Rebuild the system segments' layout from tier-2 (see module doc).

    ``on_record(file, record)`` is called for every applied record (inspection); ``seal``
    opens sealed records (an encrypted store's: ``KeyUnavailable`` without it). Raises
    ``ChunkStorageError`` only when listing fails or an object cannot be read for a
    reason other than having vanished.
    """
    result = Replay()
    files, snapshots, checkpoints = listing(binding, container_id)
    result.all_files, result.all_snapshots, result.all_checkpoints = files, snapshots, checkpoints
    for numbered in (*files, *snapshots, *checkpoints):
        result.max_epoch = max(result.max_epoch, numbered.epoch)
    for numbered in files:
        result.max_file[numbered.epoch] = max(result.max_file.get(numbered.epoch, 0), numbered.number)
    for numbered in (*snapshots, *checkpoints):
        result.max_snapshot[numbered.epoch] = max(result.max_snapshot.get(numbered.epoch, 0), numbered.number)
    _load_base(binding, checkpoints, result, seal)
    for numbered in files:
        if (numbered.epoch, numbered.number) <= result.covered:
            continue
        try:
            if numbered.number < result.max_file[numbered.epoch]:
                data: bytes | memoryview = read_view(binding, numbered.name)
            else:  # its epoch's newest file: an instance of that epoch may still append to it
                data = read_object(binding, numbered.name)
        except ChunkNotFound:
            result.vanished += 1
            continue
        result.bytes_read += len(data)
        result.files.append(numbered.name)
        if on_record is None and system_layout.NATIVE is not None:
            _apply_file_in_runs(result, numbered, data, seal)
            continue
        framed = framing.read_records(data, seal)
        result.corrupt += framed.corrupt
        result.torn += framed.torn_at is not None or framed.unframeable_at is not None
        _apply_all(result, numbered.name, framed.records, on_record)
    # Every applied record (and the base snapshot) raised its epoch's last id in the layout.
    result.max_record = dict(result.layout.last_ids)
    return result


def _apply_file_in_runs(
    result: Replay, numbered: system_names.Numbered, data: bytes | memoryview, seal: RecordSeal | None
) -> None:
    """Apply one journal file's records as ``read_records`` + ``_apply_all`` would, with
    the runs of plain appends (most of a journal) taken by ``SystemLayout.apply_appends``
    and every other frame read and applied one by one. A run continues the segment and
    epoch of the record applied before it (a file's records are its epoch's)."""
    layout = result.layout
    offset, size = 0, len(data)
    segment: str | None = None
    epoch = numbered.epoch
    torn = False
    while offset < size:
        if segment is not None:
            offset, taken = layout.apply_appends(data, offset, epoch, segment)
            result.records += taken
            if offset >= size:
                break
        framed = framing.read_records(data, seal, start=offset, frames_max=1)
        result.corrupt += framed.corrupt
        if framed.torn_at is not None or framed.unframeable_at is not None:
            torn = True
            break
        if framed.records:
            record = framed.records[0][1]
            applied = result.records
            _apply_all(result, numbered.name, framed.records, None)
            if result.records > applied:
                seg = record.get("seg")
                segment = seg if type(seg) is str else None
                epoch = record_id(record)[0]
        offset = framed.end
    result.torn += torn


def _apply_all(
    result: Replay,
    file: str,
    records: list[tuple[int, dict[str, Any]]],
    on_record: Callable[[str, dict[str, Any]], None] | None,
) -> None:
    """Apply one file's records in order, counting duplicates and records that do not fit
    (which change nothing). The per-record loop of a boot: keep it lean."""
    apply = result.layout.apply
    applied = duplicates = inconsistent = 0
    for _, record in records:
        try:
            if not apply(record):
                duplicates += 1
                continue
        except InconsistentRecord:
            inconsistent += 1
            continue
        applied += 1
        if on_record is not None:
            on_record(file, record)
    result.records += applied
    result.duplicates += duplicates
    result.inconsistent += inconsistent


def _load_base(
    binding: ChunkStorage, checkpoints: list[system_names.Numbered], result: Replay, seal: RecordSeal | None
) -> None:
    """The newest valid checkpoint and its snapshot become the replay's base. A checkpoint
    is passed over only for what it holds (missing, torn, corrupt, pointing nowhere valid):
    an error reading it (``StorageUnavailable``...) fails the replay, since falling back
    to an older base, or none, would make a booting owner believe in a layout that lacks
    the newer records, delete the chunks they hold, and journal that loss."""
    for numbered in reversed(checkpoints):
        try:
            pointer = read_single_record(binding, numbered.name, seal)
            snapshot_name = pointer.get("snapshot") if pointer and pointer.get("k") == CHECKPOINT else None
            record = (
                read_single_record(binding, snapshot_name, seal) if isinstance(snapshot_name, str) else None
            )
        except ChunkCorrupted:
            record = None
        layout = snapshot_layout(record, numbered.epoch)
        if layout is None:
            result.invalid_checkpoints.append(numbered.name)
            continue
        assert record is not None
        result.layout = layout
        result.covered = (record["journal"][0], record["journal"][1])
        result.checkpoint, result.snapshot = numbered.name, snapshot_name
        return
