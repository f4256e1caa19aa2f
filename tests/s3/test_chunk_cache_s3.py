"""The chunk cache on a real S3 server (SeaweedFS, ``tests/support/s3server.py``).

* ``slts.open`` on an ``s3://`` URL with ``chunk_cache_bytes`` reads through a cache;
* a restarted instance re-reads a segment without a single GET of its chunks (the
  binding's own request counts), every byte equal;
* the GC's deletes go through the cache: a deleted segment's chunks leave it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("boto3", reason="boto3 is not installed (pip install 'slts[s3]')")

from slts.bindings.chunk_cache import CachedChunkStorage
from slts.bindings.s3 import S3ChunkStorage

import slts
from slts.config import StorageConfig
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.schema import TABLES
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.factory import with_chunk_cache

KiB = 1 << 10
CHUNK = 512 * KiB


def config(folder: Path, **extra: object) -> StorageConfig:
    return StorageConfig(
        **{
            "gc_interval_s": 0.0,
            "metadata_log_flush_interval_s": 0.0,
            "usage_flush_interval_s": 0.0,
            "chunk_cache_dir": str(folder),
            "chunk_cache_bytes": 16 << 20,
            "chunk_cache_block_bytes": 256 * KiB,
            "read_ahead_part_bytes": 256 * KiB,
            "read_ahead_bytes": 1 << 20,
            **extra,
        }  # type: ignore[arg-type]
    )


def test_slts_open_reads_s3_through_the_cache(s3_server, monkeypatch, tmp_path: Path) -> None:
    for variable, value in s3_server.credentials().items():
        monkeypatch.setenv(variable, value)
    url = f"s3://{s3_server.new_bucket('cache')}/c?endpoint_url={s3_server.endpoint_url}"
    options = {"chunk_cache_dir": str(tmp_path / "cache"), "chunk_cache_bytes": 64 << 20}
    with slts.open(url, metadata=str(tmp_path / "md"), gc_interval_s=0.0, **options) as storage:
        assert isinstance(storage.chunk_storage.inner, CachedChunkStorage)
        storage.create("s")
        storage.write(storage.open_write("s"), 0, b"hello cache")
        assert storage.read(storage.open_read("s"), 0, 11) == b"hello cache"


def test_a_restarted_reader_re_reads_s3_segments_from_the_cache(s3_server, tmp_path: Path) -> None:
    s3 = S3ChunkStorage(s3_server.new_bucket("cache"), "chunks", **s3_server.binding_kwargs())
    settings = config(tmp_path / "cache", gc_delay_s=0.0)
    binding = with_chunk_cache(s3, settings)
    assert isinstance(binding, CachedChunkStorage)
    data = os.urandom(6 * CHUNK)

    def instance() -> ChunkedSegmentStorage:
        store = LmdbMetadataStore(str(tmp_path / "md"), TABLES)
        return ChunkedSegmentStorage(0, None, binding, store, settings, owns_store=True)

    with instance() as writer:
        writer.create("s", max_rolling_length=CHUNK)
        handle = writer.open_write("s")
        for offset in range(0, len(data), CHUNK):
            writer.write(handle, offset, data[offset : offset + CHUNK])
        assert writer.read(writer.open_read("s"), 0, len(data)) == data  # fills the cache
        binding.cache.drain()
        chunk_names = [chunk.name for _, chunk in writer.chunks("s")]
    with instance() as reader:
        gets = s3.statistics().get_requests
        handle = reader.open_read("s")
        for offset in range(0, len(data), 100 * KiB):
            length = min(100 * KiB, len(data) - offset)
            assert reader.read(handle, offset, length) == data[offset : offset + length]
        assert s3.statistics().get_requests == gets  # not one GET
        reader.delete(reader.open_write("s"))
        for _ in range(3):  # gc_delay_s = 0: the tombstone, then its chunks
            reader.gc.run_once()
    held = {file.key for file in binding.cache.index.files()}
    assert not held & {binding.cache.key_of(binding.url, name) for name in chunk_names}
    statistics = binding.chunk_cache_statistics()
    assert statistics.corruptions == 0 and statistics.bytes <= statistics.capacity_bytes
    binding.close()
