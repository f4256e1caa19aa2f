"""Azure Blob Storage benchmarks, run by ``slts bench --store azure://container/prefix``.

Each figure next to the raw azure-storage-blob client against the same service,
container and run (credentials from the environment, as for the binding):

* ``azure_write_1m`` / ``azure_write_8m``: SLTS writes of that size to one segment (its
  chunk is an append blob: one ``Append Block`` per write, plus the LMDB commit) vs. raw
  ``append_block`` calls of the same bytes to one append blob. MB/s.
* ``azure_read_seq``: a cold sequential reader: a segment of 8 MiB chunks (256 MiB; 64 MiB
  with ``--quick``) read front to back in 1 MiB reads by a fresh instance, with the
  configuration's defaults (read-ahead, checksums) vs. raw ``download_blob`` of the same
  blobs, whole, one after another. MB/s.
* ``azure_concat``: defrag of a sealed segment of 5 MiB chunks: server-side (Put Block
  From URL, where the service has it) vs. the same defrag through the client (the
  binding's concat turned off). MB/s of defragmented data.
* ``azure_concat_client_bytes``: the bytes that defrag sent and received through this
  process (the binding's counters): native vs. through the client. MB, lower is better;
  0 where the copy stays inside the service.

Every blob a benchmark writes is below ``<prefix>/slts-bench-<random>/`` and deleted
afterwards.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl, urlparse

from slts.tools.benchmarks.base import Benchmark, Folder, Workload, timed_segment_writes

from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.factory import open as open_storage

Setup = Iterator[tuple[str, Workload, Workload, float, str]]
CHUNK_BYTES = 8 << 20
READ_BYTES = 1 << 20
SEGMENT_BYTES = 256 << 20
SEGMENT_BYTES_QUICK = 64 << 20
CONCAT_CHUNK_BYTES = 5 << 20


def is_azure_url(store: str | None) -> bool:
    return isinstance(store, str) and store.startswith("azure://")


class _Target:
    """A scratch prefix below the store URL's prefix, with a raw container client for it."""

    def __init__(self, url: str) -> None:
        from azure.storage.blob import BlobServiceClient
        from slts.bindings.azure import AzureChunkStorage, credentials_from_environment

        probe = AzureChunkStorage.from_url(url)
        probe.close()
        self.container = probe.container
        self.prefix = "/".join(p for p in (probe.prefix, f"slts-bench-{uuid.uuid4().hex[:12]}") if p)
        self._query = url.partition("?")[2]
        self.url = self.sub_url("")
        options = dict(parse_qsl(urlparse(url).query))
        found = credentials_from_environment(options.get("account"), options.get("endpoint"))
        if found.connection_string is not None:
            service = BlobServiceClient.from_connection_string(found.connection_string)
        else:
            service = BlobServiceClient(found.account_url or "", credential=found.credential)
        self.client: Any = service.get_container_client(self.container)

    def sub_url(self, name: str) -> str:
        path = f"{self.prefix}/{name}" if name else self.prefix
        return f"azure://{self.container}/{path}" + (f"?{self._query}" if self._query else "")

    def clean(self) -> None:
        for blob in self.client.list_blobs(name_starts_with=self.prefix + "/"):
            with contextlib.suppress(Exception):
                self.client.delete_blob(blob.name)
        self.client.close()


def _writes(url: str, parent: str, quick: bool, size: int, count: int) -> Setup:
    """Subject: ``count`` SLTS writes of ``size`` bytes to one segment; baseline: ``count``
    raw ``append_block`` calls of ``size`` bytes to one append blob."""
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
        blob = target.client.get_blob_client(f"{target.prefix}/raw/{runs}-{uuid.uuid4().hex[:6]}")
        blob.create_append_blob()
        started = time.perf_counter()
        for _ in range(count):
            blob.append_block(payload, length=len(payload))
        return time.perf_counter() - started

    try:
        yield (
            f"{count} x {size >> 10} KiB writes to one segment on Azure vs. raw SDK append_block",
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
    """Subject: a fresh instance reads a segment of 8 MiB chunks front to back in 1 MiB
    reads; baseline: raw ``download_blob`` of the same blobs, whole, one after another."""
    from slts.bindings.azure import AzureChunkStorage

    total = SEGMENT_BYTES_QUICK if quick else SEGMENT_BYTES
    target = _Target(url)
    folder = Folder(parent)
    metadata = folder.sub("metadata")
    writer: ChunkedSegmentStorage = open_storage(target.url, metadata=metadata, gc_interval_s=0.0)
    try:
        writer.create("seq", max_rolling_length=CHUNK_BYTES)
        handle = writer.open_write("seq")
        for offset in range(0, total, CHUNK_BYTES):
            writer.write(handle, offset, os.urandom(CHUNK_BYTES))
        names = [chunk.name for _, chunk in writer.chunks("seq")]
    finally:
        writer.close()
    assert len(names) == total // CHUNK_BYTES, names
    mapping = AzureChunkStorage.from_url(target.url)
    blobs = [mapping.blob_name(name) for name in names]
    mapping.close()

    def subject() -> float:
        reader: ChunkedSegmentStorage = open_storage(target.url, metadata=metadata, gc_interval_s=0.0)
        try:
            segment = reader.open_read("seq")
            started = time.perf_counter()
            for offset in range(0, total, READ_BYTES):
                reader.read(segment, offset, READ_BYTES)
            return time.perf_counter() - started
        finally:
            reader.close()

    def baseline() -> float:
        started = time.perf_counter()
        got = sum(len(target.client.download_blob(blob).readall()) for blob in blobs)
        elapsed = time.perf_counter() - started
        assert got == total, got
        return elapsed

    try:
        yield (
            f"cold sequential 1 MiB reads of a {total >> 20} MiB segment of 8 MiB chunks on Azure vs. "
            f"raw SDK download_blob of its {len(blobs)} blobs one after another",
            subject,
            baseline,
            total / 1e6,
            "MB/s",
        )
    finally:
        folder.close()
        target.clean()


class _Defrags:
    """Two stores on one scratch prefix: concat native (``server``) and off (``client``)."""

    def __init__(self, url: str, parent: str, quick: bool) -> None:
        self.chunks = 2 if quick else 6
        self.payload = os.urandom(CONCAT_CHUNK_BYTES)
        self.target = _Target(url)
        self.folder = Folder(parent)
        self.instances: dict[str, ChunkedSegmentStorage] = {}
        for mode, native in (("server", True), ("client", False)):
            storage = open_storage(
                self.target.sub_url(mode),
                metadata=self.folder.sub(f"metadata-{mode}"),
                concat_merge_seam=False,
                gc_interval_s=0.0,
            )
            storage.chunk_storage.supports_concat = native  # an instance flag: the engine branches on it
            self.instances[mode] = storage
        self.runs = 0

    def defrag(self, mode: str) -> tuple[float, int]:
        """Seconds one defrag took, and the bytes it moved through this process."""
        storage = self.instances[mode]
        self.runs += 1
        name = f"fragmented/{self.runs}"
        storage.create(name)
        for i in range(self.chunks):
            part = f"{name}.part{i}"
            storage.create(part)
            handle = storage.open_write(part)
            storage.write(handle, 0, self.payload)
            storage.seal(handle)
            storage.concat(storage.open_write(name), i * CONCAT_CHUNK_BYTES, part)
        storage.seal(storage.open_write(name))
        binding = _azure_binding(storage)
        before = binding.statistics()
        started = time.perf_counter()
        result = storage.defrag(name)
        elapsed = time.perf_counter() - started
        after = binding.statistics()
        assert result.chunks_after == 1, result
        moved = (after.bytes_uploaded - before.bytes_uploaded) + (
            after.bytes_downloaded - before.bytes_downloaded
        )
        return elapsed, moved

    def close(self) -> None:
        for storage in self.instances.values():
            storage.close()
        self.folder.close()
        self.target.clean()


def _azure_binding(storage: ChunkedSegmentStorage) -> Any:
    """The Azure binding below the engine's wrappers (the gate, a cache)."""
    binding: Any = storage.chunk_storage
    for _ in range(8):
        if hasattr(binding, "statistics") and hasattr(binding, "blob_name"):
            return binding
        binding = binding.inner
    raise AssertionError("no Azure binding below the engine")


def _concat(url: str, parent: str, quick: bool) -> Setup:
    defrags = _Defrags(url, parent, quick)
    try:
        yield (
            f"defrag of {defrags.chunks} x 5 MiB chunks on Azure: Put Block From URL vs. through the client",
            lambda: defrags.defrag("server")[0],
            lambda: defrags.defrag("client")[0],
            defrags.chunks * CONCAT_CHUNK_BYTES / 1e6,
            "MB/s",
        )
    finally:
        defrags.close()


def _concat_client_bytes(url: str, parent: str, quick: bool) -> Setup:
    defrags = _Defrags(url, parent, quick)
    try:
        yield (
            f"MB through this process in a defrag of {defrags.chunks} x 5 MiB chunks on Azure: "
            "native concat vs. through the client",
            lambda: defrags.defrag("server")[1] / 1e6,
            lambda: defrags.defrag("client")[1] / 1e6,
            1.0,
            "MB",
        )
    finally:
        defrags.close()


def benchmarks(url: str) -> dict[str, Benchmark]:
    """The Azure benchmarks against the store at ``url``."""
    return {
        "azure_write_1m": Benchmark(
            "azure_write_1m",
            "1 MiB writes on Azure: SLTS vs. raw SDK append_block",
            lambda p, q: _writes(url, p, q, 1 << 20, 8 if q else 64),
        ),
        "azure_write_8m": Benchmark(
            "azure_write_8m",
            "8 MiB writes on Azure: SLTS vs. raw SDK append_block",
            lambda p, q: _writes(url, p, q, 8 << 20, 2 if q else 16),
        ),
        "azure_read_seq": Benchmark(
            "azure_read_seq",
            "cold sequential 1 MiB reads on Azure: SLTS vs. raw SDK downloads of the same blobs in turn",
            lambda p, q: _read_seq(url, p, q),
        ),
        "azure_concat": Benchmark(
            "azure_concat",
            "defrag on Azure: server-side concat vs. through the client",
            lambda p, q: _concat(url, p, q),
        ),
        "azure_concat_client_bytes": Benchmark(
            "azure_concat_client_bytes",
            "bytes a defrag moves through this process on Azure: native concat vs. through the client",
            lambda p, q: _concat_client_bytes(url, p, q),
            measures="value",
        ),
    }
