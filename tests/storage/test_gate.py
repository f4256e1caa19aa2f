"""The limiter in the one place every chunk storage call passes through: each kind of work
is counted in its traffic class (tail writes, reads, defrag, GC, offload), a limited class
is paced (a fake clock shows the waits) while the others are not, and a bad limiter is
refused before anything is written. On the filesystem binding and on S3."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable

import pytest
from slts.tools.simulation.seam import FakeClock

from slts.config import StorageConfig
from slts.errors import InvalidArgument
from slts.limiter import Limit, PriorityLimiter, TrafficClass, traffic_class
from slts.offload.ledgers import MemoryLedger
from slts.offload.offloader import LedgerOffloader
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.gate import GatedChunkStorage
from tests.support.engine import Env, env_fixture

env = env_fixture([("filesystem", "lmdb"), ("s3", "lmdb")])
CONFIG = StorageConfig(
    gc_delay_s=0.0, gc_interval_s=0.0, metadata_log_flush_interval_s=0.0, concat_merge_seam=False
)


def start(env: Env, limiter: PriorityLimiter) -> ChunkedSegmentStorage:
    storage = ChunkedSegmentStorage(0, None, env.binding, env.store, CONFIG, limiter=limiter)
    env.instances.append(storage)
    return storage


def small_chunks(storage: ChunkedSegmentStorage, name: str, count: int, size: int) -> None:
    """Segment ``name`` of ``count`` chunks of ``size`` bytes (concats of one-write segments)."""
    storage.create(name)
    for i in range(count):
        part = f"{name}-part-{i}"
        storage.create(part)
        storage.write(storage.open_write(part), 0, bytes([i]) * size)
        storage.seal(storage.open_write(part))
        storage.concat(storage.open_write(name), i * size, part)


def counted(limiter: PriorityLimiter) -> dict[TrafficClass, tuple[int, int]]:
    return {kind: (s.bytes, s.requests) for kind, s in limiter.stats().items()}


def grew(before: dict, after: dict) -> dict[TrafficClass, tuple[int, int]]:
    return {
        kind: (after[kind][0] - before[kind][0], after[kind][1] - before[kind][1])
        for kind in TrafficClass
        if after[kind] != before[kind]
    }


def test_every_kind_of_work_is_counted_in_its_class(env: Env) -> None:
    limiter = PriorityLimiter()
    storage = start(env, limiter)
    assert isinstance(storage.chunk_storage, GatedChunkStorage)
    before = counted(limiter)
    small_chunks(storage, "s", 8, 1000)
    wrote = grew(before, counted(limiter))
    assert set(wrote) == {TrafficClass.TAIL_WRITE} and wrote[TrafficClass.TAIL_WRITE][0] >= 8000

    before = counted(limiter)
    assert storage.read(storage.open_read("s"), 0, 8000)[4000:4001] == bytes([4])
    read = grew(before, counted(limiter))
    assert set(read) == {TrafficClass.READ} and read[TrafficClass.READ][0] >= 8000

    before = counted(limiter)
    meter = storage.chunk_storage.meter
    received = meter.usage().get(TrafficClass.SCRUB)
    with traffic_class(TrafficClass.SCRUB):
        view = storage.read_view(storage.open_read("s"), 1000, 1000)  # one chunk: a view of the binding's
    assert view == bytes([1]) * 1000
    viewed = grew(before, counted(limiter))
    assert set(viewed) == {TrafficClass.SCRUB} and viewed[TrafficClass.SCRUB] == (1000, 1), "paid as a read"
    scrubbed = meter.usage()[TrafficClass.SCRUB].bytes_received - (received.bytes_received if received else 0)
    assert scrubbed == 1000, "metered as received bytes"

    before = counted(limiter)
    result = storage.defrag("s")
    assert result.runs_committed >= 1
    defrag = grew(before, counted(limiter))
    assert defrag[TrafficClass.DEFRAG][0] >= result.bytes_native + result.bytes_copied > 0
    assert set(defrag) <= {TrafficClass.DEFRAG, TrafficClass.TAIL_WRITE}, "its commit may flush the journal"

    storage.delete(storage.open_write("s"))
    before = counted(limiter)
    while storage.gc.run_once().progressed:
        pass
    gc = grew(before, counted(limiter))
    assert gc[TrafficClass.GC][1] >= result.chunks_after, "every chunk delete is a GC request"
    assert TrafficClass.TAIL_WRITE not in gc or gc[TrafficClass.TAIL_WRITE][0] < gc[TrafficClass.GC][1] * 4096

    before = counted(limiter)
    record = LedgerOffloader(storage, max_block_bytes=8192).offload(
        MemoryLedger(1, [b"e" * 500] * 40), uuid.uuid4()
    )
    offload = grew(before, counted(limiter))
    assert offload[TrafficClass.OFFLOAD][0] >= record.data_length


def test_a_read_across_chunks_in_parallel_keeps_its_caller_s_class(env: Env) -> None:
    """A read large enough to fetch its chunks on the read pool's threads is paid and
    counted in the class of the caller that asked (scrub here), not as a foreground read."""
    limiter = PriorityLimiter()
    config = dataclasses.replace(CONFIG, read_parallel_bytes_min=1024)
    storage = ChunkedSegmentStorage(0, None, env.binding, env.store, config, limiter=limiter)
    env.instances.append(storage)
    small_chunks(storage, "s", 8, 1000)
    fetched_on: set[str] = set()
    fetch_stored = storage._fetch_stored

    def spying(piece, mapped=False):  # type: ignore[no-untyped-def]
        fetched_on.add(threading.current_thread().name)
        return fetch_stored(piece, mapped)

    storage._fetch_stored = spying  # type: ignore[method-assign]
    before = counted(limiter)
    with traffic_class(TrafficClass.SCRUB):
        data = storage.read(storage.open_read("s"), 0, 8000)
    assert data == b"".join(bytes([i]) * 1000 for i in range(8))
    assert all(name.startswith("slts-read") for name in fetched_on), fetched_on  # the pool's threads
    read = grew(before, counted(limiter))
    assert set(read) == {TrafficClass.SCRUB} and read[TrafficClass.SCRUB] == (8000, 8)


def test_a_limited_class_waits_and_the_others_do_not(env: Env) -> None:
    clock = FakeClock(0.0)
    rate = 10_000  # bytes per second of defrag
    limiter = PriorityLimiter(
        {TrafficClass.DEFRAG: Limit(bytes_per_s=rate)}, clock=clock, sleep=clock.advance
    )
    storage = start(env, limiter)
    small_chunks(storage, "s", 20, 1000)
    assert clock.now == 0.0, "tail writes are not limited"
    result = storage.defrag("s")
    moved = limiter.stats()[TrafficClass.DEFRAG].bytes
    assert (
        moved >= result.bytes_native + result.bytes_copied > 0 and result.chunks_after < result.chunks_before
    )
    assert clock.now == pytest.approx(moved / rate, rel=0.01), "defrag waited for every byte it moved"
    assert limiter.stats()[TrafficClass.DEFRAG].seconds_throttled == pytest.approx(clock.now, rel=0.01)
    assert storage.read(storage.open_read("s"), 0, 20_000) == b"".join(bytes([i]) * 1000 for i in range(20))


def test_a_bad_limiter_is_refused_before_anything_is_written(env: Env) -> None:
    before = env.snapshot()
    with pytest.raises(InvalidArgument, match="PriorityLimiter"):
        ChunkedSegmentStorage(0, None, env.binding, env.store, CONFIG, limiter=Limit())  # type: ignore[arg-type]
    assert env.snapshot() == before


def test_tail_writes_beside_a_limited_defrag_and_scrub(env: Env) -> None:
    """The issue's scene in real time: tail writes while a defrag and a scrub run with limits
    set. The background classes stay within their limits over the whole run (the limiter's
    accounting against the wall clock: rate x elapsed + one burst + one request), both do
    work, and every tail write lands. The throughput the tail keeps is measured by
    ``slts bench limiter_tail`` next to its same-run baseline (no timing asserts here)."""
    from slts.admin.scrub import scrub

    rate = 2_000_000
    storage = start(env, PriorityLimiter())  # fodder written unthrottled
    for i in range(6):
        small_chunks(storage, f"fodder{i}", 8, 64 << 10)
    storage.close()
    limits = {TrafficClass.DEFRAG: Limit(bytes_per_s=rate), TrafficClass.SCRUB: Limit(bytes_per_s=rate)}
    began = time.monotonic()
    limiter = PriorityLimiter(limits)
    storage = start(env, limiter)
    done = threading.Event()
    background_errors: list[BaseException] = []

    def background(work: Callable[[], object]) -> None:
        try:
            while not done.is_set():
                work()
        except BaseException as exc:  # reported by the test thread
            background_errors.append(exc)

    fodder = [f"fodder{i}" for i in range(6)]

    def defrag_next() -> None:
        if fodder:
            storage.defrag(fodder.pop())
        else:
            done.wait(0.05)  # nothing left to merge: idle until the tail is done

    threads = [
        threading.Thread(target=background, args=(defrag_next,)),
        threading.Thread(target=background, args=(lambda: scrub(storage, prefix="fodder"),)),
    ]
    for thread in threads:
        thread.start()
    try:
        storage.create("tail")
        handle = storage.open_write("tail")
        for i in range(200):
            storage.write(handle, i * 4096, bytes([i % 256]) * 4096)
    finally:
        done.set()
        for thread in threads:
            thread.join()
    elapsed = time.monotonic() - began
    assert background_errors == []
    assert storage.read(storage.open_read("tail"), 0, 200 * 4096) == b"".join(
        bytes([i % 256]) * 4096 for i in range(200)
    )
    stats = limiter.stats()
    largest_request = 8 * (64 << 10)  # a defrag run of a whole fodder segment
    for kind in (TrafficClass.DEFRAG, TrafficClass.SCRUB):
        assert 0 < stats[kind].bytes <= rate * elapsed + rate * limiter.burst_s + largest_request, kind
    assert stats[TrafficClass.TAIL_WRITE].seconds_throttled == 0
