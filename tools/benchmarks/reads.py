"""Reads: sequential throughput and random-read lookup cost against raw binding reads."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator

from slts.bindings.filesystem import FileSystemChunkStorage, chunk_relpath
from slts.bindings.memory import MemoryChunkStorage
from slts.tools.benchmarks.base import Benchmark, Folder, Workload

from slts.config import StorageConfig
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.schema import TABLES
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.factory import open as open_storage

READ_BYTES = 8 << 20
RANDOM_READS = 2000
CHUNK_BYTES = 4096


def sequential_read(
    parent: str, quick: bool, *, verify: bool = False
) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: read a large segment front to back in 8 MiB reads (``verify``: every read
    checks the CRC32C of every 64 KiB block it returns; otherwise no checksum is kept);
    baseline: ``pread`` of the same bytes from the chunk files (both from the page cache
    after the first pass)."""
    total = (32 if quick else 256) << 20
    folder = Folder(parent)
    storage = open_storage(
        f"file://{folder.sub('chunks')}",
        metadata=folder.sub("metadata"),
        gc_interval_s=0.0,
        checksums=verify,
        verify_checksums_on_read=verify,
    )
    storage.create("seq")
    handle = storage.open_write("seq")
    block = os.urandom(READ_BYTES)
    for offset in range(0, total, READ_BYTES):
        storage.write(handle, offset, block)
    binding = storage.chunk_storage
    chunks = [(chunk.name, chunk.length) for _, chunk in storage.chunks("seq")]

    def subject() -> float:
        started = time.perf_counter()
        for offset in range(0, total, READ_BYTES):
            storage.read(handle, offset, READ_BYTES)
        return time.perf_counter() - started

    def baseline() -> float:
        started = time.perf_counter()
        for name, length in chunks:
            chunk = binding.open_read(name)
            for offset in range(0, length, READ_BYTES):
                binding.read(chunk, offset, READ_BYTES)
        return time.perf_counter() - started

    try:
        checked = ", every 64 KiB block's CRC32C verified," if verify else ""
        yield (
            f"{total >> 20} MiB segment ({len(chunks)} chunks) read in 8 MiB reads{checked} vs. raw chunk "
            "reads",
            subject,
            baseline,
            total / 1e6,
            "MB/s",
        )
    finally:
        storage.close()
        folder.close()


def random_reads(
    parent: str, quick: bool, chunks: int, cold: bool
) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: 4 KiB reads of random chunks of a segment of ``chunks`` chunks of 4 KiB
    (filesystem binding, LMDB metadata, block checksums verified; ``cold``: a fresh
    instance, so an empty metadata cache, per repetition). Baseline: the least a read
    of those bytes takes, ``open``, ``pread`` and ``close`` of the same chunk files.
    The chunk files are page-cached for both. The segment is written through the memory
    binding and its objects copied into files where the filesystem binding keeps them
    (making 100,000 durable chunk files one by one would take minutes)."""
    folder = Folder(parent)
    staging = MemoryChunkStorage("memory://bench-random")
    store = LmdbMetadataStore(folder.sub("metadata"), TABLES)
    config = StorageConfig(gc_interval_s=0.0, write_chunks_max=10_000)
    writer = ChunkedSegmentStorage(0, None, staging, store, config)
    writer.create("r", max_rolling_length=CHUNK_BYTES)
    handle = writer.open_write("r")
    step = 10_000 * CHUNK_BYTES
    for offset in range(0, chunks * CHUNK_BYTES, step):
        writer.write(handle, offset, os.urandom(min(step, chunks * CHUNK_BYTES - offset)))
    names = [chunk.name for _, chunk in writer.chunks("r")]
    writer.close()
    root = folder.sub("chunks")
    paths = [os.path.join(root, chunk_relpath(name)) for name in names]
    for name in staging.list():  # the chunks, and the store's identity object
        path = os.path.join(root, chunk_relpath(name))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as file:
            file.write(staging.read(staging.open_read(name), 0, staging.get_info(name).length))
    binding = FileSystemChunkStorage(root)
    rng = random.Random(chunks)
    picks = [rng.randrange(chunks) for _ in range(RANDOM_READS)]
    reader = ChunkedSegmentStorage(0, None, binding, store, config, read_only=True)
    assert reader.read(reader.open_read("r"), picks[0] * CHUNK_BYTES, CHUNK_BYTES) == staging.read(
        staging.open_read(names[picks[0]]), 0, CHUNK_BYTES
    )

    def subject() -> float:
        instance = ChunkedSegmentStorage(0, None, binding, store, config, read_only=True) if cold else reader
        read_handle = instance.open_read("r")
        started = time.perf_counter()
        for pick in picks:
            instance.read(read_handle, pick * CHUNK_BYTES, CHUNK_BYTES)
        elapsed = time.perf_counter() - started
        if cold:
            instance.close()
        return elapsed

    def baseline() -> float:
        started = time.perf_counter()
        for pick in picks:
            fd = os.open(paths[pick], os.O_RDONLY)
            try:
                os.pread(fd, CHUNK_BYTES, 0)
            finally:
                os.close(fd)
        return time.perf_counter() - started

    try:
        state = "cold" if cold else "warm"
        yield (
            f"{RANDOM_READS} random 4 KiB reads, {chunks} chunks on the filesystem, {state}, verified, vs. "
            "open + pread + close of the same files",
            subject,
            baseline,
            float(RANDOM_READS),
            "reads/s",
        )
    finally:
        reader.close()
        binding.close()
        store.close()
        folder.close()


def _random(chunks: int, quick_chunks: int, cold: bool) -> Benchmark:
    label = {10: "10", 1000: "1k", 100_000: "100k"}[chunks]
    name = f"read_random_{label}" + ("_cold" if cold else "")
    return Benchmark(
        name,
        f"random 4 KiB reads at {chunks} chunks ({quick_chunks} with --quick), {'cold' if cold else 'warm'}",
        lambda parent, quick: random_reads(parent, quick, quick_chunks if quick else chunks, cold),
    )


BENCHMARKS = {
    "read_seq": Benchmark("read_seq", "sequential read vs. raw chunk reads", sequential_read),
    "read_seq_verified": Benchmark(
        "read_seq_verified",
        "sequential read verifying every block's CRC32C vs. raw chunk reads",
        lambda parent, quick: sequential_read(parent, quick, verify=True),
    ),
    **{
        b.name: b
        for b in (
            _random(10, 10, False),
            _random(1000, 1000, False),
            _random(100_000, 10_000, False),
            _random(10, 10, True),
            _random(100_000, 10_000, True),
        )
    },
}
