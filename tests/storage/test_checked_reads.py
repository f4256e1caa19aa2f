"""Large verified reads of one chunk are read and checked in parallel runs
(``ChunkedSegmentStorage._read_checked``): the same bytes as a serial read, and the same
errors: the first bad block in chunk order, a chunk shorter than its blocks, a chunk gone.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
from slts.bindings.filesystem import FileSystemChunkStorage, chunk_relpath

import slts.storage.chunked as chunked
from slts.errors import ChunkCorrupted
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.factory import open as open_storage

MiB = 1 << 20
BLOCK = 64 << 10


@pytest.fixture(params=[False, True], ids=["engine-runs", "binding-checks"])
def storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> ChunkedSegmentStorage:
    """The engine's own parallel runs (a binding that does not ``checks_as_it_reads``), and
    the filesystem binding's one-pass ``read_into_checked`` (its compiled twin where built)."""
    monkeypatch.setattr(chunked, "_CORES", 3)  # three runs per large read, whatever the machine
    monkeypatch.setattr(FileSystemChunkStorage, "checks_as_it_reads", request.param)
    instance = open_storage(
        f"file://{tmp_path / 'chunks'}", metadata=str(tmp_path / "metadata"), gc_interval_s=0.0
    )
    assert instance.chunk_storage.checks_as_it_reads is request.param
    yield instance
    instance.close()


DATA = bytes(range(256)) * (6 * MiB // 256)


def _chunk_path(storage: ChunkedSegmentStorage) -> str:
    ((_, chunk),) = storage.chunks("s")
    binding = storage.chunk_storage.inner
    return os.path.join(binding.root, chunk_relpath(chunk.name))


def _segment(storage: ChunkedSegmentStorage) -> str:
    storage.create("s")
    storage.write(storage.open_write("s"), 0, DATA)
    return _chunk_path(storage)


@pytest.mark.parametrize(("offset", "length"), [(0, 6 * MiB), (100, 5 * MiB), (BLOCK + 1, 2 * MiB + 7)])
def test_a_large_verified_read_returns_the_bytes_written(storage, offset: int, length: int) -> None:
    _segment(storage)
    data = storage.read(storage.open_read("s"), offset, length)
    assert isinstance(data, bytes) and data == DATA[offset : offset + length]
    assert "slts-checksum" in storage._pools, "the runs were checked on the pool"


def _damage(path: str, at: int) -> None:
    with open(path, "r+b") as file:
        file.seek(at)
        byte = file.read(1)
        file.seek(at)
        file.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize("bad", [[5 * MiB + 3], [MiB + 70_000, 5 * MiB + 3], [2 * BLOCK]])
def test_the_first_bad_block_in_chunk_order_is_reported(storage, bad: list[int]) -> None:
    path = _segment(storage)
    for at in bad:
        _damage(path, at)
    with pytest.raises(ChunkCorrupted) as caught:
        storage.read(storage.open_read("s"), 0, 6 * MiB)
    first = min(bad)
    assert caught.value.offset == first - first % BLOCK
    assert caught.value.__traceback__ is not None  # raised here, in the reader's thread


def test_a_chunk_shorter_than_its_blocks_is_reported(storage) -> None:
    path = _segment(storage)
    os.truncate(path, 4 * MiB + 5)
    with pytest.raises(ChunkCorrupted, match="holds"):
        storage.read(storage.open_read("s"), 0, 6 * MiB)
    assert storage.read(storage.open_read("s"), 0, 2 * MiB) == DATA[: 2 * MiB]


def test_runs_cut_the_blocks_exactly() -> None:
    from slts.storage import block_checksums

    blocks = block_checksums.compute(DATA[: 3 * MiB + 5], BLOCK)
    for first, end, size in [(0, 49, MiB), (3, 40, 1), (10, 11, 5 * MiB), (0, 49, 7 * BLOCK + 1)]:
        runs = block_checksums.runs(blocks, first, end, size)
        assert runs[0][0] == first and runs[-1][1] == end
        assert all(a[1] == b[0] and a[3] == b[2] for a, b in itertools.pairwise(runs))
        assert all(stop - start >= size for _, _, start, stop in runs[:-1])


@pytest.mark.parametrize(("remote", "requests"), [(True, 1), (False, 3)], ids=["remote", "local"])
def test_a_large_verified_read_of_a_remote_storage_is_one_request(
    monkeypatch: pytest.MonkeyPatch, remote: bool, requests: int
) -> None:
    """Runs overlap a local copy with its check; on a storage with ``high_latency_reads``
    each run would be one more request for a check that costs a fraction of one: one read."""
    from slts.bindings.faulty import FaultyChunkStorage
    from slts.bindings.memory import MemoryChunkStorage

    from slts.config import StorageConfig
    from slts.metadata.memory_store import MemoryMetadataStore
    from slts.metadata.schema import TABLES

    monkeypatch.setattr(chunked, "_CORES", 3)
    inner = MemoryChunkStorage()
    inner.high_latency_reads = remote
    counting = FaultyChunkStorage(inner, seed=1)
    config = StorageConfig(read_ahead_bytes=0, gc_interval_s=0.0)
    with ChunkedSegmentStorage(0, None, counting, MemoryMetadataStore(TABLES), config) as storage:
        storage.create("s")
        handle = storage.open_write("s")
        storage.write(handle, 0, DATA)
        before = counting.calls["read"]
        assert storage.read(handle, 0, 3 * MiB) == DATA[: 3 * MiB]
        assert counting.calls["read"] - before == requests
