"""Defrag batch runs on Spark (``slts.tools.spark_defrag``) against the in-process driver.

* ``defrag_spark``: a filesystem container of 2,000 segments x 8 small chunks (200 with
  ``--quick``), 1-16 KiB each, is built once: every chunk is written by a new owner (a
  takeover always starts a new chunk). Every repetition defragments a fresh copy of it
  (made and synced before the timer starts: the metadata copied, the chunk files
  hard-linked, since a batch only reads them and creates new ones) with ``run_batch``: the subject builds the
  chunks on Spark ``local[2]``, the baseline in process (``execute_locally(binding, 2)``).
  The Spark session is started, and its Python workers warmed up on a small batch, before
  measuring; Spark's own output goes to a log in the scratch folder. Both drivers plan,
  register and commit the same way; only where the chunks are built differs. Each run
  merges the first 7 chunks of every segment into one (the last chunk of an unsealed
  segment stays). The figure is chunks merged per second; the work line gives the
  megabytes those chunks hold, so MB/s = chunks/s x MB / chunks.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

from slts.bindings import from_url
from slts.bindings.base import ChunkStorage
from slts.tools.benchmarks.base import Benchmark, Folder, Workload

from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.schema import TABLES
from slts.storage.batch_defrag import BatchDefrag, BatchReport, Executor, execute_locally, run_batch
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.factory import open as open_storage

MASTER = "local[2]"
EXECUTOR_THREADS = 2
CHUNKS_PER_SEGMENT = 8
CHUNK_BYTES_MIN, CHUNK_BYTES_MAX = 1 << 10, 16 << 10
BUILD_THREADS = 8


def _build_fragmented(root: str, segments: int, chunks: int = CHUNKS_PER_SEGMENT) -> int:
    """The container under ``root`` (``chunks``, ``metadata``): ``segments`` segments of
    ``chunks`` chunks, one owner per round. Returns the bytes the mergeable
    chunks (all but each segment's last) hold. The metadata is written without syncs:
    the build is not measured."""
    names = [f"bench/{i:05d}" for i in range(segments)]
    lengths = dict.fromkeys(names, 0)
    mergeable = 0

    def work(owner: ChunkedSegmentStorage, round_: int, index: int) -> int:
        rng = random.Random(index * 1000 + round_)
        written = 0
        for name in names[index::BUILD_THREADS]:  # each name in one thread only
            if round_ == 0:
                owner.create(name)
            data = rng.randbytes(rng.randint(CHUNK_BYTES_MIN, CHUNK_BYTES_MAX))
            owner.write(owner.open_write(name), lengths[name], data)
            lengths[name] += len(data)
            written += len(data)
        return written

    for round_ in range(chunks):
        store = LmdbMetadataStore(os.path.join(root, "metadata"), TABLES, durable=False)
        owner = open_storage(
            f"file://{os.path.join(root, 'chunks')}",
            metadata=store,
            gc_interval_s=0.0,
            metadata_log_flush_interval_s=0.0,
        )
        try:
            with ThreadPoolExecutor(BUILD_THREADS) as pool:
                written = sum(pool.map(functools.partial(work, owner, round_), range(BUILD_THREADS)))
        finally:
            owner.close()
            store.close()  # ours: the instance leaves a store it was given open
        if round_ < chunks - 1:
            mergeable += written
    return mergeable


def _defrag(root: str, executor: Callable[[ChunkStorage], Executor]) -> tuple[float, BatchReport]:
    """Seconds ``run_batch`` took on the container under ``root``, and its report.
    ``executor(binding)``: the executor, given the driver's binding of that container."""
    with (
        from_url(f"file://{os.path.join(root, 'chunks')}") as binding,
        LmdbMetadataStore(os.path.join(root, "metadata"), TABLES) as store,
    ):
        driver = BatchDefrag(binding, store, 0)
        chosen = executor(binding)
        started = time.perf_counter()
        report = run_batch(driver, chosen)
        return time.perf_counter() - started, report


def _keep_evidence(copy: str, spark_log: str, parent: str) -> str:
    """Move a failed run's container, and a copy of Spark's log, out of the scratch folder
    into a new folder of ``parent`` (the scratch folder is removed with the benchmark);
    its path."""
    kept = tempfile.mkdtemp(prefix="defrag_spark-failed-", dir=parent)
    shutil.move(copy, os.path.join(kept, "container"))
    with contextlib.suppress(FileNotFoundError):
        shutil.copy(spark_log, kept)
    return kept


def defrag_spark(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: the batch with its chunks built on Spark ``local[2]``; baseline: the same
    batch with the in-process executor (2 threads). Chunks merged per second."""
    from slts.tools.spark_defrag import spark_quietly

    segments = 200 if quick else 2000
    merged = segments * (CHUNKS_PER_SEGMENT - 1)
    folder = Folder(parent)
    pristine = folder.sub("pristine")
    mergeable = _build_fragmented(pristine, segments)
    runs = 0

    def measured(executor: Callable[[ChunkStorage], Executor]) -> float:
        nonlocal runs
        runs += 1
        copy = os.path.join(folder.path, f"run-{runs}")
        shutil.copytree(os.path.join(pristine, "metadata"), os.path.join(copy, "metadata"))
        shutil.copytree(os.path.join(pristine, "chunks"), os.path.join(copy, "chunks"), copy_function=os.link)
        os.sync()  # the copy's writeback must not land in the defrag's fsyncs
        seconds, report = _defrag(copy, executor)
        if not (report.runs_failed == report.runs_dropped == 0 and report.runs_committed == segments):
            kept = _keep_evidence(copy, os.path.join(folder.path, "spark.log"), parent)
            raise AssertionError(f"{report}; the container and Spark's log are kept in {kept}")
        shutil.rmtree(copy, ignore_errors=True)
        assert report.chunks_before - report.chunks_after + report.runs_committed == merged, report
        assert report.bytes_native + report.bytes_copied == mergeable, (report, mergeable)
        return seconds

    try:
        with spark_quietly(os.path.join(folder.path, "spark.log"), MASTER) as spark:
            warm_up = folder.sub("warm-up")
            _build_fragmented(warm_up, 16, 3)  # a run of 2 chunks per segment
            _, warmed = _defrag(warm_up, lambda _: spark)  # Python workers started, slts imported in them
            assert warmed.runs_committed == 16, warmed
            work = (
                f"batch defrag of {segments} segments x {CHUNKS_PER_SEGMENT} chunks: {merged} chunks"
                f" ({mergeable / 1e6:.1f} MB) merged into {segments}, Spark {MASTER} vs. in process"
                f" ({EXECUTOR_THREADS} threads)"
            )
            # Spark tasks rebuild the binding from the store URL (the copy's); in process, the
            # tasks build through the driver's binding of the copy.
            yield (
                work,
                lambda: measured(lambda _: spark),
                lambda: measured(lambda binding: execute_locally(binding, EXECUTOR_THREADS)),
                float(merged),
                "chunks/s",
            )
    finally:
        folder.close()


BENCHMARKS = {
    "defrag_spark": Benchmark(
        "defrag_spark",
        "batch defrag, chunks built on Spark local[2] vs. in process: 2,000 segments x 8 chunks (200 with "
        "--quick)",
        defrag_spark,
    ),
}
