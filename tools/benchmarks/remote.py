"""Tiered Kafka logs (``slts.remote``): copy of rolled segments, fetch by offset, the
offset lookup at scale, each against the raw work it adds to, and the memory a copy's
inspection takes whatever the batch size.

The logs are genuine v2 record batches built with kafka-python (the ``kafka`` extra);
building them is setup, never measured.
"""

from __future__ import annotations

import bisect
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

from slts.bindings.filesystem import FileSystemChunkStorage
from slts.bindings.memory import MemoryChunkStorage
from slts.tools import kafka_logs
from slts.tools.benchmarks.base import Benchmark, Folder, Workload

from slts.config import StorageConfig
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.schema import TABLES
from slts.remote.local_log import LocalSegment, local_log
from slts.remote.manager import RemoteLogManager
from slts.remote.records import SegmentState, TopicPartition, new_segment_metadata
from slts.remote.rlmm import RemoteLogMetadataManager
from slts.remote.rsm import WRITE_BYTES_DEFAULT
from slts.storage.chunked import ChunkedSegmentStorage

TP = TopicPartition("bench", 0)
#: Batches of about 16 KB, the size Kafka's producers aim at (``batch.size`` default).
BATCH_RECORDS = 16
VALUE_BYTES = 1000
FETCHES = 1000
LOOKUPS = 5000
SEGMENTS_PER_EPOCH = 1000


def _partition(folder: str, segments: int, batches: int) -> list[kafka_logs.KafkaLog]:
    """A partition folder of ``segments`` segments of ``batches`` batches (about 16 KB
    each), plus one active segment, so that every one of them is rolled."""
    logs, base = [], 0
    for index in range(segments + 1):
        log = kafka_logs.build_log(
            base, batches, records_per_batch=BATCH_RECORDS, seed=index, value_bytes=VALUE_BYTES
        )
        kafka_logs.write_log_dir(folder, log)
        logs.append(log)
        base = log.end_offset + 1
    checkpoint = kafka_logs.leader_epoch_checkpoint_bytes([(0, 0)])  # one leader throughout
    with open(os.path.join(folder, "leader-epoch-checkpoint"), "wb") as file:
        file.write(checkpoint)
    os.sync()  # the measured commits' fsyncs must not pay for writing the test data
    return logs


def _copy_files(segment: LocalSegment) -> list[str | os.PathLike[str]]:
    data = segment.data
    return [data.log, data.offset_index, data.time_index]


def copy(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: ``copy_rolled_segments`` of a partition's rolled segments into a fresh
    store (filesystem binding, LMDB): each log read twice (inspected: every batch parsed
    and its CRC32C checked; then copied), STARTED and FINISHED commits, six SLTS segments
    per log segment. Baseline: the same files copied into new chunks of the same binding
    in pieces of the same size (the raw work of moving the bytes to tier-2)."""
    segments, batches = (4, 500) if quick else (4, 4000)  # 8 MB or 64 MB segments
    folder = Folder(parent)
    log_dir = folder.sub(str(TP))
    logs = _partition(log_dir, segments, batches)
    local = local_log(log_dir)
    rolled = local.segments[:-1]
    total = sum(len(log.data) + len(log.offset_index) + len(log.time_index) for log in logs[:-1])

    def subject() -> float:
        with folder.fresh_store("subject") as storage:
            manager = RemoteLogManager(storage)
            started = time.perf_counter()
            report = manager.copy_rolled_segments(TP, local)
            elapsed = time.perf_counter() - started
        assert len(report.copied) == segments, report
        return elapsed

    def baseline() -> float:
        with folder.fresh("raw") as raw:
            binding = FileSystemChunkStorage(raw)
            try:
                started = time.perf_counter()
                for segment in rolled:
                    for path in _copy_files(segment):
                        handle = binding.create(os.path.basename(path))
                        offset = 0
                        with open(path, "rb") as file:
                            while piece := file.read(WRITE_BYTES_DEFAULT):
                                offset += binding.write(handle, offset, piece)
                return time.perf_counter() - started
            finally:
                binding.close()

    try:
        yield (
            f"copy of {segments} rolled Kafka segments ({total / 1e6:.0f} MB, {segments * batches} batches)"
            " vs. a raw binding copy of the same files",
            subject,
            baseline,
            total / 1e6,
            "MB/s",
        )
    finally:
        folder.close()


def fetch_first(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: ``fetch(offset, max_bytes=1)`` (the one batch holding ``offset``) at random
    offsets of a tiered partition: the partition's RLMM view checked against the store,
    the segment looked up in it, the offset index (kept) bounding the batch, one engine
    read of that range (its checksum blocks verified), the batch's header and CRC
    checked. Baseline: a ranged read of exactly that batch from the chunk holding it, its
    position known (the same binding). The offsets are the same in every run: after the
    first, each segment's lookup interval and offset index are in memory, as for a
    consumer reading on through a segment."""
    segments, batches = (4, 200) if quick else (8, 500)
    folder = Folder(parent)
    log_dir = folder.sub(str(TP))
    logs = _partition(log_dir, segments, batches)[:-1]
    storage = folder.store("store")
    manager = RemoteLogManager(storage)
    report = manager.copy_rolled_segments(TP, local_log(log_dir))
    assert len(report.copied) == segments, report
    binding = storage.chunk_storage
    rng = random.Random(7)
    offsets = [rng.randrange(logs[-1].end_offset + 1) for _ in range(FETCHES)]
    ranges = []  # (chunk name, position in the chunk, length) of the batch holding each offset
    for offset in offsets:
        index = max(i for i, log in enumerate(logs) if log.base_offset <= offset)
        log, metadata = logs[index], report.copied[index]
        batch = next(b for b in log.batches if b.base_offset <= offset <= b.last_offset)
        layout = storage.chunks(manager.rsm.segment_name(metadata))
        starts = [start for start, _ in layout]
        start, chunk = layout[bisect.bisect_right(starts, batch.position) - 1]
        assert batch.position + batch.size <= start + chunk.length, "a batch across chunks"
        ranges.append((chunk.name, batch.position - start, batch.size))

    def subject() -> float:
        started = time.perf_counter()
        for offset in offsets:
            manager.fetch(TP, offset, 1)
        return time.perf_counter() - started

    def baseline() -> float:
        started = time.perf_counter()
        for name, position, length in ranges:
            binding.read(binding.open_read(name), position, length)
        return time.perf_counter() - started

    try:
        yield (
            f"{FETCHES} fetches of the first batch at random offsets of {segments} remote segments"
            " vs. raw ranged reads of the same batches",
            subject,
            baseline,
            float(FETCHES),
            "fetches/s",
        )
    finally:
        storage.close()
        folder.close()


def _lookup_store(
    folder: str, segments: int
) -> tuple[RemoteLogMetadataManager, ChunkedSegmentStorage, LmdbMetadataStore, int]:
    """An RLMM on LMDB (commits not synced: the figure is about reads) with ``segments``
    finished segments of 100 offsets, a new leader epoch every 1,000 segments; returns it,
    its instance and store, and the partition's highest offset."""
    store = LmdbMetadataStore(folder, TABLES, durable=False)
    config = StorageConfig(gc_interval_s=0.0)
    storage = ChunkedSegmentStorage(0, None, MemoryChunkStorage(f"memory://{folder}"), store, config)
    rlmm = RemoteLogMetadataManager(storage)
    for number in range(segments):
        start = number * 100
        metadata = new_segment_metadata(
            TP,
            start_offset=start,
            end_offset=start + 99,
            leader_epochs={number // SEGMENTS_PER_EPOCH: start},
            max_timestamp_ms=start,
            size_bytes=1 << 20,
        )
        rlmm.add_segment(metadata)
        rlmm.update_segment(metadata.id, SegmentState.COPY_SEGMENT_FINISHED)
    return rlmm, storage, store, segments * 100 - 1


def lookup(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: ``segment_for_offset`` without a leader epoch (a consumer's fetch) at
    random offsets of a partition of 100,000 remote segments under 100 leader epochs
    (10,000 under 10 with ``--quick``). Baseline: the same lookups at 10 segments."""
    count = 10_000 if quick else 100_000
    folder = Folder(parent)
    large, large_storage, large_store, large_end = _lookup_store(folder.sub("large"), count)
    small, small_storage, small_store, small_end = _lookup_store(folder.sub("small"), 10)
    rng = random.Random(11)
    large_offsets = [rng.randrange(large_end + 1) for _ in range(LOOKUPS)]
    small_offsets = [rng.randrange(small_end + 1) for _ in range(LOOKUPS)]

    def run(rlmm: RemoteLogMetadataManager, offsets: list[int]) -> float:
        started = time.perf_counter()
        for offset in offsets:
            found = rlmm.segment_for_offset(TP, offset)
            assert found is not None and found.start_offset <= offset <= found.end_offset, offset
        return time.perf_counter() - started

    try:
        yield (
            f"{LOOKUPS} offset lookups without a leader epoch, {count} remote segments"
            f" ({count // SEGMENTS_PER_EPOCH} epochs) vs. 10 segments",
            lambda: run(large, large_offsets),
            lambda: run(small, small_offsets),
            float(LOOKUPS),
            "lookups/s",
        )
    finally:
        for storage in (large_storage, small_storage):
            storage.close()
        for store in (large_store, small_store):
            store.close()
        folder.close()


#: The child process of ``inspect_rss``: inspect one segment, copy it into a fresh store,
#: print the peak resident set of its own address space in MB (``VmHWM``: ``ru_maxrss``
#: would report at least the parent's RSS at the spawn, which Linux carries over exec).
_INSPECT_COPY_PROBE = """
import sys
import slts
from slts.remote.inspection import inspect_segment
from slts.remote.records import TopicPartition, new_segment_metadata
from slts.remote.rsm import LogSegmentData, RemoteStorageManager
log, index, timeindex, checkpoint, store = sys.argv[1:6]
with open(checkpoint, "rb") as file:
    data = LogSegmentData(log, index, timeindex, file.read())
storage = slts.open("file://" + store + "/chunks", metadata=store + "/metadata", gc_interval_s=0.0)
summary = inspect_segment(data, label=log).summary
metadata = new_segment_metadata(
    TopicPartition("bench", 0),
    start_offset=summary.base_offset,
    end_offset=summary.end_offset,
    leader_epochs=summary.leader_epochs,
    max_timestamp_ms=summary.max_timestamp,
    size_bytes=summary.size_bytes,
)
RemoteStorageManager(storage).copy_log_segment(metadata, data)
storage.close()
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
print(int(status["VmHWM"].split()[0]) / 1024)
"""


def inspect_rss(
    parent: str, quick: bool, segment_bytes: int
) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: the peak RSS (MB, the child's own high-water mark) of a fresh process that
    inspects one segment of ``segment_bytes`` in 100-byte batches
    (``slts.remote.inspection``: every batch parsed and its CRC32C checked, the offset
    index merged with them) and copies it with the RSM into a fresh store (filesystem
    binding, LMDB). Baseline: the same process on a segment of the same size in 1 MiB
    batches (about 10,000 times fewer batches). Equal figures: memory does not grow with
    the number of batches."""
    folder = Folder(parent)
    small = kafka_logs.write_uniform_log(folder.sub("small"), batch_bytes=100, total_bytes=segment_bytes)
    large = kafka_logs.write_uniform_log(folder.sub("large"), batch_bytes=1 << 20, total_bytes=segment_bytes)
    os.sync()
    runs = 0

    def probe(log: kafka_logs.UniformLog) -> float:
        nonlocal runs
        runs += 1
        store = folder.sub(f"store-{runs}")
        paths = [str(log.paths[kind]) for kind in ("log", "index", "timeindex", "leader-epoch-checkpoint")]
        try:
            out = subprocess.run(
                [sys.executable, "-c", _INSPECT_COPY_PROBE, *paths, store],
                capture_output=True,
                text=True,
                check=True,
            )
        finally:
            shutil.rmtree(store, ignore_errors=True)
        return float(out.stdout.split()[-1])

    try:
        yield (
            f"peak RSS inspecting + copying a {segment_bytes / 2**20:.0f} MiB segment of"
            f" {small.batch_count} 100-byte batches vs. of {large.batch_count} 1 MiB batches",
            lambda: probe(small),
            lambda: probe(large),
            1.0,
            "MB (lower)",
        )
    finally:
        folder.close()


BENCHMARKS = {
    "remote_copy": Benchmark(
        "remote_copy", "copy of rolled Kafka log segments vs. a raw binding copy of the files", copy
    ),
    "remote_fetch_first": Benchmark(
        "remote_fetch_first", "fetch of the batch holding a random offset vs. a raw ranged read", fetch_first
    ),
    "remote_inspect_rss": Benchmark(
        "remote_inspect_rss",
        "peak RSS inspecting + copying a 1 GiB segment (64 MiB with --quick) of 100-byte vs. 1 MiB batches",
        lambda parent, quick: inspect_rss(parent, quick, (64 << 20) if quick else (1 << 30)),
        measures="value",
    ),
    "remote_lookup_100k": Benchmark(
        "remote_lookup_100k",
        "offset lookup at 100,000 remote segments (10,000 with --quick) vs. 10",
        lookup,
    ),
}
