"""concat, truncate and defrag: data unchanged, layout and index right, costs bounded."""

from __future__ import annotations

import random
import threading

import pytest

from slts.admin.verify import verify_container, verify_segment
from slts.errors import (
    InvalidArgument,
    InvalidOffset,
    SegmentNotFound,
    SegmentNotSealed,
    SegmentSealed,
    SegmentTruncated,
)
from slts.storage import layout_changes
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.defrag import plan_runs, read_list
from tests.support.engine import PAIRS, TRANSFORM_PAIRS, Env, env_fixture, segment_chunks

env = env_fixture(PAIRS + TRANSFORM_PAIRS)

from .test_bad_input import expect_unchanged


def fill(
    storage: ChunkedSegmentStorage,
    name: str,
    data: bytes,
    piece: int = 7,
    rolling: int = 16,
    seal: bool = False,
) -> None:
    storage.create(name, max_rolling_length=rolling)
    handle = storage.open_write(name)
    for offset in range(0, len(data), piece):
        storage.write(handle, offset, data[offset : offset + piece])
    if seal:
        storage.seal(handle)


def content(storage: ChunkedSegmentStorage, name: str) -> bytes:
    info = storage.info(name)
    return storage.read(storage.open_read(name), info.start_offset, info.length - info.start_offset)


def healthy(storage: ChunkedSegmentStorage) -> None:
    assert verify_container(storage).problems == []


# -- concat -----------------------------------------------------------------------------------------


def test_concat_splices_source_after_target(env: Env) -> None:
    storage = env.open(concat_merge_seam=False)
    fill(storage, "t", b"T" * 40)
    fill(storage, "s", bytes(range(50)), seal=True)
    before = storage.info("t").chunk_count + storage.info("s").chunk_count
    handle = storage.open_write("t")
    storage.concat(handle, 40, "s")
    assert not storage.exists("s")
    assert content(storage, "t") == b"T" * 40 + bytes(range(50))
    assert storage.info("t").chunk_count == before
    storage.write(handle, 90, b"after")
    assert content(storage, "t")[-5:] == b"after"
    healthy(storage)


def test_concat_into_empty_target_and_of_empty_source(env: Env) -> None:
    storage = env.open()
    storage.create("empty")
    fill(storage, "src", b"abcdefghij" * 3, seal=True)
    storage.concat(storage.open_write("empty"), 0, "src")
    assert content(storage, "empty") == b"abcdefghij" * 3
    storage.create("nothing")
    storage.seal(storage.open_write("nothing"))
    storage.concat(storage.open_write("empty"), 30, "nothing")
    assert not storage.exists("nothing") and storage.info("empty").length == 30
    healthy(storage)


def test_nested_concats_resolve_through_links(env: Env) -> None:
    storage = env.open(concat_merge_seam=False)
    rng = random.Random(3)
    parts = {name: rng.randbytes(rng.randint(1, 60)) for name in ("a", "b", "c", "d")}
    for name, data in parts.items():
        fill(storage, name, data, piece=5, rolling=8)
    for inner, outer in (("d", "c"), ("c", "b")):  # d -> c, then c (holding d) -> b
        storage.seal(storage.open_write(inner))
        storage.concat(storage.open_write(outer), storage.info(outer).length, inner)
    storage.seal(storage.open_write("b"))
    storage.concat(storage.open_write("a"), storage.info("a").length, "b")
    expected = parts["a"] + parts["b"] + parts["c"] + parts["d"]
    assert content(storage, "a") == expected
    handle = storage.open_read("a")
    for offset in range(len(expected)):
        assert storage.read(handle, offset, 1) == expected[offset : offset + 1]
    healthy(storage)


def test_concat_cost_does_not_depend_on_source_chunks(env: Env) -> None:
    storage = env.open(concat_merge_seam=False)
    fill(storage, "t", b"x" * 10, piece=10, rolling=10)
    fill(storage, "big", bytes(2000), piece=1, rolling=1, seal=True)
    assert storage.info("big").chunk_count == 2000
    before = env.store.dump()
    storage.concat(storage.open_write("t"), 10, "big")
    after = env.store.dump()
    changed = sum(
        1
        for table in after
        for key in set(before[table]) | set(after[table])
        if before[table].get(key) != after[table].get(key)
    )
    assert changed <= 4, f"concat touched {changed} records (target, source, seam chunk, one index link)"
    assert storage.read(storage.open_read("t"), 1000, 20) == bytes(20)
    healthy(storage)


def test_concat_merges_small_chunks_at_the_seam(env: Env) -> None:
    storage = env.open(defrag_small_chunk_bytes=64)
    fill(storage, "t", b"a" * 10, piece=10, rolling=100)
    fill(storage, "s", b"b" * 10, piece=10, rolling=100, seal=True)
    storage.concat(storage.open_write("t"), 10, "s")
    assert storage.info("t").chunk_count == 1
    assert content(storage, "t") == b"a" * 10 + b"b" * 10
    healthy(storage)


def test_invalid_concats_change_nothing(env: Env) -> None:
    storage = env.open()
    fill(storage, "t", b"t" * 10)
    fill(storage, "open", b"o" * 10)
    fill(storage, "sealed", b"s" * 10, seal=True)
    fill(storage, "cut", b"c" * 10)
    cut = storage.open_write("cut")
    storage.truncate(cut, 3)
    storage.seal(cut)
    fill(storage, "sealed-target", b"x", seal=True)
    target = storage.open_write("t")
    cases = [
        (SegmentNotSealed, lambda: storage.concat(target, 10, "open")),
        (InvalidOffset, lambda: storage.concat(target, 9, "sealed")),
        (InvalidOffset, lambda: storage.concat(target, -1, "sealed")),
        (InvalidArgument, lambda: storage.concat(target, 10, "t")),
        (SegmentTruncated, lambda: storage.concat(target, 10, "cut")),
        (SegmentNotFound, lambda: storage.concat(target, 10, "missing")),
        (SegmentSealed, lambda: storage.concat(storage.open_write("sealed-target"), 1, "sealed")),
        (InvalidArgument, lambda: storage.concat(storage.open_read("t"), 10, "sealed")),
    ]
    for error, call in cases:
        expect_unchanged(env, error, call)


# -- truncate -----------------------------------------------------------------------------------------


def test_truncate_moves_start_and_drops_whole_chunks(env: Env) -> None:
    storage = env.open()
    data = bytes(range(100))
    fill(storage, "t", data, piece=10, rolling=10)
    handle = storage.open_write("t")
    storage.truncate(handle, 35)
    info = storage.info("t")
    assert info.start_offset == 35 and info.chunk_count == 7
    with pytest.raises(SegmentTruncated):
        storage.read(handle, 34, 1)
    assert storage.read(handle, 35, 65) == data[35:]
    storage.truncate(handle, 20)  # below the start: no-op
    assert storage.info("t") == info
    expect_unchanged(env, InvalidOffset, lambda: storage.truncate(handle, 101))
    healthy(storage)


def test_truncate_to_the_end_then_write(env: Env) -> None:
    storage = env.open()
    fill(storage, "t", b"z" * 30, piece=10, rolling=10)
    handle = storage.open_write("t")
    storage.truncate(handle, 30)
    assert storage.info("t").chunk_count == 0 and storage.read(handle, 30, 0) == b""
    storage.write(handle, 30, b"new")
    assert storage.read(handle, 30, 3) == b"new"
    healthy(storage)


def test_truncate_sealed_and_in_bounded_batches(env: Env) -> None:
    storage = env.open(gc_batch_max=4)
    fill(storage, "t", bytes(50), piece=1, rolling=1, seal=True)
    commits = env.store.last_sequence
    storage.truncate(storage.open_write("t"), 45)
    assert env.store.last_sequence - commits == 12, "45 dropped chunks in batches of 4"
    assert storage.info("t").chunk_count == 5
    env.clock.advance(100)
    while storage.gc.run_once().progressed:
        pass
    healthy(storage)
    assert len(segment_chunks(env.binding)) == 5


def test_truncate_across_concat_links(env: Env) -> None:
    storage = env.open(concat_merge_seam=False)
    fill(storage, "t", b"A" * 20, piece=5, rolling=5)
    for i in range(3):
        fill(storage, f"s{i}", bytes([i]) * 20, piece=5, rolling=5, seal=True)
        storage.concat(storage.open_write("t"), storage.info("t").length, f"s{i}")
    handle = storage.open_write("t")
    expected = b"A" * 20 + bytes(20) + bytes([1]) * 20 + bytes([2]) * 20
    for cut in (7, 25, 40, 61, 79):
        storage.truncate(handle, cut)
        assert content(storage, "t") == expected[cut:]
        healthy(storage)


# -- defrag -------------------------------------------------------------------------------------------


def fragmented(storage: ChunkedSegmentStorage, name: str, parts: int, part_bytes: int, rolling: int) -> bytes:
    """A sealed segment made of ``parts`` small chunks, the way transactions make them:
    each part is its own sealed segment concatenated in (seam merging off)."""
    rng = random.Random(parts)
    storage.create(name, max_rolling_length=rolling)
    data = b""
    for i in range(parts):
        part = rng.randbytes(part_bytes)
        fill(storage, f"{name}.txn{i}", part, piece=part_bytes, rolling=rolling, seal=True)
        storage.concat(storage.open_write(name), len(data), f"{name}.txn{i}")
        data += part
    storage.seal(storage.open_write(name))
    return data


def test_defrag_merges_small_runs_and_keeps_bytes(env: Env) -> None:
    storage = env.open(defrag_small_chunk_bytes=32, defrag_run_bytes_max=100, concat_merge_seam=False)
    data = fragmented(storage, "f", 25, 20, rolling=1000)
    assert storage.info("f").chunk_count == 25
    result = storage.defrag("f")
    assert result.runs_committed == result.runs_planned > 0 and result.runs_dropped == 0
    assert result.chunks_after == storage.info("f").chunk_count == 5
    assert result.bytes_native + result.bytes_copied == sum(chunk.stored for _, chunk in storage.chunks("f"))
    assert all(chunk.length == 100 for _, chunk in storage.chunks("f"))
    if not env.binding.supports_concat:
        assert result.bytes_native == 0
    assert content(storage, "f") == data
    assert all(chunk.checksum is not None for _, chunk in storage.chunks("f"))
    healthy(storage)
    assert storage.defrag("f").runs_planned == 0, "a second defrag finds nothing to do"
    env.clock.advance(100)
    while storage.gc.run_once().progressed:
        pass
    assert len(segment_chunks(env.binding)) == 5
    healthy(storage)


def test_defrag_leaves_the_active_last_chunk_alone(env: Env) -> None:
    storage = env.open(defrag_small_chunk_bytes=32)
    fill(storage, "w", bytes(40), piece=4, rolling=4)
    last = storage.info("w")
    storage.defrag("w")
    chunks = storage.chunks("w")
    assert chunks[-1][1].length == 4 and chunks[-1][0] == last.length - 4
    handle = storage.open_write("w")
    storage.write(handle, 40, b"more")
    assert content(storage, "w") == bytes(40) + b"more"
    healthy(storage)


def test_defrag_after_concats_and_truncate(env: Env) -> None:
    storage = env.open(concat_merge_seam=False, defrag_small_chunk_bytes=64)
    rng = random.Random(9)
    expected = bytearray()
    fill(storage, "t", (part := rng.randbytes(30)), piece=3, rolling=3)
    expected += part
    for i in range(4):
        part = rng.randbytes(rng.randint(5, 25))
        fill(storage, f"x{i}", part, piece=2, rolling=2, seal=True)
        storage.concat(storage.open_write("t"), len(expected), f"x{i}")
        expected += part
    handle = storage.open_write("t")
    storage.truncate(handle, 13)
    storage.seal(handle)
    result = storage.defrag("t")
    assert result.chunks_after < result.chunks_before
    assert content(storage, "t") == bytes(expected[13:])
    for offset in range(13, len(expected)):
        assert storage.read(handle, offset, 1)[0] == expected[offset]
    healthy(storage)


def test_reads_during_defrag_return_the_right_bytes(env: Env) -> None:
    storage = env.open(defrag_small_chunk_bytes=64, read_parallel_bytes_min=16, concat_merge_seam=False)
    data = fragmented(storage, "r", 100, 20, rolling=200)
    handle = storage.open_read("r")
    stop = threading.Event()
    wrong: list[int] = []

    def reader() -> None:
        rng = random.Random(12)
        while not stop.is_set():
            offset = rng.randrange(len(data))
            length = rng.randint(0, len(data) - offset)
            if storage.read(handle, offset, length) != data[offset : offset + length]:
                wrong.append(offset)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        result = storage.defrag("r")
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert result.runs_committed > 0 and wrong == []


def test_a_run_that_changed_meanwhile_is_dropped_and_collected(env: Env) -> None:
    storage = env.open(defrag_small_chunk_bytes=64, concat_merge_seam=False)
    data = fragmented(storage, "c", 10, 6, rolling=100)
    record, _ = storage.context.load("c")
    with env.store.snapshot() as view:
        runs = list(plan_runs(record, read_list(view, record), storage.config))
    storage.truncate(storage.open_write("c"), 30)  # drops the planned run's first chunks
    assert layout_changes._apply_run(storage.context, runs[0], None, None) is None
    assert content(storage, "c") == data[30:]
    env.clock.advance(100)
    while storage.gc.run_once().progressed:
        pass
    healthy(storage)
    assert verify_segment(storage, "c") == []
