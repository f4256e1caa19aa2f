"""Metrics scrapes at scale: ``metrics_scrape_1m``.

Subject: one Prometheus scrape of a container of 1,000,000 segments (100,000 with
``--quick``); baseline: the same scrape of a container of 1,000 segments, in the same run.
A scrape is what ``slts metrics --serve`` answers: ``generate_latest`` over a registry
holding ``SltsCollector`` of an instance observing the store read-only (every family;
the read-only instance has no durable copy, so its family is absent at both sizes).
Each figure is microseconds per scrape (lower is better), the mean of at least
``SCRAPES_MIN`` scrapes and ``TIMED_S_MIN`` seconds of them; the ratio is subject /
baseline (the goal: within 2x).

Each container is built the same way. The engine writes a template segment of one chunk
(``journal`` off: no tier-2 copy to ship). Then its segment and chunk records are cloned,
under new names and ids, with one index entry per chunk, into the container's LMDB in
commits of ``BATCH_SEGMENTS`` segments (not durable: the build is not measured). One segment
in ``DELETED_EVERY`` is deleted instead (a tombstone in ``deleted``, its chunk still recorded,
as a delete leaves them for GC), and as many chunks wait in the GC queue (real queue
entries). So the four tables a scrape counts all grow with the container.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from slts.tools.benchmarks.base import Benchmark, Folder, Workload

from slts.gc import queue_entry
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.records import ChunkRecord, GcReason, SegmentRecord, SegmentStatus
from slts.metadata.schema import (
    CHUNKS,
    DELETED,
    INDEX,
    SEGMENTS,
    TABLES,
    index_key,
    name_key,
    segment_id_key,
)
from slts.metadata.store import Operation, Put
from slts.metrics import SltsCollector
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.factory import open as open_storage

#: Segments per build commit (about 3 records each).
BATCH_SEGMENTS = 10_000
#: One segment in this many is deleted (a tombstone), and as many chunks are queued for GC.
DELETED_EVERY = 100
#: A figure is the mean of at least this many scrapes ...
SCRAPES_MIN = 3
#: ... and of at least this long a run of them.
TIMED_S_MIN = 0.25
#: Ids of cloned segments start here (above any id the engine gave the template).
_CLONE_ID_BASE = 1 << 48
#: Engine settings of every instance here: no background work that would read or write
#: the store while it is built or scraped.
_QUIET: dict[str, Any] = {"gc_interval_s": 0.0, "usage_flush_interval_s": 0.0, "journal": False}


def _templates(chunks_url: str, metadata: str) -> tuple[SegmentRecord, ChunkRecord]:
    """A segment of one chunk, written by the engine: its segment and chunk records."""
    storage = open_storage(chunks_url, metadata=metadata, **_QUIET)
    try:
        storage.create("template")
        storage.write(storage.open_write("template"), 0, b"t" * 64)
        store = storage.context.store
        segment = store.get(SEGMENTS, name_key("template"))
        assert segment is not None
        record = SegmentRecord.decode(segment.value)
        assert record.first_chunk is not None and record.chunk_count == 1
        chunk = store.get(CHUNKS, name_key(record.first_chunk))
        assert chunk is not None
        return record, ChunkRecord.decode(chunk.value)
    finally:
        storage.close()


def _clone_ops(i: int, segment: SegmentRecord, chunk: ChunkRecord, queued_ms: int) -> list[Operation]:
    """The records of clone ``i``: a live segment with its chunk and index entry, or (one
    in ``DELETED_EVERY``) a tombstone with its chunk, plus a chunk queued for GC."""
    name = f"scope/stream-{i:07d}/0"
    segment_id = _CLONE_ID_BASE + i
    chunk_name = f"0/{name}/E1.O0.{i:032x}"
    new_chunk = dataclasses.replace(chunk, name=chunk_name, index_id=segment_id)
    new_segment = dataclasses.replace(
        segment, name=name, segment_id=segment_id, first_chunk=chunk_name, last_chunk=chunk_name
    )
    ops: list[Operation] = [
        Put(CHUNKS, name_key(chunk_name), new_chunk.encode()),
        Put(INDEX, index_key(segment_id, 0), name_key(chunk_name)),
    ]
    if i % DELETED_EVERY:
        ops.append(Put(SEGMENTS, name_key(name), new_segment.encode()))
        return ops
    status = int((new_segment.status | SegmentStatus.DELETED) & ~SegmentStatus.ACTIVE)
    tombstone = dataclasses.replace(new_segment, status=status)
    ops.append(Put(DELETED, segment_id_key(segment_id), tombstone.encode()))
    ops.append(queue_entry(f"0/{name}/E1.O64.{i:032x}", GcReason.DROPPED, queued_ms + i))
    return ops


def _container(folder: Folder, name: str, segments: int) -> ChunkedSegmentStorage:
    """A container of ``segments`` segments (see module doc), opened read-only."""
    chunks_url = f"file://{folder.sub(name + '-chunks')}"
    metadata = folder.sub(name + "-metadata")
    segment, chunk = _templates(chunks_url, metadata)
    store = LmdbMetadataStore(metadata, TABLES, durable=False)
    queued_ms = int(time.time() * 1000)
    try:
        for first in range(0, segments, BATCH_SEGMENTS):
            ops: list[Operation] = []
            for i in range(first, min(first + BATCH_SEGMENTS, segments)):
                ops += _clone_ops(i, segment, chunk, queued_ms)
            store.commit(ops)
        assert store.count(SEGMENTS) + store.count(DELETED) == segments + 1  # + the template
    finally:
        store.close()
    return open_storage(chunks_url, metadata=metadata, read_only=True, **_QUIET)


def _scraper(storage: ChunkedSegmentStorage, segments: int) -> Workload:
    """Microseconds per scrape of ``storage``'s metrics (mean of a timed run of scrapes),
    after checking that a scrape reports the container's ``segments``."""
    registry = CollectorRegistry()
    registry.register(SltsCollector(storage))
    first = generate_latest(registry).decode()  # outside the timing (imports, first reads)
    reported = {
        sample.name: sample.value
        for family in text_string_to_metric_families(first)
        for sample in family.samples
    }
    deleted = len(range(0, segments, DELETED_EVERY))
    assert reported["slts_segments"] == segments - deleted + 1, reported  # + the template
    assert reported["slts_gc_deleted_segments"] == reported["slts_gc_queue_entries"] == deleted
    assert reported["slts_chunks"] == segments + 1

    def scrape() -> float:
        scrapes = 0
        started = time.perf_counter()
        while True:
            generate_latest(registry)
            scrapes += 1
            elapsed = time.perf_counter() - started
            if scrapes >= SCRAPES_MIN and elapsed >= TIMED_S_MIN:
                return elapsed / scrapes * 1e6

    return scrape


def metrics_scrape(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: a scrape at 1,000,000 segments (100,000 quick); baseline: at 1,000."""
    large, small = (100_000 if quick else 1_000_000), 1_000
    folder = Folder(parent)
    opened: list[ChunkedSegmentStorage] = []
    try:
        opened.append(_container(folder, "small", small))
        baseline = _scraper(opened[-1], small)
        opened.append(_container(folder, "large", large))
        subject = _scraper(opened[-1], large)
        yield (
            f"metrics scrape at {large:,} segments vs. at {small:,} (us per scrape)",
            subject,
            baseline,
            1.0,
            "us/scrape (lower)",
        )
    finally:
        for storage in opened:
            storage.close()
        folder.close()


BENCHMARKS = {
    "metrics_scrape_1m": Benchmark(
        "metrics_scrape_1m",
        "a metrics scrape at 1,000,000 segments (100,000 with --quick) vs. at 1,000",
        metrics_scrape,
        measures="value",
    ),
}
