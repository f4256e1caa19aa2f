"""Bulk and concurrent durable writes against raw appends of the same bytes."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence

from slts.bindings.batched_syncs import BatchedSyncs
from slts.tools.benchmarks.base import Benchmark, Folder, Workload, durable_writes, run_together

from slts.errors import InvalidConfig
from slts.metadata.group_commit import GroupCommitter
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.schema import CHUNKS, SEGMENTS, TABLES
from slts.metadata.store import Expect, Put
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.factory import open as open_storage

WRITERS = 8
#: What a floor does after each write's data sync: (segment key, chunk key, record).
AfterSync = Callable[[bytes, bytes, bytes], None]


def _together(work: Callable[[int], None]) -> float:
    """Run ``work(i)`` in ``WRITERS`` threads released at once; seconds until all end."""
    return run_together(WRITERS, work)


#: A file system in memory (Linux's tmpfs), where a sync costs a system call and no I/O.
MEMORY_FOLDER = "/dev/shm"


def _memory_folder() -> str:
    """``MEMORY_FOLDER``; ``InvalidConfig`` where it is missing or not writable."""
    if not os.path.isdir(MEMORY_FOLDER) or not os.access(MEMORY_FOLDER, os.W_OK):
        raise InvalidConfig(f"no writable memory file system at {MEMORY_FOLDER}")
    return MEMORY_FOLDER


def _engine(folder: Folder) -> ChunkedSegmentStorage:
    """The embedded engine (filesystem binding + LMDB) in ``folder``, GC in the background off."""
    return open_storage(f"file://{folder.sub('chunks')}", metadata=folder.sub("metadata"), gc_interval_s=0.0)


def concurrent_small_writes(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: 8 threads, each durable 4 KiB writes to its own segment; baseline: 8
    threads, each append + fdatasync to its own file. Group commit shares LMDB syncs."""
    return _small_writes(parent, quick, None, "own segment vs. own file")


def interpreter_ceiling(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """The ceiling the interpreter puts on ``write_4k_x8``, measured: its subject, the same
    engine and code, with its chunks and its LMDB file in memory (``MEMORY_FOLDER``), where
    every sync returns at once; its baseline, the same 8 raw appenders on the disk under
    test. No durability protocol, however few its flushes, lifts ``write_4k_x8`` above
    this ratio: what remains is the Python work of each write and the handing of the GIL
    between the 8 threads. ``InvalidConfig`` without a memory file system."""
    return _small_writes(parent, quick, _memory_folder(), "engine in memory vs. own file on disk")


def _small_writes(
    parent: str, quick: bool, engine_parent: str | None, what: str
) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """``write_4k_x8``'s workloads: the raw appenders in a folder under ``parent``, the
    engine in a folder under ``engine_parent`` (None: the appenders' folder)."""
    count = 100 if quick else 500
    payload = os.urandom(4096)
    folders = [Folder(parent)]
    try:
        if engine_parent is not None:
            folders.append(Folder(engine_parent))
        folder, engine_folder = folders[0], folders[-1]
        storage = _engine(engine_folder)
    except BaseException:
        for made in folders:
            made.close()
        raise
    runs = 0

    def subject() -> float:
        nonlocal runs
        runs += 1
        handles = []
        for i in range(WRITERS):
            storage.create(f"w{runs}/{i}")
            handles.append(storage.open_write(f"w{runs}/{i}"))

        def work(i: int) -> None:
            for n in range(count):
                storage.write(handles[i], n * 4096, payload)

        return _together(work)

    def baseline() -> float:
        fds = [
            os.open(
                os.path.join(folder.sub("raw"), f"f{runs}-{i}"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
            )
            for i in range(WRITERS)
        ]

        def work(i: int) -> None:
            for _ in range(count):
                os.write(fds[i], payload)
                os.fdatasync(fds[i])

        try:
            return _together(work)
        finally:
            for fd in fds:
                os.close(fd)

    try:
        yield (
            f"{WRITERS} writers x {count} durable 4 KiB writes, {what}",
            subject,
            baseline,
            float(WRITERS * count),
            "writes/s",
        )
    finally:
        storage.close()
        for made in folders:
            made.close()


def _appenders(folder: Folder, tag: str, count: int, payload: bytes, after_sync: AfterSync | None) -> float:
    """8 threads, each ``count`` times an append of ``payload`` + fdatasync of its own file
    in folder ``tag``, then ``after_sync(segment, chunk, record)`` if given (the layout's
    durability, the floors below); seconds until all end."""
    fds = [
        os.open(os.path.join(folder.sub(tag), f"f{i}"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        for i in range(WRITERS)
    ]

    def work(i: int) -> None:
        segment, chunk = f"{tag}/s{i}".encode(), f"{tag}/c{i}".encode()
        record = os.urandom(150)  # about a segment's or a chunk's record
        for _ in range(count):
            os.write(fds[i], payload)
            os.fdatasync(fds[i])
            if after_sync is not None:
                after_sync(segment, chunk, record)

    try:
        return _together(work)
    finally:
        for fd in fds:
            os.close(fd)


#: A floor's subject: (folder, tag, count, payload) -> seconds, its files in folder ``tag``.
FloorWork = Callable[[Folder, str, int, bytes], float]


def _after_appends(after_sync: AfterSync) -> FloorWork:
    """A floor's subject: ``_appenders`` (8 threads) with ``after_sync`` after each sync."""
    return lambda folder, tag, count, payload: _appenders(folder, tag, count, payload, after_sync)


def _floor(
    parent: str, quick: bool, what: str, layout: Callable[[Folder], tuple[FloorWork, Callable[[], None]]]
) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """A floor under ``write_4k_x8``: subject, the work ``layout(folder)`` returns (with
    its closer), 8 files of ``count`` 4 KiB appends made durable as it says; baseline,
    ``write_4k_x8``'s 8 raw appenders."""
    count = 100 if quick else 500
    payload = os.urandom(4096)
    folder = Folder(parent)
    try:
        work, close = layout(folder)
    except BaseException:
        folder.close()
        raise
    runs = 0

    def subject() -> float:
        nonlocal runs
        runs += 1
        return work(folder, f"floor{runs}", count, payload)

    def baseline() -> float:
        return _appenders(folder, f"raw{runs}", count, payload, None)

    try:
        yield (
            f"{WRITERS} files x {count} appends: {what}, vs. 8 raw appenders",
            subject,
            baseline,
            float(WRITERS * count),
            "writes/s",
        )
    finally:
        close()
        folder.close()


def commit_protocol_floor(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """The floor ``write_4k_x8`` stands on, measured: what its durability protocol costs
    with no engine around it. Per write, after the data sync, one conditional commit of
    two records, a segment's and a chunk's, to one ``LmdbMetadataStore`` (the group
    commit, its syncs shared and pipelined: LMDB's page flush, then the flush that
    carries its meta page; three flushes in a row with the data's)."""

    def layout(folder: Folder) -> tuple[FloorWork, Callable[[], None]]:
        store = LmdbMetadataStore(folder.sub("metadata"), TABLES)
        versions: dict[bytes, int] = {}

        def commit(segment: bytes, chunk: bytes, record: bytes) -> None:
            version = versions.get(segment, 0)
            versions[segment] = store.commit(
                [Put(SEGMENTS, segment, record), Put(CHUNKS, chunk, record)],
                [Expect(SEGMENTS, segment, version), Expect(CHUNKS, chunk, version)],
            )

        return _after_appends(commit), store.close

    return _floor(
        parent,
        quick,
        "8 threads, each sync followed by a 2-record LMDB group commit (write_4k_x8's protocol)",
        layout,
    )


def two_flush_floor(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """The least any design pays that keeps a segment's bytes and its layout in separate
    files and acknowledges a write once both are durable: the data's flush, then one
    flush of a log shared by every writer (group commit: the records of the writers
    that arrived meanwhile appended together, then one fdatasync). Two flushes in a row
    where ``write_4k_x8_floor`` has three; no engine, no index, no recovery: a floor, not
    a design."""

    def layout(folder: Folder) -> tuple[FloorWork, Callable[[], None]]:
        log = os.open(
            os.path.join(folder.sub("log"), "layout.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
        )

        def append(records: Sequence[bytes]) -> list[None]:
            os.write(log, b"".join(records))
            os.fdatasync(log)
            return [None] * len(records)

        committer: GroupCommitter[bytes, None] = GroupCommitter(append)

        def commit(segment: bytes, chunk: bytes, record: bytes) -> None:
            committer.submit(segment + chunk + record + record)

        return _after_appends(commit), lambda: os.close(log)

    return _floor(
        parent,
        quick,
        "8 threads, each sync followed by a 2-record append to one shared log + its flush",
        layout,
    )


def one_thread_floor(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """The data path's floor for a write path whose Python runs on one thread: that
    thread appends to 8 files, then issues their 8 data syncs together (Linux native AIO,
    ``batched_syncs``) and waits once, ``count`` times; baseline, ``write_4k_x8``'s 8 raw
    appenders (8 threads, each its own fdatasync). ``InvalidConfig`` without native AIO."""

    def layout(folder: Folder) -> tuple[FloorWork, Callable[[], None]]:
        syncs = BatchedSyncs(WRITERS)

        def rounds(folder: Folder, tag: str, count: int, payload: bytes) -> float:
            fds = [
                os.open(os.path.join(folder.sub(tag), f"f{i}"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                for i in range(WRITERS)
            ]
            try:
                started = time.perf_counter()
                for _ in range(count):
                    for fd in fds:
                        os.write(fd, payload)
                    failed = [error for error in syncs.sync_all(fds) if error is not None]
                    if failed:
                        raise failed[0]
                return time.perf_counter() - started
            finally:
                for fd in fds:
                    os.close(fd)

        return rounds, syncs.close

    return _floor(parent, quick, "1 thread, each round's 8 data syncs issued together (Linux AIO)", layout)


#: The pause after each write of ``interpreter_cold``'s subject: about one data sync.
PAUSE_S = 0.0003


def interpreter_cold(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """What a pause between writes costs the interpreter, measured: the CPU time one
    thread spends inside each durable 4 KiB write of the engine, its files in memory
    (``MEMORY_FOLDER``: no sync waits inside the write), when the thread sleeps
    ``PAUSE_S`` after every write (subject: as a writer that waits for its syncs does)
    vs. when it writes back to back (baseline). Microseconds of CPU per write, lower is
    better; the ratio is the price of running the write path's Python on a thread that
    has just woken. ``InvalidConfig`` without a memory file system."""
    memory = _memory_folder()
    count = 300 if quick else 3000
    payload = os.urandom(4096)
    folder = Folder(memory)
    try:
        storage = _engine(folder)
    except BaseException:
        folder.close()
        raise
    runs = 0

    def cpu_per_write(pause_s: float) -> float:
        nonlocal runs
        runs += 1
        name = f"cold{runs}"
        storage.create(name)
        handle = storage.open_write(name)
        spent = 0.0
        for n in range(count):
            started = time.thread_time()
            storage.write(handle, n * len(payload), payload)
            spent += time.thread_time() - started
            if pause_s:
                time.sleep(pause_s)
        return spent / count * 1e6

    try:
        yield (
            f"{count} durable 4 KiB writes of one thread, engine in memory: "
            f"{PAUSE_S * 1e6:.0f} us pause after each vs. back to back",
            lambda: cpu_per_write(PAUSE_S),
            lambda: cpu_per_write(0.0),
            1.0,
            "us CPU/write",
        )
    finally:
        storage.close()
        folder.close()


BENCHMARKS = {
    "write_8m": Benchmark(
        "write_8m",
        "8 MiB durable writes (bulk ingest) vs. raw append + fdatasync",
        lambda parent, quick: durable_writes(parent, quick, 8 << 20, 4 if quick else 32),
    ),
    "write_4k_x8": Benchmark(
        "write_4k_x8",
        "8 concurrent writers of 4 KiB durable writes vs. 8 raw appenders",
        concurrent_small_writes,
    ),
    "write_4k_x8_floor": Benchmark(
        "write_4k_x8_floor",
        "write_4k_x8's protocol alone: data sync + LMDB group commit, vs. 8 raw appenders",
        commit_protocol_floor,
    ),
    "write_4k_x8_ceiling": Benchmark(
        "write_4k_x8_ceiling",
        "write_4k_x8's engine with free syncs (its files in memory), vs. 8 raw appenders on disk",
        interpreter_ceiling,
    ),
    "write_4k_x8_floor_one_thread": Benchmark(
        "write_4k_x8_floor_one_thread",
        "8 appends and their data syncs issued together by one thread (Linux AIO), vs. 8 raw appenders",
        one_thread_floor,
    ),
    "write_4k_cold": Benchmark(
        "write_4k_cold",
        "CPU per engine write after a pause (a writer that waited) vs. back to back, engine in memory",
        interpreter_cold,
        measures="value",
    ),
    "write_4k_x8_floor_two_flushes": Benchmark(
        "write_4k_x8_floor_two_flushes",
        "the physical floor under write_4k_x8: data sync + one shared log flush, vs. 8 raw appenders",
        two_flush_floor,
    ),
}
