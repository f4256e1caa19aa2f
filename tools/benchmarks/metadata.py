"""Metadata-heavy work: create/delete, truncate, garbage collection, memory at scale."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import lmdb
from slts.bindings.filesystem import FileSystemChunkStorage, chunk_relpath
from slts.tools.benchmarks.base import Benchmark, Folder, Workload

from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.records import SegmentRecord, SegmentStatus
from slts.metadata.schema import SEGMENTS, TABLES, name_key
from slts.metadata.store import Put
from slts.storage.factory import open as open_storage

BATCH = 1000


def _raw_durable_txns(env: lmdb.Environment, count: int, tag: bytes) -> float:
    started = time.perf_counter()
    for i in range(count):
        with env.begin(write=True) as txn:
            txn.put(tag + b"%d" % i, b"v" * 200)
    return time.perf_counter() - started


def create_delete(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: create then delete N segments (two durable commits each); baseline: 2N raw
    durable LMDB transactions of one record."""
    count = 100 if quick else 1000
    folder = Folder(parent)
    storage = open_storage(
        f"file://{folder.sub('chunks')}", metadata=folder.sub("metadata"), gc_interval_s=0.0
    )
    raw = lmdb.open(folder.sub("raw"), map_size=1 << 30)
    runs = 0

    def subject() -> float:
        nonlocal runs
        runs += 1
        started = time.perf_counter()
        for i in range(count):
            storage.create(f"cd{runs}/{i}")
            storage.delete(storage.open_write(f"cd{runs}/{i}"))
        return time.perf_counter() - started

    def baseline() -> float:
        return _raw_durable_txns(raw, 2 * count, b"r%d-" % runs)

    try:
        yield (
            f"create + delete of {count} segments vs. {2 * count} raw durable LMDB txns",
            subject,
            baseline,
            float(count),
            "segments/s",
        )
    finally:
        storage.close()
        raw.close()
        folder.close()


def truncate(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: one truncate dropping N chunks (in commits of gc_batch_max); baseline: raw
    durable LMDB transactions deleting N keys in the same batches. Before each truncate
    (untimed) GC deletes the chunks the previous one dropped, as it would in service: the
    process does not grow by N chunks a repetition (their objects made the interpreter's
    full collections inside later truncates slower and slower)."""
    chunks = 2000 if quick else 20_000
    folder = Folder(parent)
    storage = open_storage(
        "memory://bench-truncate-" + os.path.basename(folder.path),
        metadata=folder.sub("metadata"),
        gc_interval_s=0.0,
        gc_delay_s=0.0,
    )
    raw = lmdb.open(folder.sub("raw"), map_size=1 << 32)
    runs = 0

    def subject() -> float:
        nonlocal runs
        runs += 1
        while storage.gc.run_once().progressed:
            pass
        name = f"t{runs}"
        storage.create(name, max_rolling_length=1)
        handle = storage.open_write(name)
        for offset in range(0, chunks, 10_000):
            storage.write(handle, offset, bytes(min(10_000, chunks - offset)))
        if storage.durable is not None:  # the set-up's backlog ships now, not beside the timed truncate
            storage.durable.flush()
        started = time.perf_counter()
        storage.truncate(handle, chunks - 1)
        return time.perf_counter() - started

    def baseline() -> float:
        with raw.begin(write=True) as txn:
            for i in range(chunks):
                txn.put(b"k%d-%d" % (runs, i), b"v" * 120)
        started = time.perf_counter()
        for first in range(0, chunks, BATCH):
            with raw.begin(write=True) as txn:
                for i in range(first, min(first + BATCH, chunks)):
                    txn.delete(b"k%d-%d" % (runs, i))
        return time.perf_counter() - started

    try:
        yield (
            f"truncate dropping {chunks} chunks vs. raw LMDB deletes in batches of {BATCH}",
            subject,
            baseline,
            float(chunks),
            "chunks/s",
        )
    finally:
        storage.close()
        raw.close()
        folder.close()


def garbage_collection(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: GC to the end of N chunks on the filesystem, both kinds of garbage: half
    dropped by a truncate (queue entries: claimed, deleted and removed in batches) and
    half with the deleted segment (its tombstone's batches); baseline: the same N files
    made as chunks are (the binding's durable ``create``: synced, linked, folder synced),
    unlinked by as many threads as GC deletes with (``gc_delete_threads``)."""
    chunks = 500 if quick else 5000
    folder = Folder(parent)
    storage = open_storage(
        f"file://{folder.sub('chunks')}", metadata=folder.sub("metadata"), gc_delay_s=0.0, gc_interval_s=0.0
    )
    runs = 0

    def subject() -> float:
        nonlocal runs
        runs += 1
        name = f"g{runs}"
        storage.create(name, max_rolling_length=64)
        handle = storage.open_write(name)
        storage.write(handle, 0, bytes(64 * chunks))
        storage.truncate(handle, 64 * (chunks // 2))
        storage.delete(handle)
        started = time.perf_counter()
        while storage.gc.run_once().progressed:
            pass
        return time.perf_counter() - started

    def baseline() -> float:
        raw = folder.sub(f"raw{runs}")
        names = [f"g/{i}" for i in range(chunks)]
        binding = FileSystemChunkStorage(raw)
        try:
            for name in names:
                binding.create(name, bytes(64))
        finally:
            binding.close()
        paths = [os.path.join(raw, chunk_relpath(name)) for name in names]
        started = time.perf_counter()
        with ThreadPoolExecutor(storage.config.gc_delete_threads) as pool:
            for _ in pool.map(os.unlink, paths):
                pass
        return time.perf_counter() - started

    try:
        yield (
            f"GC of {chunks} chunks (half truncated away, half deleted) vs. unlink of {chunks} synced files"
            f" on {storage.config.gc_delete_threads} threads",
            subject,
            baseline,
            float(chunks),
            "chunks/s",
        )
    finally:
        storage.close()
        folder.close()


_RSS_PROBE = """
import sys
import slts
storage = slts.open(sys.argv[2], metadata=sys.argv[1], gc_interval_s=0.0, read_only={read_only})
if {touch}:
    for name in storage.list():
        storage.info(name)
status = dict(line.split(":", 1) for line in open("/proc/self/status") if line.startswith("Rss"))
storage.close()
print(int(status["RssAnon"].split()[0]) // 1024, int(status["RssFile"].split()[0]) // 1024)
"""


def memory_at_scale(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: resident anonymous memory (MB) of a process that opens a container of N
    segments and has read every segment's info (the metadata cache stays bounded);
    baseline: the same process opening the container without touching the segments.
    LMDB's file-backed mapped pages (page cache the kernel may drop) are not counted."""
    segments = 100_000 if quick else 1_000_000
    folder = Folder(parent)
    metadata = folder.sub("metadata")
    store = LmdbMetadataStore(metadata, TABLES, durable=False)
    for first in range(0, segments, 10_000):
        ops = []
        for i in range(first, min(first + 10_000, segments)):
            name = f"scope/stream-{i:07d}/0"
            record = SegmentRecord(
                name, i + 1, int(SegmentStatus.ACTIVE), 0, 0, None, None, 0, 0, 64 << 20, 0, 0, 0, 0
            )
            ops.append(Put(SEGMENTS, name_key(name), record.encode()))
        store.commit(ops)
    store.close()

    # Tier-2 on disk, as in production: on the memory binding the metadata snapshot that
    # the durable copy takes at the owner's first open (the whole store) would sit in the
    # probe's own memory and be counted (that was the 394 MB of issue 17).
    tier2 = f"file://{folder.sub('tier2')}"

    def probe(touch: bool) -> float:
        code = _RSS_PROBE.format(read_only=not touch, touch=touch)
        out = subprocess.run(
            [sys.executable, "-c", code, metadata, tier2], capture_output=True, text=True, check=True
        )
        anonymous_mb, _file_mb = out.stdout.split()
        return float(anonymous_mb)

    try:
        yield (
            f"anonymous RSS with {segments} segments, every info read, vs. opening only",
            lambda: probe(True),
            lambda: probe(False),
            1.0,
            "MB (lower)",
        )
    finally:
        folder.close()


def metadata_file_check(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: the walk of a metadata file that an open runs when the file may have
    changed outside LMDB (``slts.metadata.lmdb_file.walk_in_child``: a child process reads
    every record through LMDB and walks the free-page list); baseline: reading every
    record of the same file through LMDB in this process (what the walk must do at least).
    The file holds N records of 120 bytes in three tables (about 190 MB for 1,000,000);
    the figure is MB of data file per second (warm page cache)."""
    from slts.metadata.lmdb_file import walk_in_child
    from slts.metadata.schema import CHUNKS, INDEX

    records = 100_000 if quick else 1_000_000
    folder = Folder(parent)
    metadata = folder.sub("metadata")
    store = LmdbMetadataStore(metadata, TABLES, durable=False)
    for first in range(0, records, 20_000):
        ops = []
        for i in range(first, min(first + 20_000, records)):
            key = b"scope/stream-%07d/0/E1.O%012d" % (i // 100, i)
            ops.append(Put((CHUNKS, INDEX, SEGMENTS)[i % 3], key, os.urandom(40) + b"v" * 80))
        store.commit(ops)
    store.close()
    size_mb = os.path.getsize(os.path.join(metadata, "data.mdb")) / 1e6

    def subject() -> float:
        started = time.perf_counter()
        outcome = walk_in_child(metadata)
        elapsed = time.perf_counter() - started
        assert outcome["records"] >= records, outcome
        return elapsed

    def baseline() -> float:
        started = time.perf_counter()
        env = lmdb.Environment(metadata, readonly=True, max_dbs=64)
        with env.begin() as txn:
            names = [bytes(key) for key, _ in txn.cursor()]
            for name in names:
                for _ in txn.cursor(env.open_db(name, txn=txn)).iternext(keys=False, values=True):
                    pass
        env.close()
        return time.perf_counter() - started

    try:
        yield (
            f"walk of a {size_mb:.0f} MB metadata file ({records} records) in a child vs. reading "
            "its records in process",
            subject,
            baseline,
            size_mb,
            "MB/s",
        )
    finally:
        folder.close()


BENCHMARKS = {
    "create_delete": Benchmark(
        "create_delete", "create + delete of many segments vs. raw LMDB txns", create_delete
    ),
    "truncate": Benchmark("truncate", "truncate dropping many chunks vs. raw LMDB deletes", truncate),
    "gc": Benchmark(
        "gc", "GC rate vs. raw unlinks of the same synced files, as many threads", garbage_collection
    ),
    "metadata_check": Benchmark(
        "metadata_check",
        "walk of the metadata file at open (1,000,000 records; 100,000 with --quick) vs. reading its records",
        metadata_file_check,
    ),
    "rss_1m": Benchmark(
        "rss_1m", "peak RSS with 1,000,000 segments (100,000 with --quick)", memory_at_scale, measures="value"
    ),
}
