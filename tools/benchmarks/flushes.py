"""A stream engine's tier-2 workload: flushes of many segments by several flusher threads.

Under a stream engine, tier-2 writes are flushes: a container's flusher threads move
what its segments gathered in tier-1 (64 KiB to a few MiB each) to long-term storage, and
each flush is durable when it returns. ``write_flush_mix`` measures that workload against
the same appends and ``fdatasync``s to plain files; ``write_flush_mix_2p`` runs it in two
processes (two containers on one chunk storage, each its own metadata) against one.

Both sides write a steady state: the segments (files) exist and hold a first flush
before the timer starts, so the figures are appends, as a long-running flusher's are.
Each segment belongs to one flusher thread (a segment's flushes apply in order), and a
thread flushes its segments in a seeded random order with sizes drawn log-uniformly from
[64 KiB, 4 MiB].
"""

from __future__ import annotations

import math
import multiprocessing
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection

from slts.tools.benchmarks.base import Benchmark, Folder, Workload, run_together

from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.factory import open as open_storage

SEGMENTS = 256
THREADS = 8
FLUSH_BYTES_MIN = 64 << 10
FLUSH_BYTES_MAX = 4 << 20

#: One flush: (segment number, bytes).
Plan = list[tuple[int, int]]


def flush_plan(seed: int, segments: Sequence[int], total_bytes: int) -> Plan:
    """Flushes adding up to about ``total_bytes`` over ``segments``, sizes log-uniform in
    [FLUSH_BYTES_MIN, FLUSH_BYTES_MAX], segments in a seeded random order."""
    rng = random.Random(seed)
    low, high = math.log(FLUSH_BYTES_MIN), math.log(FLUSH_BYTES_MAX)
    plan: Plan = []
    written = 0
    while written < total_bytes:
        size = int(math.exp(rng.uniform(low, high)))
        plan.append((rng.choice(segments), size))
        written += size
    return plan


def _by_thread(plan: Plan, threads: int) -> list[Plan]:
    """Each segment's flushes go to one thread (segment number modulo ``threads``)."""
    parts: list[Plan] = [[] for _ in range(threads)]
    for segment, size in plan:
        parts[segment % threads].append((segment, size))
    return parts


def _run_threads(parts: list[Plan], flush: Callable[[int, int], None]) -> float:
    """Run each part in its own thread, released together; seconds until all end."""

    def work(i: int) -> None:
        for segment, size in parts[i]:
            flush(segment, size)

    return run_together(len(parts), work)


class SltsFlusher:
    """``THREADS`` flusher threads writing to ``segments`` of one container."""

    def __init__(self, storage: ChunkedSegmentStorage, segments: Sequence[int], payload: bytes) -> None:
        self.storage = storage
        self.payload = memoryview(payload)
        self.handles = {}
        self.lengths = {}
        for number in segments:
            name = f"flush/{number}"
            if not storage.exists(name):
                storage.create(name)
            handle = storage.open_write(name)
            storage.write(handle, storage.info(name).length, self.payload[:FLUSH_BYTES_MIN])
            self.handles[number] = handle
            self.lengths[number] = storage.info(name).length

    def flush(self, segment: int, size: int) -> None:
        """One durable flush of ``size`` bytes to ``segment``."""
        self.storage.write(self.handles[segment], self.lengths[segment], self.payload[:size])
        self.lengths[segment] += size

    def run(self, plan: Plan) -> float:
        return _run_threads(_by_thread(plan, THREADS), self.flush)


class RawFlusher:
    """The baseline: ``THREADS`` threads appending and ``fdatasync``-ing to one file per
    segment."""

    def __init__(self, folder: str, segments: Sequence[int], payload: bytes) -> None:
        self.payload = memoryview(payload)
        self.fds = {}
        for number in segments:
            fd = os.open(os.path.join(folder, f"f{number}"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.write(fd, self.payload[:FLUSH_BYTES_MIN])
            os.fsync(fd)
            self.fds[number] = fd

    def flush(self, segment: int, size: int) -> None:
        fd = self.fds[segment]
        view = self.payload[:size]
        while view:
            view = view[os.write(fd, view) :]
        os.fdatasync(fd)

    def run(self, plan: Plan) -> float:
        return _run_threads(_by_thread(plan, THREADS), self.flush)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)


def _total_bytes(quick: bool) -> int:
    return (32 if quick else 256) << 20


def flush_mix(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: 8 flusher threads over 256 segments of one container; baseline: 8 threads
    appending + ``fdatasync``-ing the same sizes to 256 files."""
    total = _total_bytes(quick)
    payload = os.urandom(FLUSH_BYTES_MAX)
    folder = Folder(parent)
    storage = open_storage(
        f"file://{folder.sub('chunks')}", metadata=folder.sub("metadata"), gc_interval_s=0.0
    )
    segments = range(SEGMENTS)
    try:
        slts_flusher = SltsFlusher(storage, segments, payload)
        raw = RawFlusher(folder.sub("raw"), segments, payload)
        os.sync()
        plans = iter(range(1, 1 << 30))
        state = {"plan": flush_plan(0, segments, total)}

        def subject() -> float:
            state["plan"] = flush_plan(next(plans), segments, total)
            return slts_flusher.run(state["plan"])

        def baseline() -> float:
            return raw.run(state["plan"])  # the subject's flushes, to the files

        try:
            yield (
                f"{THREADS} threads flushing ~{total >> 20} MiB over {SEGMENTS} segments "
                f"({FLUSH_BYTES_MIN >> 10} KiB-{FLUSH_BYTES_MAX >> 20} MiB each, durable) vs. "
                f"the same appends + fdatasync to {SEGMENTS} files",
                subject,
                baseline,
                total / 1e6,
                "MB/s",
            )
        finally:
            raw.close()
    finally:
        storage.close()
        folder.close()


def _process_flusher(
    connection: Connection, store: str, metadata: str, container: int, segments: list[int]
) -> None:
    """A flusher process: one container on ``store``; runs each plan it is sent and
    answers with the seconds it took, until it is sent None."""
    storage = open_storage(store, metadata=metadata, container_id=container, gc_interval_s=0.0)
    try:
        flusher = SltsFlusher(storage, segments, os.urandom(FLUSH_BYTES_MAX))
        connection.send("ready")
        while (plan := connection.recv()) is not None:
            connection.send(flusher.run(plan))
    finally:
        storage.close()
        connection.close()


class _Processes:
    """``count`` flusher processes sharing ``SEGMENTS`` segments between them."""

    def __init__(self, folder: Folder, count: int, tag: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.connections: list[Connection] = []
        self.processes = []
        self.segments = [list(range(SEGMENTS))[i::count] for i in range(count)]
        store = f"file://{folder.sub('chunks')}"
        for i in range(count):
            mine, theirs = context.Pipe()
            process = context.Process(
                target=_process_flusher,
                args=(
                    theirs,
                    store,
                    folder.sub(f"metadata-{tag}-{i}"),
                    i if tag == "pair" else 2,
                    self.segments[i],
                ),
                daemon=True,
            )
            process.start()
            self.connections.append(mine)
            self.processes.append(process)
        for connection in self.connections:
            assert connection.recv() == "ready"

    def run(self, seed: int, total: int) -> float:
        plans = [
            flush_plan(seed * 100 + i, mine, total // len(self.segments))
            for i, mine in enumerate(self.segments)
        ]
        started = time.perf_counter()
        for connection, plan in zip(self.connections, plans, strict=True):
            connection.send(plan)
        for connection in self.connections:
            connection.recv()
        return time.perf_counter() - started

    def close(self) -> None:
        for connection in self.connections:
            connection.send(None)
        for process in self.processes:
            process.join(60)
            if process.is_alive():
                process.kill()


def flush_mix_processes(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: two containers in two processes (8 flusher threads each, 128 segments
    each) on one chunk storage; baseline: one container in one process (8 threads, 256
    segments). The same bytes in all."""
    total = _total_bytes(quick)
    folder = Folder(parent)
    pair = single = None
    try:
        pair = _Processes(folder, 2, "pair")
        single = _Processes(folder, 1, "single")
        os.sync()
        seeds = iter(range(1, 1 << 30))
        yield (
            f"2 processes (2 containers, {THREADS} flusher threads each) flushing ~{total >> 20} MiB "
            f"over {SEGMENTS} segments vs. 1 process doing the same",
            lambda: pair.run(next(seeds), total),
            lambda: single.run(next(seeds), total),
            total / 1e6,
            "MB/s",
        )
    finally:
        for group in (pair, single):
            if group is not None:
                group.close()
        folder.close()


BENCHMARKS = {
    "write_flush_mix": Benchmark(
        "write_flush_mix",
        "8 flusher threads, 256 segments, 64 KiB-4 MiB durable flushes vs. raw appends + fdatasync",
        flush_mix,
    ),
    "write_flush_mix_2p": Benchmark(
        "write_flush_mix_2p",
        "the flush mix in 2 processes (2 containers) vs. 1 process",
        flush_mix_processes,
    ),
}
