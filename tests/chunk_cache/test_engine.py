"""The chunk cache under the engine (``slts.open``'s wrapping, read-ahead's prefetch).

* ``slts.open`` wraps a binding with remote reads when ``chunk_cache_bytes`` > 0, and
  ignores the setting (a log line says why) on local ones; bad settings are refused;
* a sequential reader's read-ahead reads the next chunk through the cache, so the cache
  holds it before the reader asks: the prefetch of the next chunk;
* a second instance (a restart) re-reads a segment from the cache: no read reaches the
  binding; reads equal what was written, also after truncate and delete of the segment.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from slts.bindings.base import ChunkHandle
from slts.bindings.chunk_cache import CachedChunkStorage
from slts.bindings.faulty import FaultyChunkStorage

import slts
from slts.config import StorageConfig
from slts.errors import InvalidConfig
from slts.metadata.memory_store import MemoryMetadataStore
from slts.metadata.schema import TABLES
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.factory import with_chunk_cache
from tests.support.chunk_cache import RemoteMemoryChunkStorage

KiB = 1 << 10
CHUNK = 256 * KiB
PART = 64 * KiB


def settings(folder: Path, **extra: object) -> StorageConfig:
    values: dict[str, object] = {
        "gc_interval_s": 0.0,
        "metadata_log_flush_interval_s": 0.0,
        "usage_flush_interval_s": 0.0,
        "journal": False,
        "chunk_cache_dir": str(folder),
        "chunk_cache_bytes": 32 << 20,
        "chunk_cache_block_bytes": PART,
        "chunk_cache_fill_bytes_max": 32 << 20,  # no fill dropped, however slow the machine
        "read_ahead_bytes": 2 * PART,
        "read_ahead_part_bytes": PART,
        **extra,
    }
    return StorageConfig(**values)  # type: ignore[arg-type]


def test_bad_settings_are_refused() -> None:
    with pytest.raises(InvalidConfig, match="needs chunk_cache_dir"):
        StorageConfig(chunk_cache_bytes=1 << 30)
    with pytest.raises(InvalidConfig, match="at least two blocks"):
        StorageConfig(chunk_cache_dir="/tmp/x", chunk_cache_bytes=8 << 20)
    with pytest.raises(InvalidConfig, match="chunk_cache_fill_bytes_max"):
        StorageConfig(chunk_cache_dir="/tmp/x", chunk_cache_bytes=1 << 30, chunk_cache_fill_bytes_max=1 << 20)
    with pytest.raises(InvalidConfig, match="without NUL"):
        StorageConfig(chunk_cache_dir="a\x00b")
    assert StorageConfig.from_mapping(
        {}, env={"SLTS_CHUNK_CACHE_DIR": "/var/cache/slts"}
    ).chunk_cache_dir == ("/var/cache/slts")


def test_only_bindings_with_remote_reads_are_cached(tmp_path: Path, caplog) -> None:
    config = settings(tmp_path / "cache")
    local = RemoteMemoryChunkStorage("memory://local")
    local.high_latency_reads = False
    with caplog.at_level(logging.INFO, logger="slts.storage"):
        assert with_chunk_cache(local, config) is local
    assert "chunk cache off for memory://local" in caplog.text
    remote = with_chunk_cache(RemoteMemoryChunkStorage("memory://remote"), config)
    assert isinstance(remote, CachedChunkStorage) and remote.high_latency_reads
    remote.close()
    assert with_chunk_cache(local, StorageConfig()) is local  # off by default
    with slts.open(
        "memory://factory-cache", chunk_cache_dir=str(tmp_path / "c2"), chunk_cache_bytes=1 << 30
    ) as s:
        assert not isinstance(s.chunk_storage.inner, CachedChunkStorage)  # memory: local reads


def write_segment(binding, config: StorageConfig, chunks: int) -> bytes:
    data = os.urandom(chunks * CHUNK)
    store = MemoryMetadataStore(TABLES)
    with ChunkedSegmentStorage(0, None, binding, store, config) as writer:
        writer.create("s", max_rolling_length=CHUNK)
        handle = writer.open_write("s")
        for offset in range(0, len(data), CHUNK):
            writer.write(handle, offset, data[offset : offset + CHUNK])
    return data, store


def cached_segment(
    folder: Path, url: str, seed: int, chunks: int, **extra: object
) -> tuple[FaultyChunkStorage, StorageConfig, bytes, MemoryMetadataStore, CachedChunkStorage]:
    """A segment of ``chunks`` chunks written on a counting remote memory binding at
    ``url``, and that binding read through a chunk cache in ``folder/cache`` (``settings``
    with ``extra``): (the counting binding, the settings, the data, the store, the cached
    binding)."""
    counting = FaultyChunkStorage(RemoteMemoryChunkStorage(url), seed=seed)
    config = settings(folder / "cache", **extra)
    data, store = write_segment(counting, config, chunks=chunks)
    binding = with_chunk_cache(counting, config)
    assert isinstance(binding, CachedChunkStorage)
    return counting, config, data, store, binding


def test_read_ahead_of_a_sequential_reader_prefetches_the_next_chunk_into_the_cache(tmp_path) -> None:
    counting, config, data, store, binding = cached_segment(tmp_path, "memory://prefetch", 3, 3)
    with ChunkedSegmentStorage(0, None, binding, store, config, read_only=True) as reader:
        handle = reader.open_read("s")
        chunks = [chunk.name for _, chunk in reader.chunks("s")]
        # Two sequential reads inside chunk 0 start a stream: read-ahead plans
        # 2 parts past the second read, i.e. the rest of chunk 0 and the start of chunk 1.
        read = CHUNK - PART - 16 * KiB
        assert reader.read(handle, 0, 16 * KiB) == data[: 16 * KiB]
        assert reader.read(handle, 16 * KiB, read) == data[16 * KiB : 16 * KiB + read]
        assert reader.read_ahead_statistics().parts >= 1
        # Wait for the part of chunk 1 (closing the reader would cancel it if the machine
        # is slow to fetch it): taking it from read-ahead sends no read of the reader's own.
        assert reader._read_ahead.take(chunks[1], 0, PART) == data[CHUNK : CHUNK + PART]
    binding.cache.drain()
    next_chunk = binding.cache.key_of(binding.url, chunks[1])
    held = [file for file in binding.cache.index.files() if file.key == next_chunk]
    assert held and held[0].start == 0  # chunk 1's first part: never asked for by the reader
    with ChunkedSegmentStorage(0, None, binding, store, config, read_only=True) as again:
        # (Its start read the store's identity object: a read clipped at its end, which
        # the cache never serves. From here on only segment reads.)
        before = counting.calls["read"]
        assert again.read(again.open_read("s"), CHUNK, held[0].length) == data[CHUNK : CHUNK + held[0].length]
        assert counting.calls["read"] == before
    binding.close()


def test_a_restarted_reader_re_reads_from_the_cache_exactly(tmp_path) -> None:
    counting, config, data, store, binding = cached_segment(
        tmp_path, "memory://reread", 4, 4, read_ahead_bytes=0
    )
    with ChunkedSegmentStorage(0, None, binding, store, config, read_only=True) as first:
        assert first.read(first.open_read("s"), 0, len(data)) == data
    binding.cache.drain()
    with ChunkedSegmentStorage(0, None, binding, store, config, read_only=True) as second:
        handle = second.open_read("s")
        reads = counting.calls["read"]
        for offset in range(0, len(data), 100 * KiB):
            length = min(100 * KiB, len(data) - offset)
            assert second.read(handle, offset, length) == data[offset : offset + length]
        assert counting.calls["read"] == reads
    statistics = binding.chunk_cache_statistics()
    assert statistics.hits > 0 and statistics.corruptions == 0
    binding.close()


def test_segment_changes_under_a_cached_reader_read_exactly(tmp_path) -> None:
    """Truncate, delete and re-create, GC and defrag under an owner whose binding is
    cached: every read equals the model (chunk names are never reused, GC's deletes go
    through the cache)."""
    config = settings(tmp_path / "cache", gc_delay_s=0.0, concat_merge_seam=False)
    binding = with_chunk_cache(RemoteMemoryChunkStorage("memory://changes"), config)
    with ChunkedSegmentStorage(0, None, binding, MemoryMetadataStore(TABLES), config) as owner:
        model = os.urandom(3 * CHUNK)
        owner.create("s", max_rolling_length=CHUNK // 4)
        handle = owner.open_write("s")
        for offset in range(0, len(model), CHUNK // 2):
            owner.write(handle, offset, model[offset : offset + CHUNK // 2])
        assert owner.read(handle, 0, len(model)) == model
        owner.truncate(handle, CHUNK)
        owner.gc.run_once()
        assert owner.read(handle, CHUNK, 2 * CHUNK) == model[CHUNK:]
        owner.seal(handle)
        owner.defrag("s")
        owner.gc.run_once()
        assert owner.read(owner.open_read("s"), CHUNK, 2 * CHUNK) == model[CHUNK:]
        owner.delete(owner.open_write("s"))
        owner.gc.run_once()
        owner.create("s")
        again = os.urandom(CHUNK)
        owner.write(owner.open_write("s"), 0, again)
        assert owner.read(owner.open_read("s"), 0, CHUNK) == again
        assert isinstance(binding, CachedChunkStorage)
        binding.cache.drain()
        live = {binding.cache.key_of(binding.url, name) for name in binding.inner.list("")}
        assert {file.key for file in binding.cache.index.files()} <= live  # deleted chunks left


def test_the_cache_s_counters_are_exported_as_metrics(tmp_path) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from slts.metrics import SltsCollector

    config = settings(tmp_path / "cache", read_ahead_bytes=0)
    binding = with_chunk_cache(RemoteMemoryChunkStorage("memory://metrics"), config)
    assert isinstance(binding, CachedChunkStorage)
    with ChunkedSegmentStorage(0, None, binding, MemoryMetadataStore(TABLES), config) as storage:
        storage.create("s")
        storage.write(storage.open_write("s"), 0, b"x" * 1000)
        storage.read(storage.open_read("s"), 0, 1000)
        binding.cache.drain()
        storage.read(storage.open_read("s"), 0, 1000)
        storage.read(storage.open_read("s"), 0, 1000)  # used again: protected (index, invariant 4)
        protected = binding.chunk_cache_statistics().protected_bytes
        registry = CollectorRegistry()
        registry.register(SltsCollector(storage))
        text = generate_latest(registry).decode()
    assert 'slts_chunk_cache_hits_total{container="0"} 2.0' in text
    assert protected > 1000
    assert f'slts_chunk_cache_protected_bytes{{container="0"}} {float(protected)}' in text
    assert 'slts_chunk_cache_corruptions_total{container="0"} 0.0' in text
    assert 'slts_chunk_cache_capacity_bytes{container="0"} 3.3554432e+07' in text


def test_read_ahead_leaves_out_what_the_cache_holds(tmp_path) -> None:
    """A re-read of cached chunks reads them from the cache when asked for: read-ahead
    fetches no part of them (parts would read the same files one more time), and passes
    over each held part once (a stream that re-planned the held window at every read
    cost a warm re-read a third of its speed)."""
    counting, config, data, store, binding = cached_segment(tmp_path, "memory://ahead-held", 5, 3)
    with ChunkedSegmentStorage(0, None, binding, store, config, read_only=True) as first:
        handle = first.open_read("s")
        for offset in range(0, len(data), 64 * KiB):
            assert first.read(handle, offset, 64 * KiB) == data[offset : offset + 64 * KiB]
    binding.cache.drain()
    with ChunkedSegmentStorage(0, None, binding, store, config, read_only=True) as again:
        handle = again.open_read("s")
        names = [chunk.name for _, chunk in again.chunks("s")]
        assert all(binding.holds(name, 0, CHUNK) for name in names)
        reads = counting.calls["read"]
        for offset in range(0, len(data), 64 * KiB):
            assert again.read(handle, offset, 64 * KiB) == data[offset : offset + 64 * KiB]
        statistics = again.read_ahead_statistics()
        assert statistics is not None and statistics.parts == 0, "nothing read ahead"
        assert counting.calls["read"] == reads, "every read served by the cache"
        # Reads of held bytes skip read-ahead (no plan, no part); a part planned by the
        # reads that resolved the layout is passed over once, never planned again.
        assert statistics.local_parts <= len(data) // PART - 2, statistics
    binding.close()


def _damage(binding: CachedChunkStorage, chunk: str, at: int) -> str:
    """Flip bytes of the cache file holding chunk offset ``at``; its path."""
    key = binding.cache.key_of(binding.url, chunk)
    victim = next(f for f in binding.cache.index.files() if f.key == key and f.start <= at < f.end)
    with open(victim.path, "r+b") as file:
        file.seek(at - victim.start)
        byte = file.read(1)
        file.seek(at - victim.start)
        file.write(bytes([byte[0] ^ 0x5A]))
    return victim.path


@pytest.mark.parametrize("parallel_from", [None, 64 * KiB])
def test_a_cached_copy_failing_the_engines_checksums_is_dropped_and_read_from_the_storage(
    tmp_path, monkeypatch, parallel_from
) -> None:
    """One check per byte: the engine's block checksums verify bytes the cache serves
    unchecked (``caller_checked_hits``); a cache file they fail is dropped and the read
    returns the chunk storage's bytes (in one run, and in parallel runs)."""
    import slts.storage.chunked as chunked

    if parallel_from is not None:
        monkeypatch.setattr(chunked, "OVERLAPPED_HELD_BYTES_MIN", parallel_from)
    counting, config, data, store, binding = cached_segment(
        tmp_path, "memory://one-pass", 6, 2, read_ahead_bytes=0
    )
    with ChunkedSegmentStorage(0, None, binding, store, config, read_only=True) as reader:
        handle = reader.open_read("s")
        assert reader.read(handle, 0, len(data)) == data
        binding.cache.drain()
        names = [chunk.name for _, chunk in reader.chunks("s")]
        assert all(binding.holds(name, 0, CHUNK) for name in names)
        reads = counting.calls["read"]
        assert reader.read(handle, 0, len(data)) == data
        assert counting.calls["read"] == reads, "served by the cache"
        statistics = binding.chunk_cache_statistics()
        assert statistics.caller_checked_hits == statistics.hits > 0
        damaged = _damage(binding, names[1], CHUNK - 100)
        assert reader.read(handle, 0, len(data)) == data
        assert counting.calls["read"] > reads, "the damaged part read again from the storage"
        assert not os.path.exists(damaged)
        assert binding.chunk_cache_statistics().corruptions == 1
        # The read from the storage filled the block again, with the storage's bytes.
        binding.cache.drain()
        reads = counting.calls["read"]
        assert reader.read(handle, 0, len(data)) == data
        assert counting.calls["read"] == reads and binding.chunk_cache_statistics().corruptions == 1
    binding.close()


def test_without_block_checksums_the_cache_checks_what_it_serves(tmp_path) -> None:
    """A read the engine does not verify (``verify_checksums_on_read`` off) is served by
    the cache's own CRC32C: a damaged file is dropped by the cache itself, never served."""
    _counting, config, data, store, binding = cached_segment(
        tmp_path, "memory://own-check", 8, 2, read_ahead_bytes=0, verify_checksums_on_read=False
    )
    with ChunkedSegmentStorage(0, None, binding, store, config, read_only=True) as reader:
        handle = reader.open_read("s")
        assert reader.read(handle, 0, len(data)) == data
        binding.cache.drain()
        name = reader.chunks("s")[0][1].name
        damaged = _damage(binding, name, 1000)
        assert reader.read(handle, 0, CHUNK) == data[:CHUNK]
        statistics = binding.chunk_cache_statistics()
        assert statistics.caller_checked_hits == 0 and statistics.corruptions == 1
        assert not os.path.exists(damaged)
    binding.close()


def _blocks_of(data: bytes, block: int) -> bytes:
    import struct

    import crc32c

    return b"".join(
        struct.pack(">II", len(data[at : at + block]), crc32c.crc32c(data[at : at + block]))
        for at in range(0, len(data), block)
    )


def test_a_held_read_answers_only_for_bytes_the_cache_holds_and_counts_no_miss(tmp_path) -> None:
    """``read_held_into_checked``: the bytes and their count where the cache holds them
    all (a hit); None, and no miss counted, where it does not or its copy fails (then
    dropped); the binding's storage is never read by it."""
    from slts.bindings.base import ChunkHandle

    from slts.errors import InvalidArgument

    counting, config, data, store, binding = cached_segment(
        tmp_path, "memory://held", 9, 2, read_ahead_bytes=0
    )
    with ChunkedSegmentStorage(0, None, binding, store, config, read_only=True) as reader:
        name = reader.chunks("s")[0][1].name
        handle = ChunkHandle(name, True)
        chunk = data[:CHUNK]
        blocks = _blocks_of(chunk[:PART], 4 * KiB)
        view = memoryview(bytearray(PART))
        reads, misses = counting.calls["read"], binding.chunk_cache_statistics().misses
        assert binding.read_held_into_checked(handle, 0, view, blocks) is None, "nothing held yet"
        assert counting.calls["read"] == reads, "a held read never reads the storage"
        assert binding.chunk_cache_statistics().misses == misses
        reader.read(reader.open_read("s"), 0, CHUNK)  # a miss: fills the cache
        binding.cache.drain()
        before = binding.chunk_cache_statistics()
        assert binding.read_held_into_checked(handle, 0, view, blocks) == PART
        assert view == chunk[:PART]
        after = binding.chunk_cache_statistics()
        assert (after.hits, after.caller_checked_hits) == (before.hits + 1, before.caller_checked_hits + 1)
        wrong = _blocks_of(chunk[:PART], 4 * KiB)[:-4] + b"\x00\x00\x00\x00"
        assert binding.read_held_into_checked(handle, 0, view, wrong) is None, "a failed check is no answer"
        assert binding.chunk_cache_statistics().corruptions == before.corruptions + 1
        assert binding.read_held_into_checked(handle, 0, view, blocks) is None, "the copy was dropped"
        assert binding.chunk_cache_statistics().misses == before.misses
        with pytest.raises(InvalidArgument, match="pairs"):
            binding.read_held_into_checked(handle, 0, view, blocks[:-8])
        with pytest.raises(InvalidArgument, match="writable"):
            binding.read_held_into_checked(handle, 0, memoryview(bytes(PART)), blocks)
    binding.close()


def test_bindings_without_local_copies_hold_nothing(tmp_path) -> None:
    from slts.bindings.base import ChunkHandle

    plain = RemoteMemoryChunkStorage("memory://plain")
    plain.create("c")
    plain.write(ChunkHandle("c", False), 0, b"abcd")
    view = memoryview(bytearray(4))
    assert plain.read_held_into_checked(ChunkHandle("c", True), 0, view, _blocks_of(b"abcd", 4)) is None
    assert bytes(view) == b"\x00" * 4


def test_a_reader_of_held_bytes_asks_the_binding_once_a_read(tmp_path) -> None:
    """The read path's one question: a read of bytes the cache holds is one held read,
    metered once as a read by the gate, with no ``holds`` and no second lookup."""
    _counting, config, data, store, binding = cached_segment(
        tmp_path, "memory://once", 10, 2, read_ahead_bytes=0
    )
    asked = {"held": 0, "holds": 0}
    held, holds = binding._do_read_held_into_checked, binding._do_holds

    def count_held(*args):
        asked["held"] += 1
        return held(*args)

    def count_holds(*args):
        asked["holds"] += 1
        return holds(*args)

    binding._do_read_held_into_checked = count_held  # type: ignore[method-assign]
    binding._do_holds = count_holds  # type: ignore[method-assign]
    with ChunkedSegmentStorage(0, None, binding, store, config, read_only=True) as reader:
        handle = reader.open_read("s")
        assert reader.read(handle, 0, len(data)) == data
        binding.cache.drain()
        asked.update(held=0, holds=0)
        meter = reader.chunk_storage.meter
        calls = sum(meter.timings()["read"].buckets)
        for at in range(0, len(data), PART):
            assert reader.read(handle, at, PART) == data[at : at + PART]
        assert asked == {"held": len(data) // PART, "holds": 0}
        assert sum(meter.timings()["read"].buckets) == calls + len(data) // PART, "each metered once"
    binding.close()


def test_verify_checks_the_durable_copy_on_the_storage_not_in_the_cache(tmp_path) -> None:
    """``slts verify``'s check of the metadata's durable copy reads the chunk storage
    (``around_caches``): it neither reads nor fills the cache, and a copy damaged on the
    storage is reported while the cache holds it intact."""
    from slts.journal.system_names import system_prefix

    from slts.admin.verify import verify_container

    remote = RemoteMemoryChunkStorage("memory://verify-copy")
    config = settings(tmp_path / "cache", journal=True)
    binding = with_chunk_cache(remote, config)
    assert isinstance(binding, CachedChunkStorage)
    with ChunkedSegmentStorage(0, None, binding, MemoryMetadataStore(TABLES), config) as storage:
        storage.create("s")
        storage.write(storage.open_write("s"), 0, os.urandom(3 * KiB))
        assert storage.durable is not None
        storage.durable.flush()
        cache = binding.cache
        cache.drain()  # fills of the engine's own reads so far (background threads) ended
        untouched = cache.statistics()
        assert verify_container(storage).problems == []
        cache.drain()
        touched = cache.statistics()
        assert (touched.hits, touched.misses, touched.fills) == (
            untouched.hits,
            untouched.misses,
            untouched.fills,
        ), "the check reads the storage, not through the cache"

        # Every system chunk read through the cache (now it holds them), then each one's
        # bytes damaged on the storage itself, under the cache's nose.
        system = sorted(remote.list(system_prefix(storage.container_id)))
        assert system
        for name in system:
            length = remote.get_info(name).length
            binding.read(ChunkHandle(name, True), 0, length)
        cache.drain()
        before = cache.statistics()
        assert before.fills >= len(system)
        for name in system:
            damaged = remote._chunks[name].data  # bytes changed behind the cache
            for index in range(0, len(damaged), 7):
                damaged[index] ^= 0xFF

        problems = verify_container(storage).problems
        assert problems, "a durable copy damaged on the storage must be reported"
        after = cache.statistics()
        assert (after.hits, after.misses, after.fills) == (before.hits, before.misses, before.fills)


def test_around_caches_takes_the_cache_out_and_keeps_every_other_wrapper(tmp_path) -> None:
    """A binding without a cache is its own ``around_caches``; a gate over a cache over a
    fault injector becomes the same gate (its meter) over the same fault injector."""
    from slts.storage.gate import GatedChunkStorage
    from slts.usage import UsageMeter

    plain = RemoteMemoryChunkStorage("memory://around")
    faulty = FaultyChunkStorage(plain, seed=1)
    assert plain.around_caches() is plain and faulty.around_caches() is faulty
    cached_binding = with_chunk_cache(faulty, settings(tmp_path / "cache"))
    assert isinstance(cached_binding, CachedChunkStorage)
    meter = UsageMeter()
    gate = GatedChunkStorage(cached_binding, meter)
    around = gate.around_caches()
    assert isinstance(around, GatedChunkStorage) and around is not gate
    assert around.inner is faulty and around.meter is meter
    assert not around.holds_locally and gate.holds_locally and gate.inner is cached_binding
    faulty.create("c", b"bytes")
    assert around.read(ChunkHandle("c", True), 0, 5) == b"bytes"
    assert cached_binding.cache.statistics().misses == 0, "read around the cache"
    gate.close()
