"""What every ``slts bench`` suite builds on: the figure and benchmark types, scratch
folders, and the two write workloads several suites share. Below ``slts.tools.bench``
(the runner) and every suite in ``slts.tools.benchmarks``, so none imports another."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from slts.limiter import PriorityLimiter
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.factory import open as open_storage

Workload = Callable[[], float]  # runs once, returns seconds spent on the measured part


@dataclass(frozen=True, slots=True)
class Figure:
    """One benchmark's result: rates in ``unit`` (higher is better). ``ratio`` is the
    subject's median over the baseline's; ``pair_ratio_min``/``pair_ratio_max`` the
    lowest and highest subject/baseline ratio of one alternated pair of repetitions (how
    far the ratio itself moved within the run: a goal line inside that range is decided
    by the run's noise). None in reports written before they were recorded."""

    name: str
    unit: str
    subject_median: float
    subject_min: float
    subject_max: float
    baseline_median: float
    baseline_min: float
    baseline_max: float
    ratio: float
    repetitions: int
    work: str
    pair_ratio_min: float | None = None
    pair_ratio_max: float | None = None


@dataclass(frozen=True, slots=True)
class Benchmark:
    """A named pair of workloads. ``run(parent, quick)`` sets them up (in a generator, so
    teardown runs after measuring) and yields (work, subject, baseline, amount, unit).

    With ``measures="rate"`` a workload returns the seconds it spent and the figure is
    ``amount / seconds`` (higher is better). With ``measures="value"`` a workload returns
    the figure itself (e.g. peak RSS in MB; lower is better)."""

    name: str
    description: str
    run: Callable[[str, bool], Iterator[tuple[str, Workload, Workload, float, str]]]
    measures: str = "rate"


class Folder:
    """A scratch folder on the disk under test, removed afterwards."""

    def __init__(self, parent: str) -> None:
        self.path = tempfile.mkdtemp(prefix="slts-bench-", dir=parent)
        self._runs = 0  # ``fresh`` folders made

    def sub(self, name: str) -> str:
        path = os.path.join(self.path, name)
        os.makedirs(path, exist_ok=True)
        return path

    def store(
        self, name: str, *, limiter: PriorityLimiter | None = None, **config: Any
    ) -> ChunkedSegmentStorage:
        """A new container in sub-folder ``name``: the embedded default (filesystem
        binding, LMDB) without background GC, with ``config`` and ``limiter``."""
        target = self.sub(name)
        settings: dict[str, Any] = {"gc_interval_s": 0.0, **config}
        return open_storage(
            f"file://{os.path.join(target, 'chunks')}",
            metadata=os.path.join(target, "metadata"),
            limiter=limiter,
            **settings,
        )

    @contextlib.contextmanager
    def fresh(self, prefix: str) -> Iterator[str]:
        """A new sub-folder (``prefix`` and a number), removed when the block ends (after
        the measured part).

        A workload that writes must leave nothing behind: the page cache of files kept
        stays allocated, so the next run's writes land in pages the kernel has not handed
        out for a while, and on a virtual machine that returns free memory to its host
        (free page reporting, as on the machine these figures come from) the first touch
        of such a page costs a fault on the host: a 64 MiB write then costs 100-200 ms of
        CPU instead of 15. Which side of a pair got such pages was luck. Removed at once,
        a run's pages serve the next run, subject and baseline alike."""
        self._runs += 1
        name = f"{prefix}-{self._runs}"
        try:
            yield self.sub(name)
        finally:
            shutil.rmtree(os.path.join(self.path, name), ignore_errors=True)

    @contextlib.contextmanager
    def fresh_store(self, prefix: str, **options: Any) -> Iterator[ChunkedSegmentStorage]:
        """``store`` in a ``fresh`` sub-folder: closed, then removed, when the block ends."""
        with self.fresh(prefix) as path, self.store(os.path.basename(path), **options) as storage:
            yield storage

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def timed_raw_chunk_write(folder: str, size: int, piece_bytes: int) -> float:
    """Seconds to write ``size`` bytes into a new chunk of a filesystem binding in
    ``folder``, in binding writes of ``piece_bytes`` (each durable, as the binding's are)."""
    from slts.bindings.filesystem import FileSystemChunkStorage

    binding = FileSystemChunkStorage(folder)
    piece = os.urandom(piece_bytes)
    try:
        started = time.perf_counter()
        handle = binding.create("data")
        for offset in range(0, size, piece_bytes):
            binding.write(handle, offset, piece[: min(piece_bytes, size - offset)])
        return time.perf_counter() - started
    finally:
        binding.close()


def timed_segment_writes(storage: ChunkedSegmentStorage, name: str, payload: bytes, count: int) -> float:
    """Create segment ``name`` and append ``payload`` ``count`` times; seconds the writes took."""
    storage.create(name)
    handle = storage.open_write(name)
    started = time.perf_counter()
    for i in range(count):
        storage.write(handle, i * len(payload), payload)
    return time.perf_counter() - started


def run_together(threads: int, work: Callable[[int], None]) -> float:
    """Run ``work(i)`` for i in range(``threads``), each in its own thread, released at
    once; the seconds until all ended. The first error of a thread is raised after all
    ended."""
    barrier = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def body(i: int) -> None:
        barrier.wait()
        try:
            work(i)
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread below
            errors.append(exc)

    workers = [threading.Thread(target=body, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    barrier.wait()
    started = time.perf_counter()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return elapsed


def durable_writes(
    parent: str, quick: bool, size: int, count: int
) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: ``count`` SLTS writes of ``size`` bytes; baseline: raw append + fdatasync."""
    payload = os.urandom(size)
    folder = Folder(parent)
    storage: ChunkedSegmentStorage = open_storage(
        f"file://{folder.sub('chunks')}", metadata=folder.sub("metadata")
    )
    runs = 0

    def subject() -> float:
        nonlocal runs
        runs += 1
        return timed_segment_writes(storage, f"bench/{runs}", payload, count)

    def baseline() -> float:
        path = os.path.join(folder.sub("raw"), f"file-{runs}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            started = time.perf_counter()
            for _ in range(count):
                view = memoryview(payload)
                while view:
                    view = view[os.write(fd, view) :]
                os.fdatasync(fd)
            return time.perf_counter() - started
        finally:
            os.close(fd)

    try:
        yield (
            f"{count} x {size} B durable writes, one segment vs. one file",
            subject,
            baseline,
            float(count),
            "writes/s",
        )
    finally:
        storage.close()
        folder.close()
