"""GCS benchmarks, run by ``slts bench --store gs://bucket/prefix?endpoint=...``.

Each figure next to the raw google-cloud-storage client against the same server, bucket
and run:

* ``gcs_write_1m`` / ``gcs_write_8m``: SLTS writes of that size to one segment (no append:
  each write is one upload of a new chunk, with ``ifGenerationMatch=0``, plus the LMDB
  commits) vs. raw ``Blob.upload_from_string`` of the same sizes. MB/s.
* ``gcs_read_seq``: a cold sequential reader: a segment of 8 MiB chunks (64 MiB; 32 MiB
  with ``--quick``) read front to back in 1 MiB reads by a fresh instance, with the
  configuration's defaults (read-ahead, checksums verified), vs. raw
  ``Blob.download_as_bytes`` of the same objects, whole, one after another. MB/s.
* ``gcs_concat``: defrag of a sealed segment of 1 MiB chunks: server-side (``compose``;
  the run asserts that no chunk byte passed through this process: the defrag reports 0
  bytes copied and the binding counts every chunk byte as composed by the server) vs. the
  same defrag through the client (the binding's concat turned off). MB/s of defragmented data.

Credentials: Application Default Credentials, or ``anonymous=1`` for an emulator. Every
object a benchmark writes is below ``<prefix>/slts-bench-<random>/`` and deleted afterwards.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

from slts.tools.benchmarks.base import Benchmark, Folder, Workload, timed_segment_writes

from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.factory import open as open_storage

Setup = Iterator[tuple[str, Workload, Workload, float, str]]
READ_SEQ_CHUNK_BYTES = 8 << 20
READ_SEQ_READ_BYTES = 1 << 20
READ_SEQ_SEGMENT_BYTES = 64 << 20
READ_SEQ_SEGMENT_BYTES_QUICK = 32 << 20
CONCAT_CHUNK_BYTES = 1 << 20


def is_gcs_url(store: str | None) -> bool:
    return isinstance(store, str) and store.startswith("gs://")


class _Target:
    """A scratch prefix below the store URL's prefix, with a raw SDK bucket for it."""

    def __init__(self, url: str) -> None:
        from slts.bindings.gcs import GcsChunkStorage

        probe = GcsChunkStorage.from_url(url)
        self.binding = probe
        self.bucket = probe.bucket
        self.prefix = "/".join(p for p in (probe.prefix, f"slts-bench-{uuid.uuid4().hex[:12]}") if p)
        self._query = url.partition("?")[2]
        self.url = self.sub_url("")
        # The raw client: the SDK's own, as an application would make it (same credentials).
        self.raw: Any = probe.client.bucket(probe.bucket)

    def sub_url(self, name: str) -> str:
        path = f"{self.prefix}/{name}" if name else self.prefix
        return f"gs://{self.bucket}/{path}" + (f"?{self._query}" if self._query else "")

    def clean(self) -> None:
        """Delete every object below the scratch prefix."""
        for blob in list(self.raw.client.list_blobs(self.raw, prefix=self.prefix + "/")):
            with contextlib.suppress(Exception):
                blob.delete()
        self.binding.close()


def _writes(url: str, parent: str, quick: bool, size: int, count: int) -> Setup:
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
            target.raw.blob(f"{target.prefix}/raw/{runs}/{i}").upload_from_string(payload)
        return time.perf_counter() - started

    try:
        yield (
            f"{count} x {size >> 10} KiB writes to one segment on GCS vs. raw Blob.upload_from_string",
            subject,
            baseline,
            count * size / 1e6,
            "MB/s",
        )
    finally:
        storage.close()
        folder.close()
        target.clean()


def _read_seq(url: str, parent: str, quick: bool) -> Setup:
    from slts.bindings.gcs import GcsChunkStorage

    total = READ_SEQ_SEGMENT_BYTES_QUICK if quick else READ_SEQ_SEGMENT_BYTES
    target = _Target(url)
    folder = Folder(parent)
    metadata = folder.sub("metadata")
    writer: ChunkedSegmentStorage = open_storage(target.url, metadata=metadata, gc_interval_s=0.0)
    try:
        writer.create("seq", max_rolling_length=READ_SEQ_CHUNK_BYTES)
        handle = writer.open_write("seq")
        for offset in range(0, total, READ_SEQ_CHUNK_BYTES):
            writer.write(handle, offset, os.urandom(READ_SEQ_CHUNK_BYTES))
        names = [chunk.name for _, chunk in writer.chunks("seq")]
    finally:
        writer.close()
    assert len(names) == total // READ_SEQ_CHUNK_BYTES, names
    mapping = GcsChunkStorage.from_url(target.url)
    objects = [mapping.object_name(name) for name in names]
    mapping.close()

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

    def baseline() -> float:
        started = time.perf_counter()
        got = sum(len(target.raw.blob(name).download_as_bytes()) for name in objects)
        elapsed = time.perf_counter() - started
        assert got == total, got
        return elapsed

    try:
        yield (
            f"cold sequential 1 MiB reads of a {total >> 20} MiB segment of 8 MiB chunks on GCS vs. "
            f"raw Blob.download_as_bytes of its {len(objects)} objects one after another",
            subject,
            baseline,
            total / 1e6,
            "MB/s",
        )
    finally:
        folder.close()
        target.clean()


def _concat(url: str, parent: str, quick: bool) -> Setup:
    chunks = 4 if quick else 16
    payload = os.urandom(CONCAT_CHUNK_BYTES)
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
            storage.concat(storage.open_write(name), i * CONCAT_CHUNK_BYTES, part)
        storage.seal(storage.open_write(name))
        return name

    def defrag(mode: str) -> float:
        storage = instances[mode]
        name = fragmented(storage)
        binding = _gcs_binding(storage)
        before = binding.statistics()
        started = time.perf_counter()
        result = storage.defrag(name)
        elapsed = time.perf_counter() - started
        after = binding.statistics()
        assert result.chunks_after == 1, result
        if mode == "server":
            # Every chunk byte composed inside the server, none through this process (the
            # engine's own metadata objects may be uploaded meanwhile: they are not chunk bytes).
            composed = after.bytes_composed_server_side - before.bytes_composed_server_side
            assert result.bytes_copied == 0 and composed == chunks * CONCAT_CHUNK_BYTES, (composed, result)
        return elapsed

    try:
        yield (
            f"defrag of {chunks} x 1 MiB chunks on GCS: server-side compose (0 bytes through the client, "
            "asserted) vs. through the client",
            lambda: defrag("server"),
            lambda: defrag("client"),
            chunks * CONCAT_CHUNK_BYTES / 1e6,
            "MB/s",
        )
    finally:
        for storage in instances.values():
            storage.close()
        folder.close()
        target.clean()


def _gcs_binding(storage: ChunkedSegmentStorage) -> Any:
    """The GCS binding below the engine's wrappers (the gate, a cache)."""
    binding: Any = storage.chunk_storage
    for _ in range(8):
        if hasattr(binding, "statistics") and type(binding).__name__ == "GcsChunkStorage":
            return binding
        binding = binding.inner
    raise AssertionError("no GCS binding below the engine's wrappers")


def benchmarks(url: str) -> dict[str, Benchmark]:
    """The GCS benchmarks against the store at ``url``."""
    return {
        "gcs_write_1m": Benchmark(
            "gcs_write_1m",
            "1 MiB writes on GCS: SLTS vs. raw Blob.upload_from_string",
            lambda p, q: _writes(url, p, q, 1 << 20, 8 if q else 32),
        ),
        "gcs_write_8m": Benchmark(
            "gcs_write_8m",
            "8 MiB writes on GCS: SLTS vs. raw Blob.upload_from_string",
            lambda p, q: _writes(url, p, q, 8 << 20, 2 if q else 8),
        ),
        "gcs_read_seq": Benchmark(
            "gcs_read_seq",
            "cold sequential 1 MiB reads on GCS: SLTS vs. raw Blob.download_as_bytes of the same objects",
            lambda p, q: _read_seq(url, p, q),
        ),
        "gcs_concat": Benchmark(
            "gcs_concat",
            "defrag on GCS: server-side compose vs. through the client",
            lambda p, q: _concat(url, p, q),
        ),
    }
