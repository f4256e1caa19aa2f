"""Bulk and concurrent durable writes against raw appends of the same bytes."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from slts.tools.benchmarks.base import Benchmark, Folder, Workload, durable_writes, run_together

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
}
