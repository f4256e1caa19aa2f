"""The orphan reconciler: chunks on the chunk storage that nothing accounts for (DESIGN.md §7).

GC is leak-free by construction (an intent is queued before a chunk is created), and
this is the check that it stays so, and the repair if it did not (a crash between a
claim and a delete, a bug, a chunk written by hand). A chunk listed under the
container's prefix is an **orphan** when it has no chunk record (no live or deleted
segment references it), no GC queue entry names it, and it was created by an *older*
epoch than this instance's: an older instance is fenced and can never commit a
reference to it, while a chunk of this epoch may belong to a write in flight. Names
SLTS did not make are reported as foreign and never touched. System objects (under
``<container>/_system/``: the journal and the system segments' chunks) are not the
metadata's to judge; the journal removes its own stale objects at boot.

``reconcile`` queues each orphan for GC (reason ``orphan``, conditional on the chunk
still having no record), so the usual delay and verdict apply; ``dry_run`` only
reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slts.journal.system_names import system_prefix
from slts.metadata.records import GcEntry, GcReason
from slts.metadata.schema import CHUNKS, GC, name_key
from slts.metadata.store import Expect
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.segment_names import chunk_epoch, chunk_prefix


@dataclass
class OrphanReport:
    """What ``reconcile`` found. ``orphans`` is the leak count a metric exports."""

    listed: int = 0
    system: int = 0  # system objects seen and left to the journal
    orphans: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    queued: int = 0


def reconcile(storage: ChunkedSegmentStorage, *, dry_run: bool = False, limit: int = 100_000) -> OrphanReport:
    """List the container's chunks and queue (or with ``dry_run`` only report) orphans.

    At most ``limit`` orphans are handled per call. Raises ``ReadOnlyInstance`` unless
    ``dry_run``, ``Fenced`` if a newer epoch owns the container.
    """
    store = storage.context.store
    queued = {name for _, stored in store.iterate(GC) for name in GcEntry.decode(stored.value).chunks}
    report = OrphanReport()
    system = system_prefix(storage.container_id)
    for name in storage.chunk_storage.list(chunk_prefix(storage.container_id)):
        report.listed += 1
        if name.startswith(system):
            report.system += 1
            continue
        epoch = chunk_epoch(name)
        if epoch is None:
            report.foreign.append(name)
            continue
        if epoch >= storage.epoch or name in queued or store.get(CHUNKS, name_key(name)) is not None:
            continue
        report.orphans.append(name)
        if len(report.orphans) >= limit:
            break
    if not dry_run:
        for name in report.orphans:
            entry = storage.gc.entry(name, GcReason.ORPHAN)
            storage.context.ownership.commit([entry], [Expect(CHUNKS, name_key(name), 0)])
            report.queued += 1
    return report
