"""The priority limiter under load: tail writes beside a limited defrag, against the same
tail writes alone."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator

from slts.tools.benchmarks.base import Benchmark, Folder, Workload, timed_segment_writes

from slts.limiter import Limit, PriorityLimiter, TrafficClass
from slts.storage.chunked import ChunkedSegmentStorage

DEFRAG_BYTES_PER_S = 10_000_000
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


def tail_beside_defrag(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: durable 4 KiB tail writes to one segment while a thread defrags segments of
    64 x 64 KiB chunks as fast as the limiter lets it (DEFRAG at 10 MB/s). Baseline: the
    same tail writes with nothing beside them. Same store, same limiter."""
    count = 300 if quick else 2000
    payload = os.urandom(4096)
    folder = Folder(parent)
    limiter = PriorityLimiter({TrafficClass.DEFRAG: Limit(bytes_per_s=DEFRAG_BYTES_PER_S)})
    storage = folder.store("store", limiter=limiter, concat_merge_seam=False)
    fodder = [f"fodder/{i}" for i in range(4 if quick else 64)]
    for name in fodder:
        _fodder(storage, name)
    runs = 0
    defragged: list[float] = []
    starved = 0  # subject runs during which the background ran out of segments to defrag

    def subject() -> float:
        nonlocal runs, starved
        runs += 1
        stop = threading.Event()

        def background() -> None:
            began, moved = time.perf_counter(), 0
            while not stop.is_set() and fodder:
                result = storage.defrag(fodder.pop())
                moved += result.bytes_native + result.bytes_copied
            defragged.append(moved / (time.perf_counter() - began))

        thread = threading.Thread(target=background, name="bench-defrag")
        thread.start()
        try:
            seconds = timed_segment_writes(storage, f"tail/{runs}", payload, count)
        finally:
            stop.set()
            thread.join()
        starved += not fodder
        return seconds

    def baseline() -> float:
        nonlocal runs
        runs += 1
        return timed_segment_writes(storage, f"tail/{runs}", payload, count)

    try:
        yield (
            f"{count} durable 4 KiB tail writes beside a defrag limited to {DEFRAG_BYTES_PER_S // 10**6} MB/s"
            " vs. the same writes alone",
            subject,
            baseline,
            float(count),
            "writes/s",
        )
    finally:
        storage.close()
        folder.close()
        if defragged:
            median, most = sorted(defragged)[len(defragged) // 2] / 1e6, max(defragged) / 1e6
            print(
                f"  limiter_tail: defrag beside the tail writes moved {median:.1f} MB/s (median;"
                f" at most {most:.1f}: limit {DEFRAG_BYTES_PER_S / 1e6:.0f} plus one burst per run);"
                f" out of segments in {starved} run(s)",
                file=sys.stderr,
            )


BENCHMARKS = {
    "limiter_tail": Benchmark(
        "limiter_tail",
        "4 KiB tail writes beside a limited defrag vs. alone (the priority limiter)",
        tail_beside_defrag,
    )
}
