"""``DurableCopy``: one owner's durable copy of its metadata on tier-2 (DESIGN.md §6).

It ties the pieces together for a running container instance:

* at start: boot the system journal (``SystemJournal.boot``), then catch the metadata
  log up with the store; if it cannot (the changes in between are no longer captured,
  e.g. the store predates its copy or was restored) a metadata snapshot covers them;
* in the background, every ``metadata_log_flush_interval_s`` (the recovery point
  objective for the loss of the machine): ship the commits made until then; take a
  metadata snapshot when the log outgrew ``metadata_snapshot_log_bytes`` or
  ``metadata_snapshot_interval_s`` passed; let the journal take its time-based snapshot;
* ``barrier(sequence)``: return only once the tier-2 copy includes ``sequence``
  (flushing if needed). GC calls it before deleting a chunk, so tier-2 alone always
  holds a restorable state that needs no deleted chunk (DESIGN.md §5 invariant 5).

Flushes and snapshots are serialised by one lock; commits never wait for either (the
store captures them). A fenced instance's copy stops at the next flush (``Fenced``): the
flush checks the owner first, and the change log is trimmed only through
``discard_changes``, which an owner passes fenced (the container epoch is checked in
the trimming transaction itself), so an instance fenced mid-flush trims nothing. What a
fenced instance still appends to the journal is overwritten at replay by the newer
epoch's boot record (``slts.journal.journal``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from slts.bindings.base import ChunkStorage
from slts.journal.journal import JournalSettings, SystemJournal
from slts.journal.metadata_copy import LogGap, MetadataLog, SnapshotInfo
from slts.journal.system_names import METADATA_LOG
from slts.journal.system_segments import SystemSegments

from slts.config import StorageConfig
from slts.errors import Fenced, SltsError, StorageUnavailable
from slts.metadata.store import MetadataStore
from slts.transforms.sealed import RecordSeal

_log = logging.getLogger("slts.journal")


@dataclass(frozen=True, slots=True)
class DurableCopyStatistics:
    """Where the copy stands, and what it did since start."""

    durable_sequence: int
    store_sequence: int
    log_bytes: int
    flushes: int
    snapshots: int
    journal_records: int
    journal_snapshots: int
    journal_reboots: int


def journal_settings(config: StorageConfig, seal: RecordSeal | None = None) -> JournalSettings:
    return JournalSettings(
        config.journal_snapshot_records,
        config.journal_snapshot_interval_s,
        config.journal_file_bytes_max,
        seal,
    )


class DurableCopy:
    """The tier-2 copy of ``store`` for container ``container_id`` at ``epoch``."""

    def __init__(
        self,
        store: MetadataStore,
        binding: ChunkStorage,
        container_id: int,
        epoch: int,
        config: StorageConfig,
        *,
        clock: Callable[[], float] = time.time,
        fence_check: Callable[[], None] = lambda: None,
        discard_changes: Callable[[int], int] | None = None,
        seal: RecordSeal | None = None,
    ) -> None:
        """Boot the journal and catch up. ``discard_changes`` trims the store's change log
        (default: the store's own; an owner passes its ``Ownership.discard_changes``);
        ``seal`` seals every record of the copy (an encrypted store's) and opens them.
        Raises ``Fenced`` (a newer epoch wrote the journal or owns the store),
        ``ChunkStorageError`` (tier-2 failed), ``MetadataCorrupted``."""
        self.config = config
        self._clock = clock
        self._fence_check = fence_check
        self.journal = SystemJournal.boot(
            binding, container_id, epoch, journal_settings(config, seal), clock=clock, fence_check=fence_check
        )
        self.segments = SystemSegments(self.journal, config.system_rolling_length_bytes, fence_check)
        self.log = MetadataLog(store, self.segments, config.metadata_log_batch_bytes, discard_changes, seal)
        self._lock = threading.Lock()
        self._flushes = self._snapshots = 0
        self._snapshot_at = clock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.flush()

    # -- the copy -------------------------------------------------------------------------------

    @property
    def durable_sequence(self) -> int:
        """The newest store sequence a restore from tier-2 includes."""
        return self.log.durable_sequence

    def flush(self, through: int | None = None) -> int:
        """Ship captured commits (all of them, or until ``through`` is durable); return the
        durable sequence. A gap in the captured changes is covered by a snapshot. Raises
        ``ChunkStorageError``, ``Fenced``."""
        with self._lock:
            self._fence_check()
            while through is None or self.log.durable_sequence < through:
                try:
                    shipped = self.log.flush_batch()
                except LogGap as gap:
                    _log.info("metadata log cannot catch up (%s): taking a metadata snapshot", gap)
                    self._snapshot_locked()
                    continue
                if not shipped:
                    break
                self._flushes += 1
            return self.log.durable_sequence

    def barrier(self, sequence: int) -> None:
        """Return once the tier-2 copy includes store sequence ``sequence``.
        Raises ``StorageUnavailable`` if it cannot (tier-2 failing), ``Fenced``."""
        if self.log.durable_sequence >= sequence:
            return
        durable = self.flush(through=sequence)  # not "everything": a busy writer never stops
        if durable < sequence:
            raise StorageUnavailable(f"metadata copy on tier-2 reaches {durable}, not {sequence}")

    def snapshot(self) -> SnapshotInfo:
        """Take a metadata snapshot now (``slts snapshot``); the log is truncated after it."""
        with self._lock:
            self._fence_check()
            return self._snapshot_locked()

    def _snapshot_locked(self) -> SnapshotInfo:
        info = self.log.write_snapshot(self.config.system_rolling_length_bytes)
        self._snapshots += 1
        self._snapshot_at = self._clock()
        _log.info(
            "metadata snapshot %d on tier-2: %d records, %d bytes",
            info.sequence,
            info.entries,
            info.end - info.start,
            extra={"snapshot_sequence": info.sequence, "snapshot_records": info.entries},
        )
        return info

    def maintain(self) -> None:
        """One background step: ship the commits made before it started, then take the
        snapshots that are due (see module doc). Commits landing meanwhile wait for the next
        step: under a busy writer, shipping "everything" would never end and would cost
        tier-2 a log append and a journal record every few commits instead of one per
        interval (the recovery point objective is the interval either way)."""
        self.flush(through=self.log.store.last_sequence)
        log = self.segments.layout(METADATA_LOG)
        outgrown = log.length - log.start_offset >= self.config.metadata_snapshot_log_bytes
        aged = self._clock() - self._snapshot_at >= self.config.metadata_snapshot_interval_s
        if outgrown or (aged and log.length > log.start_offset):
            self.snapshot()
        self.journal.maybe_snapshot()

    def statistics(self) -> DurableCopyStatistics:
        log = self.segments.layout(METADATA_LOG)
        journal = self.journal.statistics
        return DurableCopyStatistics(
            self.log.durable_sequence,
            self.log.store.last_sequence,
            log.length - log.start_offset,
            self._flushes,
            self._snapshots,
            journal.records,
            journal.snapshots,
            journal.reboots,
        )

    # -- background -----------------------------------------------------------------------------

    def start(self, interval_s: float) -> None:
        """Run ``maintain`` every ``interval_s`` seconds in a daemon thread. Idempotent."""
        assert interval_s > 0
        if self._thread is None:
            self._stopping.clear()
            self._thread = threading.Thread(
                target=self._loop, args=(interval_s,), name="slts-journal", daemon=True
            )
            self._thread.start()

    def _loop(self, interval_s: float) -> None:
        while not self._stopping.wait(interval_s):
            try:
                self.maintain()
            except Fenced:
                _log.warning("metadata copy stops: the container was fenced")
                return
            except (SltsError, OSError):
                _log.exception("metadata copy step failed; retrying in %s s", interval_s)

    def close(self, *, flush: bool = True) -> None:
        """Stop the background thread; with ``flush``, ship what is pending (a failure is
        logged: the changes stay captured in the store for the next owner). Idempotent."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if flush:
            try:
                self.flush()
            except Fenced:
                pass
            except (SltsError, OSError):
                _log.exception("final metadata log flush failed; the next start ships it")
