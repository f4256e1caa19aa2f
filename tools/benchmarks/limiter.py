"""The priority limiter under load: tail writes beside a limited defrag and scrub, against
the same tail writes alone."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator

from slts.tools.benchmarks.base import Benchmark, Folder, Workload, timed_segment_writes

from slts.admin.scrub import scrub
from slts.limiter import Limit, PriorityLimiter, TrafficClass
from slts.storage.chunked import ChunkedSegmentStorage

DEFRAG_BYTES_PER_S = 10_000_000
SCRUB_BYTES_PER_S = 5_000_000  # HDFS scans 1 MB/s per volume by default
FODDER_CHUNKS = 64
FODDER_CHUNK_BYTES = 64 << 10


def _fodder(storage: ChunkedSegmentStorage, name: str) -> None:
    """Segment ``name`` of ``FODDER_CHUNKS`` small chunks for defrag to merge."""
    storage.create(name)
    target = storage.open_write(name)
    for i in range(FODDER_CHUNKS):
        part = f"{name}.{i}"
        storage.create(part)
        storage.write(storage.open_write(part), 0, os.urandom(FODDER_CHUNK_BYTES))
        storage.seal(storage.open_write(part))
        storage.concat(target, i * FODDER_CHUNK_BYTES, part)


class _Background:
    """A defrag thread (over the fodder segments, as fast as its class lets it) and a scrub
    thread (every fodder segment, over and over) until ``stop``; the bytes each moved per
    second of the run, kept for the report."""

    def __init__(self, storage: ChunkedSegmentStorage, fodder: list[str]) -> None:
        self.storage = storage
        self.fodder = fodder
        self.rates: dict[str, list[float]] = {"defrag": [], "scrub": []}
        self.starved = 0  # runs during which defrag ran out of segments to merge

    def run_beside(self, work: Callable[[], float]) -> float:
        stop = threading.Event()

        def defrag() -> None:
            began, moved = time.perf_counter(), 0
            while not stop.is_set() and self.fodder:
                result = self.storage.defrag(self.fodder.pop())
                moved += result.bytes_native + result.bytes_copied
            self.rates["defrag"].append(moved / (time.perf_counter() - began))
            self.starved += not self.fodder

        def scrubbing() -> None:
            began, moved = time.perf_counter(), 0
            while not stop.is_set():
                moved += scrub(self.storage, prefix="fodder/", max_chunks=16).bytes_read
            self.rates["scrub"].append(moved / (time.perf_counter() - began))

        threads = [threading.Thread(target=defrag), threading.Thread(target=scrubbing)]
        for thread in threads:
            thread.start()
        try:
            return work()
        finally:
            stop.set()
            for thread in threads:
                thread.join()

    def report(self, label: str) -> str:
        parts = []
        for name, rates in self.rates.items():
            if rates:
                parts.append(f"{name} {sorted(rates)[len(rates) // 2] / 1e6:.1f} MB/s (median)")
        return f"{label}: " + ", ".join(parts) + f"; defrag out of segments in {self.starved} run(s)"


def tail_beside_defrag(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: durable 4 KiB tail writes to one segment while one thread defrags segments
    of 64 x 64 KiB chunks and another scrubs them, each as fast as its limit lets it
    (DEFRAG 10 MB/s, SCRUB 20 MB/s). Baseline: the same tail writes with nothing beside
    them, same store. Reported beside: the background's rates against their limits, and
    the tail writes once beside the same background without limits (why there is a
    limiter)."""
    count = 300 if quick else 2000
    payload = os.urandom(4096)
    folder = Folder(parent)
    limiter = PriorityLimiter(
        {
            TrafficClass.DEFRAG: Limit(bytes_per_s=DEFRAG_BYTES_PER_S),
            TrafficClass.SCRUB: Limit(bytes_per_s=SCRUB_BYTES_PER_S),
        }
    )
    storage = folder.store("store", limiter=limiter, concat_merge_seam=False)
    fodder = [f"fodder/{i}" for i in range(4 if quick else 64)]
    for name in fodder:
        _fodder(storage, name)
    limited = _Background(storage, fodder)
    runs = 0

    def tail() -> float:
        nonlocal runs
        runs += 1
        return timed_segment_writes(storage, f"tail/{runs}", payload, count)

    def subject() -> float:
        return limited.run_beside(tail)

    try:
        yield (
            f"{count} durable 4 KiB tail writes beside a defrag (limited to"
            f" {DEFRAG_BYTES_PER_S // 10**6} MB/s) and a scrub ({SCRUB_BYTES_PER_S // 10**6} MB/s)"
            " vs. the same writes alone",
            subject,
            tail,
            float(count),
            "writes/s",
        )
    finally:
        storage.close()
        print(
            "  limiter_tail: "
            + limited.report(
                f"limits {DEFRAG_BYTES_PER_S / 1e6:.0f} and {SCRUB_BYTES_PER_S / 1e6:.0f} MB/s plus a"
                " burst per run"
            ),
            file=sys.stderr,
        )
        _unlimited_once(folder, fodder, payload, count)
        folder.close()


def _unlimited_once(folder: Folder, fodder: list[str], payload: bytes, count: int) -> None:
    """The tail writes once alone and once beside the same background without a limiter."""
    storage = folder.store("store")
    try:
        alone = timed_segment_writes(storage, "tail/unlimited-alone", payload, count)
        background = _Background(storage, fodder)
        beside = background.run_beside(
            lambda: timed_segment_writes(storage, "tail/unlimited-beside", payload, count)
        )
        print(
            f"  limiter_tail: without limits the tail writes kept {alone / beside:.2f} of alone"
            f" ({count / beside:.0f} vs {count / alone:.0f} writes/s, one run); "
            + background.report("background"),
            file=sys.stderr,
        )
    finally:
        storage.close()


BENCHMARKS = {
    "limiter_tail": Benchmark(
        "limiter_tail",
        "4 KiB tail writes beside a limited defrag and scrub vs. alone (the priority limiter)",
        tail_beside_defrag,
    )
}
