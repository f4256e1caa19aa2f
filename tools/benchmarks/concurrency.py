"""Bulk and concurrent durable writes against raw appends of the same bytes."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from slts.tools.benchmarks.base import Benchmark, Folder, Workload, durable_writes, run_together

from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.schema import CHUNKS, SEGMENTS, TABLES
from slts.metadata.store import Expect, Put
from slts.storage.factory import open as open_storage

WRITERS = 8


def _together(work: Callable[[int], None]) -> float:
    """Run ``work(i)`` in ``WRITERS`` threads released at once; seconds until all end."""
    return run_together(WRITERS, work)


def concurrent_small_writes(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: 8 threads, each durable 4 KiB writes to its own segment; baseline: 8
    threads, each append + fdatasync to its own file. Group commit shares LMDB syncs."""
    count = 100 if quick else 500
    payload = os.urandom(4096)
    folder = Folder(parent)
    storage = open_storage(
        f"file://{folder.sub('chunks')}", metadata=folder.sub("metadata"), gc_interval_s=0.0
    )
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
            f"{WRITERS} writers x {count} durable 4 KiB writes, own segment vs. own file",
            subject,
            baseline,
            float(WRITERS * count),
            "writes/s",
        )
    finally:
        storage.close()
        folder.close()


def commit_protocol_floor(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """The floor ``write_4k_x8`` stands on, measured: what its durability protocol costs
    with no engine around it. Subject: 8 threads, each per write an append + fdatasync of
    its own file (the data sync), then one conditional commit of two records, a segment's
    and a chunk's, to one ``LmdbMetadataStore`` (the group commit, its syncs shared and
    pipelined, LMDB's page flush then its meta page's: two flushes after the data's).
    Baseline: ``write_4k_x8``'s, 8 raw appenders."""
    count = 100 if quick else 500
    payload = os.urandom(4096)
    folder = Folder(parent)
    store = LmdbMetadataStore(folder.sub("metadata"), TABLES)
    runs = 0

    def appenders(tag: str, commit: bool) -> float:
        fds = [
            os.open(os.path.join(folder.sub(tag), f"f{i}"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            for i in range(WRITERS)
        ]

        def work(i: int) -> None:
            segment, chunk, version = f"{tag}/s{i}".encode(), f"{tag}/c{i}".encode(), 0
            record = os.urandom(150)  # about a segment's or a chunk's record
            for _ in range(count):
                os.write(fds[i], payload)
                os.fdatasync(fds[i])
                if commit:
                    version = store.commit(
                        [Put(SEGMENTS, segment, record), Put(CHUNKS, chunk, record)],
                        [Expect(SEGMENTS, segment, version), Expect(CHUNKS, chunk, version)],
                    )

        try:
            return _together(work)
        finally:
            for fd in fds:
                os.close(fd)

    def subject() -> float:
        nonlocal runs
        runs += 1
        return appenders(f"protocol{runs}", commit=True)

    def baseline() -> float:
        return appenders(f"raw{runs}", commit=False)

    try:
        yield (
            f"{WRITERS} threads x {count}: append + fdatasync, then a 2-record LMDB group commit, vs. "
            "8 raw appenders (write_4k_x8's durability protocol without the engine)",
            subject,
            baseline,
            float(WRITERS * count),
            "writes/s",
        )
    finally:
        store.close()
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
}
