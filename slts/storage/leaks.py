"""The leak check: metadata that nothing can reach any more (DESIGN.md §7, §11).

GC is leak-free by construction; this module checks that it stays so on a real store,
for ``slts verify``, the simulator, the model tests and the leak gauge of
``ChunkedSegmentStorage.statistics()``. In one consistent read of the store it finds:

* **unreachable index entries**: keys of namespaces that no live segment and no
  tombstone reaches, directly or through concat links, and chunk entries naming a
  chunk that has no record (nothing can read through them; they only grow the index);
* **unreferenced chunk records**: records of chunks on no live segment's list and no
  tombstone's list (their chunk can never be read, and GC never deletes it);
* **overdue GC entries**: queue entries due more than ``gc_delay_s`` ago (queued over
  twice the delay ago) that GC has not finished: a stuck collector, or an entry it can
  never settle. Zero right after a GC pass past the delay.

Cost: one pass over the ``segments``, ``deleted``, ``chunks``, ``index`` and ``gc`` tables
(it walks every chunk list): an operator's check, not a hot-path one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from slts.metadata import index
from slts.metadata.records import ChunkRecord, GcEntry, SegmentRecord
from slts.metadata.schema import CHUNKS, DELETED, GC, INDEX, SEGMENTS, name_key
from slts.metadata.store import SCAN_LIMIT_DEFAULT, MetadataStore, ReadView, Versioned

#: How many examples of each kind a report keeps.
EXAMPLES_MAX = 5


@dataclass(frozen=True, slots=True)
class LeakReport:
    """What ``find_leaks`` found: counts, and up to ``EXAMPLES_MAX`` examples of each."""

    index_entries: int = 0
    chunk_records: int = 0
    gc_entries: int = 0
    index_examples: tuple[str, ...] = ()
    chunk_examples: tuple[str, ...] = ()
    gc_examples: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        """Leaked items of every kind."""
        return self.index_entries + self.chunk_records + self.gc_entries

    def problems(self, *, gc: bool = True) -> list[str]:
        """One line per kind with leaks, for ``verify``'s report (empty: no leak).
        ``gc=False`` leaves overdue GC entries out: they say that GC is not running or is
        stuck, not that the layout lost track of anything."""
        kinds = [
            (self.index_entries, "index entries no live segment or tombstone reaches", self.index_examples),
            (self.chunk_records, "chunk records on no segment's chunk list", self.chunk_examples),
        ]
        if gc:
            kinds.append(
                (self.gc_entries, "GC queue entries overdue (due over gc_delay_s ago)", self.gc_examples)
            )
        return [
            f"leak: {count} {what}, e.g. {', '.join(examples)}" for count, what, examples in kinds if count
        ]


def _entries(view: ReadView, table: str) -> Iterator[tuple[bytes, Versioned]]:
    start = b""
    while True:
        page = view.scan(table, start, None, SCAN_LIMIT_DEFAULT)
        yield from page
        if len(page) < SCAN_LIMIT_DEFAULT:
            return
        start = page[-1][0] + b"\x00"


def _listed_chunks(view: ReadView, record: SegmentRecord) -> Iterator[str]:
    """The names on ``record``'s chunk list (stops at a missing record: verify reports that)."""
    name = record.first_chunk
    for _ in range(record.chunk_count + 1):
        if name is None:
            return
        stored = view.get(CHUNKS, name_key(name))
        if stored is None:
            return
        yield name
        name = ChunkRecord.decode(stored.value).next_chunk


def find_leaks(store: MetadataStore, *, now_ms: int, gc_delay_s: float) -> LeakReport:
    """Metadata of the container in ``store`` that nothing reaches (see module doc), as of
    one consistent read. ``now_ms``/``gc_delay_s`` date the GC queue. Raises
    ``MetadataCorrupted`` on an undecodable record."""
    with store.snapshot() as view:
        roots: list[SegmentRecord] = [SegmentRecord.decode(s.value) for _, s in _entries(view, SEGMENTS)]
        roots += [SegmentRecord.decode(s.value) for _, s in _entries(view, DELETED)]
        listed = {name for record in roots for name in _listed_chunks(view, record)}
        namespaces: dict[int, list[tuple[int, str | None, tuple[int, int] | None]]] = {}
        for key, stored in _entries(view, INDEX):
            namespace, offset = index.split_key(key)
            name, link = index.parse_value(stored.value)
            namespaces.setdefault(namespace, []).append((offset, name, link))
        chunk_names = [key.decode("utf-8") for key, _ in _entries(view, CHUNKS)]
        overdue_ms = now_ms - 2 * int(gc_delay_s * 1000)
        overdue = [GcEntry.decode(s.value) for _, s in _entries(view, GC)]
    overdue = [entry for entry in overdue if entry.queued_ms < overdue_ms]
    reached: set[int] = set()
    pending = [record.segment_id for record in roots]
    while pending:
        namespace = pending.pop()
        if namespace not in reached:
            reached.add(namespace)
            pending.extend(link[0] for _, _, link in namespaces.get(namespace, ()) if link is not None)
    known = set(chunk_names)
    index_leaks = [
        f"namespace {namespace} @ {offset}" + (f" ({name})" if name else "")
        for namespace, entries in namespaces.items()
        for offset, name, _ in entries
        if namespace not in reached or (name is not None and name not in known)
    ]
    chunk_leaks = [name for name in chunk_names if name not in listed]
    return LeakReport(
        index_entries=len(index_leaks),
        chunk_records=len(chunk_leaks),
        gc_entries=len(overdue),
        index_examples=tuple(index_leaks[:EXAMPLES_MAX]),
        chunk_examples=tuple(chunk_leaks[:EXAMPLES_MAX]),
        gc_examples=tuple(f"{entry.chunk} ({entry.reason})" for entry in overdue[:EXAMPLES_MAX]),
    )
