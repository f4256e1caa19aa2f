"""The system journal's writer: one epoch's records, snapshots and checkpoints (DESIGN.md §6).

``SystemJournal.boot`` replays the journal (``replay``), refuses to run if an epoch as
new as its own already wrote there (``Fenced``), writes the **boot record** (a full
``snapshot`` record as the first record of a new journal file) and a checkpointed
journal snapshot, and removes what the new state no longer needs: older journal
objects beyond the last two checkpoints, and system-segment chunks of older epochs
that the state does not reference (a zombie's, or a crashed write's).

Writing (``write``): a record gets the next id ``(epoch, number)`` and goes to the
active journal file (append mode) or to an object of its own (no append support).
A failed write is retried once in a new file, as PDP-34 prescribes; if that fails too
the journal is *broken*: the caller gets the error, and the next change first
re-boots the journal from tier-2 (``ensure_ready``), because a failed write may still
have landed and only tier-2 knows. The in-memory layout changes only after a record is
durable.

Every ``snapshot_records`` records, or ``snapshot_interval_s`` seconds
(``maybe_snapshot``), the writer takes a journal snapshot: a new object holding the
full layout and the (epoch, file) it covers; a new journal file is started; the
snapshot counts once it reads back valid and a checkpoint pointing at it reads back
valid (up to three attempts, each with its own predictable name).

Not thread-safe on its own: callers hold ``lock`` (``SystemSegments`` does), which
serialises every change to the system segments as one group (Pravega #6184).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slts.bindings.base import ChunkHandle, ChunkStorage
from slts.journal import framing, system_names
from slts.journal.replay import CHECKPOINT, Replay, listing, read_single_record, replay, valid_snapshot
from slts.journal.system_layout import SNAPSHOT, InconsistentRecord, SystemLayout

from slts.chunk_names import leaf_epoch
from slts.errors import ChunkNotFound, ChunkStorageError, Fenced, StorageUnavailable
from slts.transforms.sealed import RecordSeal

_log = logging.getLogger("slts.journal")

CHECKPOINT_ATTEMPTS = 3
#: Checkpoints whose coverage is kept; older journal objects are deleted.
CHECKPOINTS_KEPT = 2


@dataclass(frozen=True, slots=True)
class JournalSettings:
    """Limits of the system journal (``StorageConfig`` fields ``journal_*``)."""

    snapshot_records: int = 100
    snapshot_interval_s: float = 300.0
    file_bytes_max: int = 4 << 20
    #: Seals the journal's records (an encrypted store's) and opens sealed ones at boot.
    seal: RecordSeal | None = None


@dataclass
class JournalStatistics:
    records: int = 0
    bytes: int = 0
    files: int = 0
    write_failures: int = 0
    reboots: int = 0
    snapshots: int = 0
    snapshot_failures: int = 0
    deleted_objects: int = 0


class SystemJournal:
    """The journal of one container instance (epoch); build it with ``boot``."""

    def __init__(
        self,
        binding: ChunkStorage,
        container_id: int,
        epoch: int,
        settings: JournalSettings,
        clock: Callable[[], float],
        fence_check: Callable[[], None],
    ) -> None:
        self.binding = binding
        self.container_id = container_id
        self.epoch = epoch
        self.settings = settings
        self.lock = threading.RLock()
        self.layout = SystemLayout()
        self.statistics = JournalStatistics()
        self.boot_replay: Replay | None = None
        self._clock = clock
        self._fence_check = fence_check
        self._append = binding.supports_append
        self._next_record = 1
        self._file_number = 0
        self._active: ChunkHandle | None = None
        self._active_bytes = 0
        self._snapshot_number = 0
        self._since_snapshot = 0
        self._snapshot_at = clock()
        self._broken = False
        self._kept: list[tuple[tuple[int, int], tuple[int, int]]] = []  # (checkpoint (e, n), covered (e, f))

    # -- boot -----------------------------------------------------------------------------------

    @classmethod
    def boot(
        cls,
        binding: ChunkStorage,
        container_id: int,
        epoch: int,
        settings: JournalSettings | None = None,
        *,
        clock: Callable[[], float] = time.time,
        fence_check: Callable[[], None] = lambda: None,
    ) -> SystemJournal:
        """Replay the journal and take it over for ``epoch``.

        Raises ``Fenced`` if an epoch >= ``epoch`` already wrote journal objects,
        ``MetadataCorrupted`` if the replayed layout breaks an invariant,
        ``ChunkStorageError`` if tier-2 fails.
        """
        journal = cls(binding, container_id, epoch, settings or JournalSettings(), clock, fence_check)
        with journal.lock:
            journal._boot(first=True)
        return journal

    def _boot(self, *, first: bool) -> None:
        found = replay(self.binding, self.container_id, seal=self.settings.seal)
        if found.max_epoch > self.epoch or (first and found.max_epoch == self.epoch):
            raise Fenced(
                f"container {self.container_id}: epoch {found.max_epoch} already wrote the system "
                f"journal; epoch {self.epoch} is not newer",
                container=self.container_id,
                epoch=self.epoch,
            )
        problems = found.layout.check()
        if problems:
            raise InconsistentRecord(f"replayed system layout is invalid: {problems[0]}")
        self.layout = found.layout
        self.boot_replay = found
        self._next_record = found.max_record.get(self.epoch, 0) + 1
        self._file_number = found.max_file.get(self.epoch, 0)
        self._snapshot_number = found.max_snapshot.get(self.epoch, 0)
        self._active, self._active_bytes = None, 0
        self._broken = False
        # The checkpoint booted from is the oldest one kept: once this epoch has its own,
        # everything older than the base's coverage is removed (restarts do not pile up).
        base = (
            system_names.parse_checkpoint(self.container_id, found.checkpoint) if found.checkpoint else None
        )
        self._kept = [((base.epoch, base.number), found.covered)] if base else []
        # The boot record: a full snapshot heads this epoch's journal (a new file).
        self.write({"k": SNAPSHOT, "layouts": self.layout.snapshot_record((0, 0))["layouts"]}, new_file=True)
        self._snapshot_quietly()
        self._remove_stale_chunks()

    def ensure_ready(self) -> None:
        """Re-boot from tier-2 if an earlier write failed (see module doc). Call with
        ``lock`` held before reading the layout to build a record."""
        if self._broken:
            self.statistics.reboots += 1
            self._boot(first=False)

    # -- records ----------------------------------------------------------------------------------

    def write(self, body: dict[str, Any], *, new_file: bool = False) -> None:
        """Make ``body`` (a record without ``id``) durable, then apply it to ``layout``;
        ``new_file`` starts a new journal file for it.

        Raises ``StorageUnavailable`` (the journal is then broken until ``ensure_ready``).
        """
        assert not self._broken, "call ensure_ready() before building a record"
        record = {**body, "id": [self.epoch, self._next_record]}
        self._put(framing.encode_record(record, self.settings.seal), new_file=new_file)
        self._next_record += 1
        try:
            applied = self.layout.apply(record)
        except InconsistentRecord as exc:  # the caller built a record that does not fit: a bug
            raise AssertionError(f"journal record does not fit the layout: {exc}") from exc
        assert applied, f"journal record {record['id']} is not newer than the last one applied"
        self._since_snapshot += 1
        if self._since_snapshot >= self.settings.snapshot_records:
            self._snapshot_quietly()

    def _put(self, data: bytes, *, new_file: bool = False) -> None:
        error: ChunkStorageError | None = None
        for _ in range(2):
            try:
                if (
                    self._active is not None
                    and not new_file
                    and (self._active_bytes + len(data) <= self.settings.file_bytes_max)
                ):
                    self.binding.write(self._active, self._active_bytes, data)
                    self._active_bytes += len(data)
                else:
                    self._file_number += 1
                    self.statistics.files += 1
                    handle = self.binding.create(
                        system_names.journal_file(self.container_id, self.epoch, self._file_number), data
                    )
                    self._active, self._active_bytes = (handle, len(data)) if self._append else (None, 0)
                self.statistics.records += 1
                self.statistics.bytes += len(data)
                return
            except ChunkStorageError as exc:
                self.statistics.write_failures += 1
                self._active, error, new_file = None, exc, True  # a new journal after each failure
        self._broken = True
        raise StorageUnavailable(f"system journal write failed twice: {error}") from error

    # -- snapshots --------------------------------------------------------------------------------

    def maybe_snapshot(self) -> None:
        """Take a journal snapshot if ``snapshot_interval_s`` passed since the last one
        and records were written since. Failures are logged, never raised."""
        with self.lock:
            due = self._clock() - self._snapshot_at >= self.settings.snapshot_interval_s
            if due and self._since_snapshot and not self._broken:
                self._snapshot_quietly()

    def _snapshot_quietly(self) -> None:
        try:
            self.take_snapshot()
        except (ChunkStorageError, Fenced) as exc:
            self.statistics.snapshot_failures += 1
            _log.warning("journal snapshot failed (the previous one stays in use): %s", exc)

    def take_snapshot(self) -> str | None:
        """Write, read back and checkpoint a journal snapshot; return its name, or None if
        it could not be validated (the previous snapshot stays the base)."""
        self._snapshot_number += 1
        number = self._snapshot_number
        name = system_names.journal_snapshot(self.container_id, self.epoch, number)
        last = self._next_record - 1
        body = self.layout.snapshot_record((self.epoch, last))
        covered = (self.epoch, self._file_number)
        body["journal"] = list(covered)
        self._active, self._active_bytes = None, 0  # later records go to newer files
        self._since_snapshot, self._snapshot_at = 0, self._clock()
        self.binding.create(name, framing.encode_record(body, self.settings.seal))
        if read_single_record(self.binding, name, self.settings.seal) != body or not valid_snapshot(
            body, self.epoch
        ):
            self.statistics.snapshot_failures += 1
            return None
        pointer = {"k": CHECKPOINT, "snapshot": name, "epoch": self.epoch, "number": number}
        for attempt in range(1, CHECKPOINT_ATTEMPTS + 1):
            checkpoint = system_names.checkpoint(self.container_id, self.epoch, number, attempt)
            with contextlib.suppress(ChunkStorageError):
                self.binding.create(checkpoint, framing.encode_record(pointer, self.settings.seal))
                if read_single_record(self.binding, checkpoint, self.settings.seal) == pointer:
                    break
        else:
            self.statistics.snapshot_failures += 1
            return None
        self.statistics.snapshots += 1
        self._kept.append(((self.epoch, number), covered))
        if len(self._kept) > CHECKPOINTS_KEPT:
            del self._kept[0]
        self._remove_old_objects()
        return name

    # -- clean-up ---------------------------------------------------------------------------------

    def _delete(self, name: str) -> None:
        with contextlib.suppress(ChunkNotFound):
            self.binding.delete(ChunkHandle(name, readonly=False))
        self.statistics.deleted_objects += 1

    def _remove_old_objects(self) -> None:
        """Journal objects older than the oldest kept checkpoint's coverage."""
        if len(self._kept) < CHECKPOINTS_KEPT:
            return
        oldest_checkpoint, oldest_covered = self._kept[0]
        files, snapshots, checkpoints = listing(self.binding, self.container_id)
        stale = [n.name for n in files if (n.epoch, n.number) <= oldest_covered]
        stale += [n.name for n in (*snapshots, *checkpoints) if (n.epoch, n.number) < oldest_checkpoint]
        if stale:
            self._fence_check()  # a fenced instance deletes nothing
            for name in stale:
                self._delete(name)

    def _remove_stale_chunks(self) -> None:
        """System-segment chunks that the booted layout does not reference: of older epochs
        (a zombie's after a newer boot, a write that failed before its record) and, at a
        re-boot after a failed write, this epoch's own (the layout just replayed from
        tier-2 is the truth, and every change runs under the lock: none is in flight)."""
        stale = stale_system_chunks(self.binding, self.container_id, self.layout, self.epoch + 1)
        if stale:
            self._fence_check()
            for name in stale:
                self._delete(name)


def stale_system_chunks(
    binding: ChunkStorage, container_id: int, layout: SystemLayout, epoch: int
) -> list[str]:
    """System-segment chunks on tier-2 made by an epoch older than ``epoch`` that
    ``layout`` does not reference."""
    referenced = {chunk.name for segment in layout.segments.values() for chunk in segment.chunks}
    stale = []
    for segment in system_names.SYSTEM_SEGMENTS:
        for name in binding.list(system_names.segment_chunks_prefix(container_id, segment)):
            made_by = leaf_epoch(name)
            if name not in referenced and made_by is not None and made_by < epoch:
                stale.append(name)
    return stale
