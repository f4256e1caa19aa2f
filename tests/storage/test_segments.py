"""Metadata-only operations: create, exists, info, list, seal/unseal, delete, re-create."""

from __future__ import annotations

import threading

import pytest

from slts.errors import InvalidOffset, SegmentExists, SegmentSealed
from slts.storage.chunked import ChunkedSegmentStorage
from tests.support.engine import Env, segment_chunks


def test_create_info_exists(storage: ChunkedSegmentStorage) -> None:
    info = storage.create("scope/stream/0", max_rolling_length=1234)
    assert (info.length, info.start_offset, info.chunk_count, info.sealed) == (0, 0, 0, False)
    assert info.max_rolling_length == 1234 and info.owner_epoch == storage.epoch
    assert storage.exists("scope/stream/0") and not storage.exists("scope/stream/1")
    assert storage.info("scope/stream/0") == info


def test_names_with_unicode_and_spaces(storage: ChunkedSegmentStorage) -> None:
    for name in ("strom/ü-ß", "with space/x", "a%2F/b", "日本/語"):
        storage.create(name)
        handle = storage.open_write(name)
        storage.write(handle, 0, name.encode())
        assert storage.read(handle, 0, len(name.encode())) == name.encode()


def test_list_is_sorted_and_paged(storage: ChunkedSegmentStorage) -> None:
    names = [f"p/{i:05d}" for i in range(2500)]
    for name in reversed(names):
        storage.create(name)
    storage.create("q")
    assert list(storage.list("p/")) == names
    assert list(storage.list()) == [*names, "q"]
    assert list(storage.list("p/0249")) == [f"p/0249{i}" for i in range(10)]


def test_seal_and_unseal(storage: ChunkedSegmentStorage) -> None:
    storage.create("s")
    handle = storage.open_write("s")
    storage.write(handle, 0, b"ab")
    storage.seal(handle)
    storage.seal(handle)
    assert storage.info("s").sealed
    with pytest.raises(SegmentSealed):
        storage.write(handle, 2, b"c")
    assert storage.read(handle, 0, 2) == b"ab"
    storage.unseal(handle)
    storage.write(handle, 2, b"c")
    assert storage.read(handle, 0, 3) == b"abc"


def test_delete_frees_the_name_and_gc_collects_old_chunks(env: Env) -> None:
    storage = env.open()
    storage.create("d", max_rolling_length=3)
    handle = storage.open_write("d")
    storage.write(handle, 0, b"old-bytes")
    old_chunks = [chunk.name for _, chunk in storage.chunks("d")]
    storage.delete(handle)
    storage.create("d")
    handle = storage.open_write("d")
    storage.write(handle, 0, b"new")
    assert storage.read(handle, 0, 3) == b"new"
    assert storage.gc.run_once().chunks_deleted == 0, "GC must wait gc_delay_s"
    assert all(env.binding.exists(name) for name in old_chunks)
    env.clock.advance(11)
    stats = storage.gc.run_once()
    assert stats.chunks_deleted == len(old_chunks) and stats.tombstones_finished == 1
    assert not any(env.binding.exists(name) for name in old_chunks)
    assert storage.read(handle, 0, 3) == b"new"
    dump = env.store.dump()
    assert dump["deleted"] == {}
    assert set(dump["chunks"]) == {chunk.name.encode() for _, chunk in storage.chunks("d")}


def test_gc_of_a_large_deleted_segment_runs_in_bounded_batches(env: Env) -> None:
    storage = env.open(gc_batch_max=7)
    storage.create("many", max_rolling_length=1)
    handle = storage.open_write("many")
    storage.write(handle, 0, bytes(30))
    storage.delete(handle)
    env.clock.advance(11)
    runs = []
    while env.store.dump()["deleted"]:
        runs.append(storage.gc.run_once().chunks_deleted)
        assert len(runs) < 10
    assert runs == [7, 7, 7, 7, 2]
    assert segment_chunks(env.binding) == []
    assert env.store.dump()["chunks"] == {} and env.store.dump()["index"] == {}


def test_concurrent_creates_of_one_name_one_wins(storage: ChunkedSegmentStorage) -> None:
    outcomes: list[str] = []
    lock = threading.Lock()

    def create() -> None:
        try:
            storage.create("race")
            result = "created"
        except SegmentExists:
            result = "exists"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["created"] + ["exists"] * 7


def test_concurrent_writers_on_many_segments(env: Env) -> None:
    storage = env.open()
    names = [f"c/{i}" for i in range(8)]
    for name in names:
        storage.create(name, max_rolling_length=50)

    def writer(name: str) -> None:
        handle = storage.open_write(name)
        for i in range(40):
            storage.write(handle, i * 7, f"{name[-1]}{i:05d}|".encode())

    threads = [threading.Thread(target=writer, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name in names:
        expected = b"".join(f"{name[-1]}{i:05d}|".encode() for i in range(40))
        assert storage.read(storage.open_read(name), 0, len(expected)) == expected


def test_concurrent_writers_on_one_segment_serialize_by_offset(storage: ChunkedSegmentStorage) -> None:
    storage.create("one")
    handle = storage.open_write("one")
    wins: list[int] = []
    lock = threading.Lock()

    def writer(tag: int) -> None:
        try:
            storage.write(handle, 0, bytes([tag]) * 5)
        except InvalidOffset:
            return
        with lock:
            wins.append(tag)

    threads = [threading.Thread(target=writer, args=(tag,)) for tag in range(1, 9)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(wins) == 1
    assert storage.read(handle, 0, 5) == bytes([wins[0]]) * 5


def test_background_gc_collects_and_stops_when_fenced(env: Env) -> None:
    old = env.open(gc_delay_s=0.0)
    old.create("bg", max_rolling_length=2)
    handle = old.open_write("bg")
    old.write(handle, 0, b"abcdef")
    old.delete(handle)
    old.gc.start(0.001)
    thread = old.gc._thread
    assert thread is not None and thread.is_alive()
    env.open()  # a newer epoch: the old collector's next pass is fenced and it stops
    thread.join(timeout=60)
    assert not thread.is_alive(), "a fenced collector must stop by itself"
    old.gc.stop()
    old.gc.stop()
