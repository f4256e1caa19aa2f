"""Prometheus metrics of a container instance (``prometheus_client``).

``SltsCollector(storage, limiter=...)`` is a custom collector: at each scrape it reads the
instance's own counters and a consistent view of its metadata, so nothing on the hot path
pays for metrics. A library user registers it in their own registry::

    from prometheus_client import CollectorRegistry
    registry = CollectorRegistry()
    registry.register(SltsCollector(storage, limiter=limiter))

``slts metrics`` prints them once; ``slts metrics --serve PORT`` serves them over HTTP for
operators. Names follow Prometheus conventions (``slts_`` prefix, ``_total`` counters,
``_bytes``, ``_seconds``), all with the label ``container``:

* operations of this instance: writes, reads, bytes, appends, chunks created, commit
  retries, write failures (counters since the instance started);
* layout: segments and chunks in the metadata (gauges; the tables' entry counts, O(1):
  a scrape reads no table's entries, whatever the store's size);
* GC: passes' deletions and errors (counters), queue depth, the age of its oldest entry and
  the deleted segments awaiting collection (gauges);
* the metadata's copy on tier-2: records not yet on tier-2 (the recovery point lag),
  metadata log bytes, flushes and snapshots;
* leaks: the last leak check's counts by kind (gauges; absent before a check);
* the limiter, per traffic class: bytes and requests let through, requests throttled and
  seconds throttled (counters);
* the chunk storage, from the gate every binding call passes (``slts.usage``): requests by
  kind and traffic class, bytes sent, received and copied by class (counters), each binding
  call's latency (a histogram by call) and its errors by call and error type (counters);
* the chunk cache, when the binding reads through one (``slts.bindings.chunk_cache``):
  hits, misses and their bytes, fills, dropped fills, fill errors, stale fills, evictions,
  invalidations and corruptions (counters, of the process's cache: every container on it
  reports the same), files and bytes held and the capacity (gauges).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from slts.bindings.base import ChunkStorage, WrappedChunkStorage
from slts.bindings.chunk_cache import CachedChunkStorage, ChunkCacheStatistics
from slts.errors import InvalidArgument
from slts.limiter import PriorityLimiter
from slts.metadata.schema import CHUNKS, DELETED, GC, SEGMENTS
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.leaks import LeakReport
from slts.storage.types import StorageStatistics
from slts.usage import LATENCY_BUCKETS_S

_QUEUED_MS = struct.Struct(">Q")


class SltsCollector(Collector):
    """The metrics of ``storage`` (and of ``limiter``, if given) at each scrape."""

    def __init__(self, storage: ChunkedSegmentStorage, *, limiter: PriorityLimiter | None = None) -> None:
        if not isinstance(storage, ChunkedSegmentStorage):
            raise InvalidArgument(f"{storage!r} is not a ChunkedSegmentStorage")
        if limiter is not None and not isinstance(limiter, PriorityLimiter):
            raise InvalidArgument(f"{limiter!r} is not a PriorityLimiter")
        self.storage = storage
        self.limiter = limiter
        self._container = str(storage.container_id)

    def collect(self) -> Iterator[Metric]:
        """Every metric, read now."""
        statistics = self.storage.statistics()
        yield from self._operations(statistics)
        yield from self._layout()
        yield from self._durable_copy()
        yield from self._leaks(statistics.leaks)
        yield from self._limiter()
        yield from self._chunk_storage()
        yield from self._chunk_cache()

    # -- families -------------------------------------------------------------------------------

    def _counter(self, name: str, documentation: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, documentation, labels=["container"])
        family.add_metric([self._container], value)
        return family

    def _gauge(self, name: str, documentation: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, documentation, labels=["container"])
        family.add_metric([self._container], value)
        return family

    def _operations(self, s: StorageStatistics) -> Iterator[Metric]:
        yield self._gauge("slts_epoch", "The container's epoch as this instance knows it.", s.epoch)
        for name, documentation, value in (
            ("slts_writes", "Segment writes.", s.writes),
            ("slts_written_bytes", "Bytes written to segments.", s.bytes_written),
            ("slts_appends", "Writes appended to an existing chunk.", s.appends),
            ("slts_chunks_created", "Chunks created by writes.", s.chunks_created),
            ("slts_reads", "Segment reads.", s.reads),
            ("slts_read_bytes", "Bytes read from segments.", s.bytes_read),
            ("slts_commit_retries", "Metadata commits re-based after a conflict.", s.commit_retries),
            ("slts_write_failures", "Writes that failed.", s.write_failures),
        ):
            yield self._counter(name, documentation, value)
        gc = self.storage.gc.statistics()
        yield self._counter("slts_gc_chunks_deleted", "Chunks deleted by GC.", gc.chunks_deleted)
        yield self._counter(
            "slts_gc_segments_finished", "Deleted segments GC finished.", gc.tombstones_finished
        )
        yield self._counter("slts_gc_errors", "GC steps that failed (retried later).", gc.errors)

    def _layout(self) -> Iterator[Metric]:
        now_ms = self.storage.context.clock() * 1000
        # One read view, O(1) reads (counts, and the GC queue's first key): a scrape costs the
        # same at 10 and at 10,000,000 segments.
        with self.storage.context.store.snapshot() as view:
            oldest = view.scan(GC, limit=1)  # keys sort by the time queued
            segments = view.count(SEGMENTS)
            chunks = view.count(CHUNKS)
            deleted = view.count(DELETED)
            depth = view.count(GC)
        oldest_ms = _QUEUED_MS.unpack_from(oldest[0][0])[0] if oldest else None
        yield self._gauge("slts_segments", "Segments (the system segments are the journal's).", segments)
        yield self._gauge("slts_chunks", "Chunk records in the metadata.", chunks)
        yield self._gauge(
            "slts_gc_queue_entries",
            "GC queue entries: one per chunk queued alone, one per truncate commit for its run of chunks.",
            depth,
        )
        yield self._gauge(
            "slts_gc_deleted_segments", "Deleted segments whose chunks GC has yet to delete.", deleted
        )
        age = 0.0 if oldest_ms is None else max(0.0, (now_ms - oldest_ms) / 1000)
        yield self._gauge("slts_gc_queue_oldest_age_seconds", "Age of the oldest GC queue entry.", age)

    def _durable_copy(self) -> Iterator[Metric]:
        durable = self.storage.durable
        if durable is None:
            return
        d = durable.statistics()
        yield self._gauge(
            "slts_metadata_log_lag_records",
            "Metadata commits not yet on tier-2: what losing the machine now would lose.",
            max(0, d.store_sequence - d.durable_sequence),
        )
        yield self._gauge(
            "slts_metadata_log_bytes", "Bytes of the metadata log since its snapshot.", d.log_bytes
        )
        yield self._counter("slts_metadata_log_flushes", "Flushes of the metadata log to tier-2.", d.flushes)
        yield self._counter("slts_metadata_snapshots", "Metadata snapshots written to tier-2.", d.snapshots)

    def _leaks(self, report: LeakReport | None) -> Iterator[Metric]:
        if report is None:
            return
        family = GaugeMetricFamily(
            "slts_leaked_items", "What the last leak check found, by kind.", labels=["container", "kind"]
        )
        for kind, value in (
            ("index_entries", report.index_entries),
            ("chunk_records", report.chunk_records),
            ("gc_entries", report.gc_entries),
        ):
            family.add_metric([self._container, kind], value)
        yield family

    def _limiter(self) -> Iterator[Metric]:
        if self.limiter is None:
            return
        stats = self.limiter.stats()
        labels = ["container", "class"]
        families = [
            (CounterMetricFamily(name, documentation, labels=labels), field)
            for name, documentation, field in (
                ("slts_limiter_bytes", "Bytes let through, by class.", "bytes"),
                ("slts_limiter_requests", "Requests let through, by class.", "requests"),
                ("slts_limiter_throttled_requests", "Requests that waited, by class.", "requests_throttled"),
                ("slts_limiter_throttled_seconds", "Seconds requests waited, by class.", "seconds_throttled"),
            )
        ]
        for family, field in families:
            for kind, values in stats.items():
                family.add_metric([self._container, kind.name.lower()], getattr(values, field))
            yield family

    def _chunk_cache(self) -> Iterator[Metric]:
        statistics = chunk_cache_statistics(self.storage.chunk_storage)
        if statistics is None:
            return
        for name, documentation, value in (
            ("slts_chunk_cache_hits", "Reads served whole from the chunk cache.", statistics.hits),
            ("slts_chunk_cache_hit_bytes", "Bytes served from the chunk cache.", statistics.hit_bytes),
            (
                "slts_chunk_cache_misses",
                "Reads the chunk cache sent to the chunk storage.",
                statistics.misses,
            ),
            ("slts_chunk_cache_miss_bytes", "Bytes of those reads.", statistics.miss_bytes),
            ("slts_chunk_cache_fills", "Files written to the chunk cache.", statistics.fills),
            ("slts_chunk_cache_fill_bytes", "Chunk bytes written to the chunk cache.", statistics.fill_bytes),
            (
                "slts_chunk_cache_fills_dropped",
                "Runs not cached: the fills in flight were full, or their room was claimed.",
                statistics.fills_dropped,
            ),
            ("slts_chunk_cache_fill_errors", "Fills that failed on a disk error.", statistics.fill_errors),
            (
                "slts_chunk_cache_stale_fills",
                "Fills refused: their chunk changed after their read began.",
                statistics.stale_fills,
            ),
            (
                "slts_chunk_cache_evictions",
                "Files evicted (probation's least recently used first).",
                statistics.evictions,
            ),
            ("slts_chunk_cache_evicted_bytes", "Bytes of evicted files.", statistics.evicted_bytes),
            (
                "slts_chunk_cache_invalidations",
                "Files dropped: their chunk was deleted or changed.",
                statistics.invalidations,
            ),
            (
                "slts_chunk_cache_corruptions",
                "Files dropped: bytes failed their CRC32C.",
                statistics.corruptions,
            ),
        ):
            yield self._counter(name, documentation, value)
        yield self._gauge("slts_chunk_cache_files", "Files in the chunk cache.", statistics.files)
        yield self._gauge("slts_chunk_cache_bytes", "Bytes of the chunk cache's files.", statistics.bytes)
        yield self._gauge(
            "slts_chunk_cache_protected_bytes",
            "Bytes of the chunk cache's files used again since their fill (kept from scans).",
            statistics.protected_bytes,
        )
        yield self._gauge(
            "slts_chunk_cache_capacity_bytes", "Most bytes the chunk cache keeps.", statistics.capacity_bytes
        )

    def _chunk_storage(self) -> Iterator[Metric]:
        meter = self.storage.meter
        labels = ["container", "class"]
        requests = CounterMetricFamily(
            "slts_chunk_storage_requests",
            "Requests to the chunk storage by kind and traffic class (S3: the binding's own;"
            " other bindings: one per call, as an object store would count it).",
            labels=[*labels, "kind"],
        )
        moved = [
            (CounterMetricFamily(name, documentation, labels=labels), field)
            for name, documentation, field in (
                ("slts_chunk_storage_sent_bytes", "Bytes sent to the chunk storage.", "bytes_sent"),
                ("slts_chunk_storage_received_bytes", "Bytes received from it.", "bytes_received"),
                (
                    "slts_chunk_storage_copied_bytes",
                    "Bytes it copied itself (native concat).",
                    "bytes_copied",
                ),
            )
        ]
        for kind, record in meter.usage().items():
            name = kind.name.lower()
            for request, count in sorted(record.requests.items()):
                requests.add_metric([self._container, name, request], count)
            for family, field in moved:
                family.add_metric([self._container, name], getattr(record, field))
        yield requests
        for family, _ in moved:
            yield family
        latency = HistogramMetricFamily(
            "slts_chunk_storage_call_seconds",
            "Latency of chunk storage calls by call (limiter waits excluded).",
            labels=["container", "call"],
        )
        errors = CounterMetricFamily(
            "slts_chunk_storage_call_errors", "Chunk storage calls that raised, by error type.",
            labels=["container", "call", "error"],
        )  # fmt: skip
        for call, timing in sorted(meter.timings().items()):
            cumulative, buckets = 0, []
            for bound, count in zip(LATENCY_BUCKETS_S, timing.buckets, strict=True):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
            latency.add_metric([self._container, call], buckets, timing.sum_s)
            for error, count in sorted(timing.errors.items()):
                errors.add_metric([self._container, call, error], count)
        yield latency
        yield errors


def chunk_cache_statistics(binding: ChunkStorage) -> ChunkCacheStatistics | None:
    """The statistics of the chunk cache ``binding`` reads through (looked for along its
    wrappers: the gate, a fault injector...), or None if it reads through none."""
    for _ in range(100):  # wrappers are few; bounded all the same
        if isinstance(binding, CachedChunkStorage):
            return binding.chunk_cache_statistics()
        if not isinstance(binding, WrappedChunkStorage):
            return None
        binding = binding.inner
    return None
