"""The engine's read path on S3 (SeaweedFS, ``tests/support/s3server.py``), counted with
the binding's own request statistics (issue 17):

* a read is ranged GETs only: no HEAD before them (the engine builds the read handle
  from what its metadata knows); a missing object is ``ChunkNotFound`` from the GET,
  after the read's one retry;
* read-ahead is on by default on S3: a large chunk is read ahead in parallel ranged GETs
  of ``read_ahead_part_bytes``, and every GET sent is either a read's own or one part's;
* the usage meter counts exactly the requests the binding sent, read-ahead included.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("boto3", reason="boto3 is not installed (pip install 'slts[s3]')")

from slts.bindings.s3 import S3ChunkStorage, S3Statistics

from slts.config import StorageConfig
from slts.errors import ChunkNotFound
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.schema import TABLES
from slts.storage.chunked import ChunkedSegmentStorage
from slts.usage import UsageRecord
from tests.support.s3 import run_quick_bench
from tests.support.s3server import SeaweedServer

KiB = 1 << 10
READ = 16 * KiB


def binding_on(server: SeaweedServer) -> S3ChunkStorage:
    return S3ChunkStorage(server.new_bucket("readahead"), "chunks", **server.binding_kwargs())


def instance(binding: S3ChunkStorage, folder: Path, **config: object) -> ChunkedSegmentStorage:
    """A container on ``binding`` with its LMDB store in ``folder`` (a new epoch each time)."""
    settings = StorageConfig(
        **{
            "gc_interval_s": 0.0,
            "metadata_log_flush_interval_s": 0.0,
            "usage_flush_interval_s": 0.0,
            **config,
        }  # type: ignore[arg-type]
    )
    return ChunkedSegmentStorage(
        0, None, binding, LmdbMetadataStore(str(folder), TABLES), settings, owns_store=True
    )


def segment_of(storage: ChunkedSegmentStorage, name: str, chunks: int, chunk_bytes: int) -> bytes:
    """A segment of ``chunks`` objects of ``chunk_bytes`` (S3: one write, one object)."""
    data = os.urandom(chunks * chunk_bytes)
    storage.create(name, max_rolling_length=chunk_bytes)
    handle = storage.open_write(name)
    for offset in range(0, len(data), chunk_bytes):
        storage.write(handle, offset, data[offset : offset + chunk_bytes])
    assert len(storage.chunks(name)) == chunks
    return data


def requests(after: S3Statistics, before: S3Statistics) -> dict[str, int]:
    return {
        kind: getattr(after, f"{kind}_requests") - getattr(before, f"{kind}_requests")
        for kind in ("get", "head", "put", "list", "delete")
    }


def test_a_read_is_ranged_gets_without_a_head(s3_server, tmp_path: Path) -> None:
    binding = binding_on(s3_server)
    with instance(binding, tmp_path / "md") as writer:
        data = segment_of(writer, "s", chunks=4, chunk_bytes=48 * KiB)
    with instance(binding, tmp_path / "md", read_ahead_bytes=0) as reader:
        assert reader.read_ahead_statistics() is None
        handle = reader.open_read("s")
        before = binding.statistics()
        for offset in range(0, len(data), READ):  # 12 reads, each inside one chunk
            assert reader.read(handle, offset, READ) == data[offset : offset + READ]
        sent = requests(binding.statistics(), before)
        assert sent == {"get": len(data) // READ, "head": 0, "put": 0, "list": 0, "delete": 0}


def test_a_missing_object_is_chunk_not_found_from_the_get(s3_server, tmp_path: Path) -> None:
    binding = binding_on(s3_server)
    with instance(binding, tmp_path / "md", read_ahead_bytes=0) as storage:
        segment_of(storage, "s", chunks=2, chunk_bytes=8 * KiB)
        _, lost = storage.chunks("s")[1]
        s3_server.client().delete_object(Bucket=binding.bucket, Key=binding.object_key(lost.name))
        handle = storage.open_read("s")
        assert len(storage.read(handle, 0, 8 * KiB)) == 8 * KiB  # the first object is there
        before = binding.statistics()
        with pytest.raises(ChunkNotFound) as caught:
            storage.read(handle, 8 * KiB, 8 * KiB)
        assert caught.value.chunk == lost.name
        sent = requests(binding.statistics(), before)
        assert sent["head"] == 0 and sent["get"] == 2  # the read, and its one retry on a fresh layout


def test_large_chunks_are_read_ahead_in_parallel_ranged_gets(s3_server, tmp_path: Path) -> None:
    """Every GET is a read's own (a piece read ahead takes none) or one part's; parts cut
    each 256 KiB object at the multiples of 32 KiB; the meter saw what was sent."""
    binding = binding_on(s3_server)
    part = 32 * KiB
    with instance(binding, tmp_path / "md") as writer:
        data = segment_of(writer, "s", chunks=3, chunk_bytes=256 * KiB)
    start = binding.statistics()
    reader = instance(binding, tmp_path / "md", read_ahead_bytes=128 * KiB, read_ahead_part_bytes=part)
    try:
        handle = reader.open_read("s")
        before = binding.statistics()
        for offset in range(0, len(data), READ):
            assert reader.read(handle, offset, READ) == data[offset : offset + READ]
    finally:
        reader.close()  # joins the read-ahead threads: every request is counted now
    after = binding.statistics()
    stats = reader.read_ahead_statistics()
    assert stats is not None and stats.failures == 0 and stats.held_bytes == 0
    reads = len(data) // READ
    assert stats.hits > 0  # how many depends on the threads' schedule: only the accounting is exact
    # The two reads that made the stream fetched their own; nothing before them was read
    # ahead, and every part is one 32 KiB cut of an object (never past the data).
    assert 0 < stats.part_bytes <= len(data) - 2 * READ and stats.part_bytes == stats.parts * part
    sent = requests(after, before)
    assert sent["head"] == 0
    assert sent["get"] == (reads - stats.hits) + stats.parts + (after.retries - before.retries)
    total = UsageRecord({}, 0, 0, 0)
    for record in reader.meter.usage().values():
        total = total.plus(record)
    metered = {kind.lower(): count for kind, count in total.requests.items() if count}
    assert metered == {kind: count for kind, count in requests(after, start).items() if count}


def test_the_cold_sequential_read_benchmark_runs_and_cleans_up(
    s3_server, monkeypatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``slts bench --quick`` with ``s3_read_seq`` and ``s3_read_seq_parallel``: both
    figures, and no scratch folder or object left behind."""
    only = ["s3_read_seq", "s3_read_seq_parallel"]
    bucket, figures = run_quick_bench(s3_server, monkeypatch, tmp_path, capsys, only)
    for figure in figures:
        assert figure["unit"] == "MB/s" and figure["ratio"] > 0 and "64 MiB segment" in figure["work"]
    assert list(tmp_path.iterdir()) == []
    assert s3_server.client().list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0
