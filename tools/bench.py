"""``slts bench``: each figure next to its physical baseline, measured in the same run.

A benchmark is a pair of workloads doing the same amount of the same work: the SLTS
operation (*subject*) and its *baseline* (the raw binding or LMDB operation that is the
physical limit). Repetitions alternate subject and baseline so that drift in the
machine hits both alike; the report gives median, min and max of each and the ratio of
the medians (subject / baseline, 1.0 = as fast as the raw limit).

Each benchmark is measured on a settled machine (``settle``): once its setup is done and
before its first repetition, the dirty pages that earlier benchmarks and the setup left
are written back (``sync``) and the interpreter's garbage is collected, so a figure does
not carry the kernel's writeback or a collection of what ran before it. A benchmark leaves
no live state behind either (its ``memory://`` stores are discarded after it): a heap
grown by earlier benchmarks slows the allocating work of later ones (``restore_100k``
lost about a fifth of its rate beside the 500,000 chunks the concat benchmarks left).
So a full run measures what ``--only`` measures.

The benchmarks: the basic ones here (durable writes of 4 KiB and 1 MiB, concat of 10,
1,000 and 100,000 chunks and the LMDB floor under the last, in-process defrag) and the
suites of ``slts.tools.benchmarks`` (concurrency, reads, metadata, journal, Spark defrag,
and S3 against an ``s3://`` store).
An unknown name given to ``--only`` is refused with the list of names; docs/benchmarks.md
has the last full run.

The report, its text table and its JSON are in ``slts.tools.bench_report``; each figure's
goal is in ``slts.tools.benchmarks.goals``; ``slts.tools.bench_html`` draws a report as one
page.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
import traceback
from collections.abc import Callable, Iterator, Sequence

from slts.bindings import discard_memory, memory_urls
from slts.tools.bench_report import TABLE_HEADER, Failure, Report, run_context, table_failure, table_row
from slts.tools.benchmarks import goals
from slts.tools.benchmarks.base import (
    Benchmark,
    Figure,
    Folder,
    Workload,
    durable_writes,
)

from slts.errors import InvalidArgument
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.factory import open as open_storage


def _concat(
    parent: str, quick: bool, source_chunks: int, against_chunks: int | None = None
) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: one concat of a sealed source of ``source_chunks`` chunks (metadata only,
    durable LMDB). Baseline: one raw durable LMDB transaction writing as many records as
    that concat's commit (4); with ``against_chunks``, a concat of a source of that many
    chunks into another target of the same store instead, so the figure says what the
    source's size costs a concat, both sides timed alike, alternated, on one LMDB file."""
    import lmdb

    folder = Folder(parent)
    storage: ChunkedSegmentStorage = open_storage(
        "memory://bench-concat-" + os.path.basename(folder.path),
        metadata=folder.sub("metadata"),
        concat_merge_seam=False,
        gc_interval_s=0.0,
    )
    for target in ("target", "small-target"):
        storage.create(target)
        storage.write(storage.open_write(target), 0, b"t")
    raw = lmdb.open(folder.sub("raw"), map_size=1 << 30)
    runs = 0

    def concat_of(chunks: int, target: str) -> float:
        nonlocal runs
        runs += 1
        source = f"source/{runs}"
        storage.create(source, max_rolling_length=1)  # a write of N bytes makes N chunks
        handle = storage.open_write(source)
        for offset in range(0, chunks, 10_000):
            storage.write(handle, offset, bytes(min(10_000, chunks - offset)))
        storage.seal(storage.open_write(source))
        if storage.durable is not None:  # the set-up's backlog ships now, not beside the timed concat
            storage.durable.flush()
        target_handle = storage.open_write(target)
        started = time.perf_counter()
        storage.concat(target_handle, storage.info(target).length, source)
        return time.perf_counter() - started

    def raw_commit() -> float:
        started = time.perf_counter()
        with raw.begin(write=True) as txn:
            for i in range(4):
                txn.put(b"key-%d-%d" % (runs, i), b"v" * 200)
        return time.perf_counter() - started

    if against_chunks is None:
        work, baseline = "a raw durable 4-record LMDB commit", raw_commit
    else:
        work = f"a concat of a {against_chunks}-chunk source into another target of the same store"

        def baseline() -> float:
            return concat_of(against_chunks, "small-target")

    try:
        yield (
            f"concat of a {source_chunks}-chunk source vs. {work}",
            lambda: concat_of(source_chunks, "target"),
            baseline,
            1.0,
            "ops/s",
        )
    finally:
        storage.close()
        raw.close()
        folder.close()


def _concat_floor(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """The floor under ``concat_100k``, in raw LMDB: a durable 4-record commit (what a
    concat commits) right after the transactions that wrote a source of 100,000 chunks
    (10,000 with ``--quick``), against the same commit right after a 10-chunk source's.
    The source is written as the engine writes it: 10,000 chunks a transaction, each a
    chunk record under a unique name and an index entry. Only the commit is timed. The
    first commit after large transactions pays for them, whatever it writes (one small
    commit in between takes the whole difference away; LMDB's reclaiming of the pages they
    freed, its free list, is the likely cause): that is what a concat pays for its
    source's size although its own work does not depend on it."""
    import lmdb

    chunks = 10_000 if quick else 100_000
    folder = Folder(parent)
    env = lmdb.open(folder.sub("lmdb"), map_size=4 << 30, max_dbs=4)
    tables = {name: env.open_db(name) for name in (b"segments", b"chunks", b"index")}
    runs = 0

    def commit_after(source_chunks: int) -> float:
        nonlocal runs
        runs += 1
        segment = os.urandom(16)
        for first in range(0, source_chunks, 10_000):
            with env.begin(write=True) as txn:
                for offset in range(first, min(first + 10_000, source_chunks)):
                    name = b"0/source/%d/E1.O%d.%s" % (runs, offset, os.urandom(16).hex().encode())
                    txn.put(name, os.urandom(120), db=tables[b"chunks"])
                    txn.put(segment + offset.to_bytes(8, "big"), name, db=tables[b"index"])
        started = time.perf_counter()
        with env.begin(write=True) as txn:
            txn.put(b"target", os.urandom(150), db=tables[b"segments"])
            txn.delete(b"source/%d" % runs, db=tables[b"segments"])
            txn.put(b"target-last-chunk", os.urandom(150), db=tables[b"chunks"])
            txn.put(b"target-link-%d" % runs, os.urandom(40), db=tables[b"index"])
        return time.perf_counter() - started

    try:
        yield (
            f"a raw durable 4-record LMDB commit after writing a {chunks}-chunk source vs. after a"
            " 10-chunk source's",
            lambda: commit_after(chunks),
            lambda: commit_after(10),
            1.0,
            "ops/s",
        )
    finally:
        env.close()
        folder.close()


def _defrag(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: in-process defrag of a segment of small chunks (filesystem: native concat
    by copy_file_range); baseline: a raw copy of the same bytes into one file + fsync."""
    chunks, chunk_bytes = (32, 64 << 10) if quick else (256, 64 << 10)
    payload = os.urandom(chunk_bytes)
    folder = Folder(parent)
    storage: ChunkedSegmentStorage = open_storage(
        f"file://{folder.sub('chunks')}",
        metadata=folder.sub("metadata"),
        concat_merge_seam=False,
        defrag_small_chunk_bytes=chunk_bytes + 1,
        gc_interval_s=0.0,
    )
    runs = 0
    sources: list[str] = []

    def subject() -> float:
        nonlocal runs, sources
        runs += 1
        name = f"fragmented/{runs}"
        storage.create(name)
        for i in range(chunks):
            part = f"{name}.part{i}"
            storage.create(part)
            storage.write(storage.open_write(part), 0, payload)
            storage.seal(storage.open_write(part))
            storage.concat(storage.open_write(name), i * chunk_bytes, part)
        storage.seal(storage.open_write(name))
        sources = [chunk.name for _, chunk in storage.chunks(name)]
        started = time.perf_counter()
        result = storage.defrag(name)
        elapsed = time.perf_counter() - started
        assert result.chunks_after < result.chunks_before, result
        return elapsed

    def baseline() -> float:
        target = os.path.join(folder.sub("raw"), f"copy-{runs}")
        started = time.perf_counter()
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for name in sources:
                handle = storage.chunk_storage.open_read(name)
                os.write(fd, storage.chunk_storage.read(handle, 0, chunk_bytes))
            os.fsync(fd)
        finally:
            os.close(fd)
        return time.perf_counter() - started

    try:
        yield (
            f"defrag of {chunks} x {chunk_bytes >> 10} KiB chunks vs. raw copy of the same bytes",
            subject,
            baseline,
            chunks * chunk_bytes / 1e6,
            "MB/s",
        )
    finally:
        storage.close()
        folder.close()


BENCHMARKS: dict[str, Benchmark] = {
    "write_4k": Benchmark(
        "write_4k",
        "4 KiB durable writes: SLTS (data fdatasync + LMDB sync commit) vs. raw append + fdatasync",
        lambda parent, quick: durable_writes(parent, quick, 4096, 200 if quick else 2000),
    ),
    "write_1m": Benchmark(
        "write_1m",
        "1 MiB durable writes (bulk ingest): SLTS vs. raw append + fdatasync",
        lambda parent, quick: durable_writes(parent, quick, 1 << 20, 16 if quick else 256),
    ),
    "concat_10": Benchmark("concat_10", "concat of a 10-chunk source", lambda p, q: _concat(p, q, 10)),
    "concat_1k": Benchmark("concat_1k", "concat of a 1,000-chunk source", lambda p, q: _concat(p, q, 1000)),
    "concat_100k": Benchmark(
        "concat_100k",
        "concat of a 100,000-chunk source (10,000 with --quick)",
        lambda p, q: _concat(p, q, 10_000 if q else 100_000, against_chunks=10),
    ),
    "concat_100k_floor": Benchmark(
        "concat_100k_floor",
        "raw LMDB: the floor under concat_100k (a commit right after a large source's writes)",
        _concat_floor,
    ),
    "defrag": Benchmark("defrag", "in-process defrag vs. raw copy of the same bytes", _defrag),
}


def measure(benchmark: Benchmark, parent: str, quick: bool, repetitions: int) -> Figure:
    """Run ``benchmark``: alternate subject and baseline ``repetitions`` times each. The
    benchmark's teardown runs before this returns or raises, and the ``memory://`` stores
    it opened are discarded then: the chunks a benchmark kept in memory do not stay live
    in the process under the benchmarks after it."""
    stores_before = set(memory_urls())
    workloads = benchmark.run(parent, quick)
    try:
        return _measure_first(benchmark, workloads, repetitions)
    finally:
        close = getattr(workloads, "close", None)  # a generator: runs its teardown now
        if close is not None:
            close()
        for url in set(memory_urls()) - stores_before:
            discard_memory(url)


def settle() -> None:
    """Write back every dirty page of the machine and collect the interpreter's garbage:
    what earlier work left (its writeback, its cycles) is not paid inside a measurement.
    Takes as long as there is to write back."""
    os.sync()
    gc.collect()


def _measure_first(
    benchmark: Benchmark,
    workloads: Iterator[tuple[str, Workload, Workload, float, str]],
    repetitions: int,
) -> Figure:
    for work, subject, baseline, amount, unit in workloads:
        settle()
        subject_rates, baseline_rates = [], []
        for _ in range(repetitions):
            if benchmark.measures == "value":
                subject_rates.append(subject())
                baseline_rates.append(baseline())
            else:
                subject_rates.append(amount / subject())
                baseline_rates.append(amount / baseline())
        subject_median = statistics.median(subject_rates)
        baseline_median = statistics.median(baseline_rates)
        pair_ratios = [s / b for s, b in zip(subject_rates, baseline_rates, strict=True)]
        return Figure(
            benchmark.name,
            unit,
            subject_median,
            min(subject_rates),
            max(subject_rates),
            baseline_median,
            min(baseline_rates),
            max(baseline_rates),
            subject_median / baseline_median,
            repetitions,
            work,
            min(pair_ratios),
            max(pair_ratios),
        )
    raise AssertionError(f"benchmark {benchmark.name} yielded no workload")


def run(
    only: Sequence[str] | None = None,
    *,
    quick: bool = False,
    directory: str | None = None,
    out: Callable[[str], None] = print,
    store: str | None = None,
) -> Report:
    """Run the selected benchmarks (all by default) and print a table; returns the figures
    and the failures. A benchmark that raises is reported as failed (its line says why)
    and the run goes on with the next one: one broken benchmark does not cost the others'
    figures. ``InvalidArgument`` (before anything runs) for an unknown name
    or a ``directory`` that is not an existing folder.

    With an ``s3://`` ``store`` the S3 benchmarks (``slts.tools.benchmarks.s3``) against
    it are available too, and are the default selection; otherwise they do not exist.
    """
    from slts.tools.benchmarks import azure, gcs, s3

    available = registry(store)
    s3_benchmarks = [name for name in available if name not in BENCHMARKS]
    names = list(only) if only else list(s3_benchmarks or BENCHMARKS)
    unknown = [name for name in names if name not in available]
    if unknown:
        hint = (
            ""
            if s3.is_s3_url(store) or gcs.is_gcs_url(store) or azure.is_azure_url(store)
            else " (the s3_* benchmarks need --store s3://..., the gcs_* ones gs://..., the azure_* ones azure://...)"
        )
        raise InvalidArgument(f"unknown benchmarks {unknown}; known: {sorted(available)}{hint}")
    parent = directory or os.getcwd()
    if not os.path.isdir(parent):
        raise InvalidArgument(f"the scratch folder {parent!r} is not an existing folder")
    repetitions = 3 if quick else 5
    report = Report([], [], run_context(quick))
    out(TABLE_HEADER)
    for name in names:
        try:
            figure = measure(available[name], parent, quick, repetitions)
        except Exception as exc:  # noqa: BLE001 - reported, and the run goes on
            failure = Failure(name, f"{type(exc).__name__}: {exc}", traceback.format_exc())
            report.failures.append(failure)
            out(table_failure(failure))
            continue
        report.figures.append(figure)
        out(table_row(figure, goals.verdict(figure, report.figures)))
    return report


def registry(store: str | None = None) -> dict[str, Benchmark]:
    """Every benchmark by name: the basic ones and the suites', and with an ``s3://``
    ``store`` the S3 benchmarks against it, with a ``gs://`` one the GCS benchmarks, with an
    ``azure://`` one the Azure benchmarks (building them sends no request)."""
    from slts.tools.benchmarks import azure, gcs, s3

    _register_suites()
    available = dict(BENCHMARKS)
    if store is not None and s3.is_s3_url(store):
        available.update(s3.benchmarks(store))
    if store is not None and gcs.is_gcs_url(store):
        available.update(gcs.benchmarks(store))
    if store is not None and azure.is_azure_url(store):
        available.update(azure.benchmarks(store))
    return available


def _register_suites() -> None:
    """Add the benchmark suites kept in ``slts.tools.benchmarks`` (imported late: they
    build on the helpers above)."""
    from slts.tools.benchmarks import SUITES

    for suite in SUITES:
        for name, benchmark in suite.items():
            BENCHMARKS.setdefault(name, benchmark)
