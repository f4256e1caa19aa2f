"""S3 benchmarks, run by ``slts bench --store s3://bucket/prefix?endpoint_url=...``.

Each figure next to raw boto3 against the same server, bucket and run:

* ``s3_write_64k`` / ``s3_write_1m`` / ``s3_write_8m``: SLTS writes of that size to one
  segment (S3 has no append: each write is one ``PutObject`` of a new chunk plus the
  LMDB commits) vs. raw ``put_object`` calls of the same sizes with a default boto3
  client. MB/s.
* ``s3_concat``: defrag of a sealed segment of 5 MiB chunks: server-side (multipart
  upload with ``UploadPartCopy``: no chunk byte through this process) vs. the same
  defrag through the client (the engine's read-and-create path, the binding's concat
  turned off). MB/s of defragmented data; a ratio above 1 means server-side is faster.
* ``s3_read_seq`` / ``s3_read_seq_parallel``: a cold sequential reader: a segment of
  8 MiB chunks (256 MiB; 64 MiB with ``--quick``) read front to back in 1 MiB reads by a
  fresh instance (empty metadata cache, nothing read ahead yet), with the configuration's
  defaults (read-ahead, checksums verified). Baselines: raw boto3 ``get_object`` of the
  same objects, whole, one after another (``s3_read_seq``), and the same GETs issued on
  ``PARALLEL_GETS`` threads at once (``s3_read_seq_parallel``). MB/s.

* ``s3_cache_reread``: a warm chunk cache (``slts.bindings.chunk_cache``): a fresh
  instance re-reads a 1 GiB range (64 MiB with ``--quick``) of a segment of 8 MiB chunks
  on S3 in 1 MiB reads, every byte from the cache (filled by an earlier, untimed pass,
  checked by the cache's CRC32C and the engine's block checksums). Baseline: ``pread`` of
  the same bytes, 1 MiB at a time, from one local file in the same folder (warm in the
  page cache, as the cache's files are). MB/s. ``s3_cache_reread_no_ahead``: the same
  with the engine's read-ahead off (``read_ahead_bytes=0``): read-ahead's threads and
  hand-over cost more than they save once the bytes are local (docs/chunk_cache.md).
* ``s3_cache_first_read``: the first read of the ``s3_read_seq`` segment through an empty
  chunk cache (its fills running in the background) vs. the same read without a cache.
  MB/s; 1.0 means the cache costs a first read nothing.
* ``s3_cache_reread_after_scan``: a working set of 256 MiB (32 MiB with ``--quick``) of
  8 MiB chunks, held and used again in a chunk cache of 1.5 times its size, re-read by a
  fresh instance right after another read a segment of twice the cache's size once,
  front to back; baseline: the same re-read with no such pass before it. MB/s; 1.0 means
  the scan evicted nothing of the working set (the cache's segmented LRU,
  docs/chunk_cache.md "Scans"; under plain LRU the re-read goes to S3).
* ``s3_cache_reread_direct`` / ``s3_cache_first_read_direct``: the same two with the
  cache's fills written with ``O_DIRECT`` (``chunk_cache_direct_fills``, docs/chunk_cache.md:
  cheaper fills, slower hits). Such files enter the page cache only when read, so the
  re-read's set-up reads the segment once more, untimed, after filling: its files are then
  in the page cache as the baseline's local file is.

Credentials come from the usual AWS environment variables or profile (``?profile=``).
Every object a benchmark writes is below ``<prefix>/slts-bench-<random>/`` and deleted
afterwards.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from slts.tools.benchmarks.base import Benchmark, Folder, Workload, timed_segment_writes

from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.factory import acquire_chunk_cache
from slts.storage.factory import open as open_storage

Setup = Iterator[tuple[str, Workload, Workload, float, str]]
#: S3's smallest multipart part (``slts.bindings.s3.PART_BYTES_MIN``; not imported here so
#: that ``slts bench`` without boto3 still runs).
PART_BYTES_MIN = 5 << 20
#: ``s3_read_seq``: chunk and read sizes, segment sizes (full, ``--quick``).
READ_SEQ_CHUNK_BYTES = 8 << 20
READ_SEQ_READ_BYTES = 1 << 20
READ_SEQ_SEGMENT_BYTES = 256 << 20
READ_SEQ_SEGMENT_BYTES_QUICK = 64 << 20
#: Threads of the parallel GET baseline (the engine's ``read_threads`` default).
PARALLEL_GETS = 8
#: ``s3_cache_reread``: the range re-read (full, ``--quick``).
CACHE_REREAD_BYTES = 1 << 30
CACHE_REREAD_BYTES_QUICK = 64 << 20
#: Most untimed passes that fill the cache before ``s3_cache_reread`` measures.
CACHE_WARM_PASSES_MAX = 20
#: ``s3_cache_reread_after_scan``: the working set (full, ``--quick``); the cache holds
#: 1.5 times it, the scan is twice the cache.
CACHE_SCAN_HOT_BYTES = 256 << 20
CACHE_SCAN_HOT_BYTES_QUICK = 32 << 20


def is_s3_url(store: str | None) -> bool:
    return isinstance(store, str) and store.startswith("s3://")


class _Target:
    """A scratch prefix below the store URL's prefix, with a raw boto3 client for it."""

    def __init__(self, url: str) -> None:
        import boto3
        import botocore.config
        from slts.bindings.s3 import S3ChunkStorage

        probe = S3ChunkStorage.from_url(url)
        probe.close()
        self.bucket = probe.bucket
        self.prefix = "/".join(p for p in (probe.prefix, f"slts-bench-{uuid.uuid4().hex[:12]}") if p)
        self._query = url.partition("?")[2]
        self.url = self.sub_url("")
        session = boto3.session.Session(profile_name=probe.profile, region_name=probe.region)
        style = {"s3": {"addressing_style": "path"}} if probe.endpoint_url else {}
        self.client: Any = session.client(
            "s3",
            endpoint_url=probe.endpoint_url,
            config=botocore.config.Config(max_pool_connections=32, **style),
        )

    def sub_url(self, name: str) -> str:
        """The store URL of the scratch prefix (or of ``name`` below it)."""
        path = f"{self.prefix}/{name}" if name else self.prefix
        return f"s3://{self.bucket}/{path}" + (f"?{self._query}" if self._query else "")

    def clean(self) -> None:
        """Delete every object below the scratch prefix (bounded by the listing's pages)."""
        token = None
        for _ in range(100_000):
            arguments = {"Bucket": self.bucket, "Prefix": self.prefix + "/"}
            if token:
                arguments["ContinuationToken"] = token
            page = self.client.list_objects_v2(**arguments)
            for entry in page.get("Contents", []):
                with contextlib.suppress(Exception):
                    self.client.delete_object(Bucket=self.bucket, Key=entry["Key"])
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return


def _writes(url: str, parent: str, quick: bool, size: int, count: int) -> Setup:
    """Subject: ``count`` SLTS writes of ``size`` bytes to one segment on S3; baseline:
    ``count`` raw ``put_object`` calls of ``size`` bytes."""
    payload = os.urandom(size)
    target = _Target(url)
    folder = Folder(parent)
    storage: ChunkedSegmentStorage = open_storage(
        target.url, metadata=folder.sub("metadata"), gc_interval_s=0.0
    )
    runs = 0

    def subject() -> float:
        nonlocal runs
        runs += 1
        return timed_segment_writes(storage, f"bench/{runs}", payload, count)

    def baseline() -> float:
        started = time.perf_counter()
        for i in range(count):
            target.client.put_object(
                Bucket=target.bucket, Key=f"{target.prefix}/raw/{runs}/{i}", Body=payload
            )
        return time.perf_counter() - started

    try:
        yield (
            f"{count} x {size >> 10} KiB writes to one segment on S3 vs. raw boto3 put_object",
            subject,
            baseline,
            count * size / 1e6,
            "MB/s",
        )
    finally:
        storage.close()
        folder.close()
        target.clean()


def _concat(url: str, parent: str, quick: bool) -> Setup:
    """Subject: defrag of a segment of 5 MiB chunks, server-side; baseline: the same
    defrag with the binding's concat turned off (read and create through the client)."""
    chunks = 2 if quick else 8
    payload = os.urandom(PART_BYTES_MIN)
    target = _Target(url)
    folder = Folder(parent)
    instances = {}
    for mode, native in (("server", True), ("client", False)):
        storage = open_storage(
            target.sub_url(mode),
            metadata=folder.sub(f"metadata-{mode}"),
            concat_merge_seam=False,
            gc_interval_s=0.0,
        )
        storage.chunk_storage.supports_concat = native  # an instance flag: the engine branches on it
        instances[mode] = storage
    runs = 0

    def fragmented(storage: ChunkedSegmentStorage) -> str:
        nonlocal runs
        runs += 1
        name = f"fragmented/{runs}"
        storage.create(name)
        for i in range(chunks):
            part = f"{name}.part{i}"
            storage.create(part)
            handle = storage.open_write(part)
            storage.write(handle, 0, payload)
            storage.seal(handle)
            storage.concat(storage.open_write(name), i * PART_BYTES_MIN, part)
        storage.seal(storage.open_write(name))
        return name

    def defrag(mode: str) -> float:
        storage = instances[mode]
        name = fragmented(storage)
        started = time.perf_counter()
        result = storage.defrag(name)
        elapsed = time.perf_counter() - started
        assert result.chunks_after == 1, result
        return elapsed

    try:
        yield (
            f"defrag of {chunks} x 5 MiB chunks on S3: server-side UploadPartCopy vs. through the client",
            lambda: defrag("server"),
            lambda: defrag("client"),
            chunks * PART_BYTES_MIN / 1e6,
            "MB/s",
        )
    finally:
        for storage in instances.values():
            storage.close()
        folder.close()
        target.clean()


def _read_seq(url: str, parent: str, quick: bool, parallel: bool) -> Setup:
    """Subject: a fresh instance reads a segment of 8 MiB chunks front to back in 1 MiB
    reads (timed: the reads, not the start); baseline: raw ``get_object`` of the same
    objects, whole, one after another or (``parallel``) on ``PARALLEL_GETS`` threads."""
    from slts.bindings.s3 import S3ChunkStorage

    total = READ_SEQ_SEGMENT_BYTES_QUICK if quick else READ_SEQ_SEGMENT_BYTES
    target = _Target(url)
    folder = Folder(parent)
    metadata = folder.sub("metadata")
    writer: ChunkedSegmentStorage = open_storage(target.url, metadata=metadata, gc_interval_s=0.0)
    pool = ThreadPoolExecutor(PARALLEL_GETS, thread_name_prefix="bench-get") if parallel else None
    try:
        writer.create("seq", max_rolling_length=READ_SEQ_CHUNK_BYTES)
        handle = writer.open_write("seq")
        for offset in range(0, total, READ_SEQ_CHUNK_BYTES):
            writer.write(handle, offset, os.urandom(READ_SEQ_CHUNK_BYTES))  # one object each
        names = [chunk.name for _, chunk in writer.chunks("seq")]
    finally:
        writer.close()
    assert len(names) == total // READ_SEQ_CHUNK_BYTES, names
    keys = [S3ChunkStorage.from_url(target.url).object_key(name) for name in names]

    def subject() -> float:
        reader: ChunkedSegmentStorage = open_storage(target.url, metadata=metadata, gc_interval_s=0.0)
        try:
            segment = reader.open_read("seq")
            started = time.perf_counter()
            for offset in range(0, total, READ_SEQ_READ_BYTES):
                reader.read(segment, offset, READ_SEQ_READ_BYTES)
            return time.perf_counter() - started
        finally:
            reader.close()

    def get(key: str) -> int:
        return len(target.client.get_object(Bucket=target.bucket, Key=key)["Body"].read())

    def baseline() -> float:
        started = time.perf_counter()
        got = sum(pool.map(get, keys)) if pool is not None else sum(get(key) for key in keys)
        elapsed = time.perf_counter() - started
        assert got == total, got
        return elapsed

    try:
        how = f"on {PARALLEL_GETS} threads" if parallel else "one after another"
        yield (
            f"cold sequential 1 MiB reads of a {total >> 20} MiB segment of 8 MiB chunks on S3 vs. "
            f"raw boto3 GETs of its {len(keys)} objects {how}",
            subject,
            baseline,
            total / 1e6,
            "MB/s",
        )
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
        folder.close()
        target.clean()


def _segment_of_8m_chunks(
    target: _Target, metadata: str, total: int, mirror: str | None = None, name: str = "seq"
) -> None:
    """Write segment ``name`` of ``total`` bytes in 8 MiB chunks (one object each), and the
    same bytes to the local file ``mirror`` if given."""
    writer: ChunkedSegmentStorage = open_storage(target.url, metadata=metadata, gc_interval_s=0.0)
    try:
        writer.create(name, max_rolling_length=READ_SEQ_CHUNK_BYTES)
        handle = writer.open_write(name)
        with open(mirror, "wb") if mirror else contextlib.nullcontext() as local:
            for offset in range(0, total, READ_SEQ_CHUNK_BYTES):
                data = os.urandom(READ_SEQ_CHUNK_BYTES)
                writer.write(handle, offset, data)
                if local is not None:
                    local.write(data)
        assert len(writer.chunks(name)) == total // READ_SEQ_CHUNK_BYTES
    finally:
        writer.close()


def _timed_reads(url: str, metadata: str, total: int, name: str = "seq", **config: Any) -> float:
    """Seconds a fresh instance takes to read segment ``name`` front to back in 1 MiB reads."""
    reader: ChunkedSegmentStorage = open_storage(url, metadata=metadata, gc_interval_s=0.0, **config)
    try:
        segment = reader.open_read(name)
        started = time.perf_counter()
        for offset in range(0, total, READ_SEQ_READ_BYTES):
            reader.read(segment, offset, READ_SEQ_READ_BYTES)
        return time.perf_counter() - started
    finally:
        reader.close()


def _cache_settings(folder: str, total: int, direct: bool = False) -> dict[str, Any]:
    """A chunk cache in ``folder`` with room for ``total`` bytes of 8 MiB blocks
    (``direct``: its fills written with ``O_DIRECT``)."""
    return {
        "chunk_cache_dir": folder,
        "chunk_cache_bytes": total + total // 8 + (64 << 20),
        "chunk_cache_direct_fills": direct,
    }


def _cache_reread(url: str, parent: str, quick: bool, ahead: bool = True, direct: bool = False) -> Setup:
    """Subject: a fresh instance re-reads the segment from a warm chunk cache; baseline:
    ``pread`` of the same bytes from a local file (see the module doc)."""
    from slts.bindings import chunk_cache

    from slts.config import StorageConfig

    total = CACHE_REREAD_BYTES_QUICK if quick else CACHE_REREAD_BYTES
    target = _Target(url)
    folder = Folder(parent)
    metadata = folder.sub("metadata")
    mirror = os.path.join(folder.sub("local"), "segment")
    _segment_of_8m_chunks(target, metadata, total, mirror)
    cached = _cache_settings(folder.sub("cache"), total, direct)
    defaults = StorageConfig(**cached)
    reading = cached if ahead else {**cached, "read_ahead_bytes": 0}
    # Held open across the runs: each reader instance shares it, none closes it.
    cache = acquire_chunk_cache(defaults)
    try:
        # Fill the cache (not timed): reads faster than the fills can write drop the rest
        # (``chunk_cache_fill_bytes_max``), so read again until every block is held.
        for _ in range(CACHE_WARM_PASSES_MAX):
            _timed_reads(target.url, metadata, total, **cached)
            cache.drain()
            if cache.statistics().bytes >= total:
                break
        filled = cache.statistics()
        assert filled.bytes >= total, filled
        if direct:  # files written around the page cache: one read brings them in, as the local file is
            _timed_reads(target.url, metadata, total, **reading)

        def subject() -> float:
            before = cache.statistics().miss_bytes
            elapsed = _timed_reads(target.url, metadata, total, **reading)
            # An instance's start reads the store's identity object (a few bytes, a read
            # clipped at the object's end, which the cache never serves); no segment byte
            # may come from S3.
            missed = cache.statistics().miss_bytes - before
            assert missed < READ_SEQ_READ_BYTES, f"a re-read missed the cache ({missed} bytes)"
            return elapsed

        def baseline() -> float:
            fd = os.open(mirror, os.O_RDONLY)
            try:
                started = time.perf_counter()
                for offset in range(0, total, READ_SEQ_READ_BYTES):
                    os.pread(fd, READ_SEQ_READ_BYTES, offset)
                return time.perf_counter() - started
            finally:
                os.close(fd)

        yield (
            f"re-read of a {total >> 20} MiB segment of 8 MiB chunks on S3 in 1 MiB reads from a warm chunk "
            f"cache{'' if ahead else ', read-ahead off,'}{' filled with O_DIRECT,' if direct else ''} "
            "vs. pread of the same bytes from a local file",
            subject,
            baseline,
            total / 1e6,
            "MB/s",
        )
    finally:
        chunk_cache.release(cache)
        folder.close()
        target.clean()


def _cache_reread_after_scan(url: str, parent: str, quick: bool) -> Setup:
    """Subject: a fresh instance re-reads a working set from the chunk cache right after
    another instance read a segment twice the cache's size once, front to back; baseline:
    the same re-read with no scan before it (see the module doc)."""
    from slts.bindings import chunk_cache

    from slts.config import StorageConfig

    hot = CACHE_SCAN_HOT_BYTES_QUICK if quick else CACHE_SCAN_HOT_BYTES
    capacity = hot * 3 // 2  # the working set fits the protected share (docs/chunk_cache.md)
    scanned = 2 * capacity
    target = _Target(url)
    folder = Folder(parent)
    metadata = folder.sub("metadata")
    _segment_of_8m_chunks(target, metadata, hot, name="hot")
    _segment_of_8m_chunks(target, metadata, scanned, name="scan")
    cached: dict[str, Any] = {"chunk_cache_dir": folder.sub("cache"), "chunk_cache_bytes": capacity}
    defaults = StorageConfig(**cached)
    cache = acquire_chunk_cache(defaults)  # held across the runs, as in ``_cache_reread``

    def warm() -> None:
        """Until every block of the working set is held, and protected (read again)."""
        for _ in range(CACHE_WARM_PASSES_MAX):
            _timed_reads(target.url, metadata, hot, name="hot", **cached)
            cache.drain()
            if cache.statistics().protected_bytes >= hot:
                return
        raise AssertionError(f"the working set was not held: {cache.statistics()}")

    def reread(scan_first: bool) -> float:
        warm()
        if scan_first:
            _timed_reads(target.url, metadata, scanned, name="scan", **cached)
            cache.drain()
        before = cache.statistics().miss_bytes
        elapsed = _timed_reads(target.url, metadata, hot, name="hot", **cached)
        cache.drain()
        if not scan_first:
            missed = cache.statistics().miss_bytes - before
            assert missed < READ_SEQ_READ_BYTES, f"a re-read missed the cache ({missed} bytes)"
        return elapsed

    try:
        yield (
            f"re-read of a {hot >> 20} MiB working set of 8 MiB chunks on S3 from a {capacity >> 20} MiB"
            f" chunk cache right after one pass over a {scanned >> 20} MiB segment vs. with no such pass",
            lambda: reread(scan_first=True),
            lambda: reread(scan_first=False),
            hot / 1e6,
            "MB/s",
        )
    finally:
        chunk_cache.release(cache)
        folder.close()
        target.clean()


def _cache_first_read(url: str, parent: str, quick: bool, direct: bool = False) -> Setup:
    """Subject: a fresh instance reads the segment through an empty chunk cache; baseline:
    the same read without one."""
    total = READ_SEQ_SEGMENT_BYTES_QUICK if quick else READ_SEQ_SEGMENT_BYTES
    target = _Target(url)
    folder = Folder(parent)
    metadata = folder.sub("metadata")
    _segment_of_8m_chunks(target, metadata, total)

    def subject() -> float:
        with folder.fresh("cache") as cache_folder:
            return _timed_reads(target.url, metadata, total, **_cache_settings(cache_folder, total, direct))

    try:
        yield (
            f"cold sequential 1 MiB reads of a {total >> 20} MiB segment of 8 MiB chunks on S3 through an "
            f"empty chunk cache{' filled with O_DIRECT' if direct else ''} vs. without one",
            subject,
            lambda: _timed_reads(target.url, metadata, total),
            total / 1e6,
            "MB/s",
        )
    finally:
        folder.close()
        target.clean()


def benchmarks(url: str) -> dict[str, Benchmark]:
    """The S3 benchmarks against the store at ``url``."""
    return {
        "s3_write_64k": Benchmark(
            "s3_write_64k",
            "64 KiB writes on S3: SLTS vs. raw boto3 put_object",
            lambda p, q: _writes(url, p, q, 64 << 10, 32 if q else 256),
        ),
        "s3_write_1m": Benchmark(
            "s3_write_1m",
            "1 MiB writes on S3: SLTS vs. raw boto3 put_object",
            lambda p, q: _writes(url, p, q, 1 << 20, 8 if q else 64),
        ),
        "s3_write_8m": Benchmark(
            "s3_write_8m",
            "8 MiB writes on S3: SLTS vs. raw boto3 put_object",
            lambda p, q: _writes(url, p, q, 8 << 20, 2 if q else 16),
        ),
        "s3_concat": Benchmark(
            "s3_concat",
            "defrag on S3: server-side concat vs. through the client",
            lambda p, q: _concat(url, p, q),
        ),
        "s3_read_seq": Benchmark(
            "s3_read_seq",
            "cold sequential 1 MiB reads on S3: SLTS vs. raw boto3 GETs of the same objects in turn",
            lambda p, q: _read_seq(url, p, q, parallel=False),
        ),
        "s3_read_seq_parallel": Benchmark(
            "s3_read_seq_parallel",
            f"cold sequential 1 MiB reads on S3: SLTS vs. the same GETs on {PARALLEL_GETS} threads",
            lambda p, q: _read_seq(url, p, q, parallel=True),
        ),
        "s3_cache_reread": Benchmark(
            "s3_cache_reread",
            "re-read of S3 segments from a warm chunk cache vs. pread of the same bytes from a local file",
            lambda p, q: _cache_reread(url, p, q),
        ),
        "s3_cache_reread_no_ahead": Benchmark(
            "s3_cache_reread_no_ahead",
            "s3_cache_reread with the engine's read-ahead off",
            lambda p, q: _cache_reread(url, p, q, ahead=False),
        ),
        "s3_cache_reread_after_scan": Benchmark(
            "s3_cache_reread_after_scan",
            "re-read of a working set from the chunk cache right after a scan twice the cache's size",
            lambda p, q: _cache_reread_after_scan(url, p, q),
        ),
        "s3_cache_first_read": Benchmark(
            "s3_cache_first_read",
            "cold sequential reads on S3 through an empty chunk cache vs. without one",
            lambda p, q: _cache_first_read(url, p, q),
        ),
        "s3_cache_reread_direct": Benchmark(
            "s3_cache_reread_direct",
            "s3_cache_reread with the cache's fills written with O_DIRECT (chunk_cache_direct_fills)",
            lambda p, q: _cache_reread(url, p, q, direct=True),
        ),
        "s3_cache_first_read_direct": Benchmark(
            "s3_cache_first_read_direct",
            "s3_cache_first_read with the cache's fills written with O_DIRECT (chunk_cache_direct_fills)",
            lambda p, q: _cache_first_read(url, p, q, direct=True),
        ),
    }
