"""``slts demo``: the main job on the embedded default, end to end, with its figures.

Filesystem binding + LMDB in one local folder. Steps:

1. ingest: many segments, many small durable writes, from several threads;
2. failovers: new epochs take the container over one after the other (as after
   crashes), each appending small writes to every stream; a takeover starts a new
   chunk, so every stream is fragmented. The last one stays: the live owner;
3. transactions: small segments written, sealed and concatenated into the streams;
4. truncate: the older half of some streams is dropped;
5. Spark defrag: a batch on a local Spark (``local[2]``) merges the runs of small
   chunks of every stream *beside* the live owner (the batch driver fences nobody);
   the owner then keeps writing through the new layout. Spark's own output goes to
   ``spark.log`` in the demo folder;
6. verify: every segment read back and compared byte for byte with what was written,
   every invariant checked (``slts.admin.verify``), garbage collected, no leak;
7. disaster recovery: a metadata snapshot on tier-2, then the machine is "lost" (the
   LMDB folder is deleted), the metadata is restored from the chunk storage alone into
   a fresh folder, and every segment is verified byte-identical again.

Step 5 needs PySpark (``pip install 'slts[spark]'``) and a Java runtime; without them
the demo stops before it starts, saying so.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from slts.tools.demo_kafka import format_kafka, run_kafka_demo
from tqdm import tqdm

from slts.admin.verify import verify_container
from slts.cost import cost_report
from slts.errors import InvalidArgument, InvalidConfig
from slts.prices import PRICES_SOURCE, list_prices
from slts.storage.batch_defrag import BatchReport
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.factory import open as open_storage

MARKER = ".slts-demo"
THREADS = 4
WRITE_BYTES_MIN, WRITE_BYTES_MAX = 256, 4096
TXNS_PER_STREAM = 8
SEED = 20261122
#: Epochs that take the container over after the ingest; the last one stays (the live owner).
FAILOVERS = 3
SPARK_MASTER = "local[2]"
SPARK_LOG = "spark.log"


def _require_spark() -> None:
    """Raise ``InvalidConfig`` unless PySpark and a Java runtime are installed."""
    from slts.tools.spark_defrag import spark_unavailable

    missing = spark_unavailable()
    if missing is not None:
        raise InvalidConfig(f"the demo's defrag step runs on Spark. {missing}")


def _log_tail(path: str, lines: int = 20) -> str:
    try:
        with open(path, errors="replace") as log:
            return "".join(log.readlines()[-lines:])
    except OSError:
        return "(no log)"


def _prepare(folder: str) -> None:
    if os.path.exists(folder):
        if not os.path.exists(os.path.join(folder, MARKER)) and os.listdir(folder):
            raise InvalidArgument(f"{folder!r} exists and is not a demo folder; choose another --dir")
        shutil.rmtree(folder)
    os.makedirs(os.path.join(folder, "metadata"))
    with open(os.path.join(folder, MARKER), "w") as marker:
        marker.write("created by slts demo; removed and recreated by the next run\n")


def open_new_store(folder: str) -> ChunkedSegmentStorage:
    """The embedded default in a new ``folder``: chunks and LMDB metadata under it."""
    os.makedirs(os.path.join(folder, "metadata"))
    return _open(folder)


def _chunks_url(folder: str, store: str | None = None) -> str:
    """Where the demo's chunks go: ``store`` (``--store URL``), else ``chunks`` in ``folder``."""
    return store or f"file://{os.path.join(os.path.abspath(folder), 'chunks')}"


def _open(folder: str, store: str | None = None, **config: Any) -> ChunkedSegmentStorage:
    return open_storage(_chunks_url(folder, store), metadata=os.path.join(folder, "metadata"), **config)


class _Expected:
    """What each segment must hold: its bytes from offset 0 and its start offset."""

    def __init__(self) -> None:
        self.data: dict[str, bytearray] = {}
        self.start: dict[str, int] = {}

    def add(self, name: str, data: bytes) -> None:
        self.data.setdefault(name, bytearray()).extend(data)
        self.start.setdefault(name, 0)


def _parallel(names: list[str], work: Callable[[str, random.Random], None], seed: int, bar: tqdm) -> None:
    """Run ``work`` on every name, a slice of names per thread, each with its own RNG."""

    def run_slice(index: int) -> None:
        rng = random.Random(seed + index)
        for name in names[index::THREADS]:
            work(name, rng)
            bar.update(1)

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(run_slice, range(THREADS)))


def _small_writes(
    storage: ChunkedSegmentStorage, expected: _Expected, writes: int
) -> Callable[[str, random.Random], None]:
    def work(name: str, rng: random.Random) -> None:
        handle = storage.open_write(name)
        offset = storage.info(name).length
        for _ in range(writes):
            data = rng.randbytes(rng.randint(WRITE_BYTES_MIN, WRITE_BYTES_MAX))
            storage.write(handle, offset, data)
            expected.add(name, data)
            offset += len(data)

    return work


def _transactions(
    storage: ChunkedSegmentStorage, expected: _Expected, counter: list[int]
) -> Callable[[str, random.Random], None]:
    def work(name: str, rng: random.Random) -> None:
        for i in range(TXNS_PER_STREAM):
            txn = f"{name}#txn{i}"
            storage.create(txn)
            handle = storage.open_write(txn)
            data = rng.randbytes(rng.randint(WRITE_BYTES_MIN, WRITE_BYTES_MAX * 4))
            storage.write(handle, 0, data)
            storage.seal(handle)
            storage.concat(storage.open_write(name), storage.info(name).length, txn)
            expected.add(name, data)
            counter.append(1)

    return work


def _verify(storage: ChunkedSegmentStorage, expected: _Expected, bar: tqdm) -> list[str]:
    mismatched = []
    for name, data in expected.data.items():
        info = storage.info(name)
        handle = storage.open_read(name)
        start = expected.start[name]
        actual = bytearray()
        offset = info.start_offset
        while offset < info.length:
            size = min(8 << 20, info.length - offset)
            actual += storage.read(handle, offset, size)
            offset += size
        if (info.start_offset, info.length) != (start, len(data)) or actual != data[start:]:
            mismatched.append(name)
        bar.update(1)
    return mismatched


def run_demo(
    folder: str,
    *,
    segments: int = 64,
    writes: int = 200,
    keep: bool = False,
    json_output: bool = False,
    out: Callable[[str], None] = print,
    store: str | None = None,
) -> dict[str, Any]:
    """Run the demo in ``folder`` (recreated) and return its report.

    ``store``: a chunk storage URL (``--store``, e.g. ``gs://bucket/prefix``) for the
    chunks instead of the folder's filesystem binding; the metadata stays in ``folder``.
    Its prefix must hold no chunk yet (``InvalidArgument``): the demo checks what it wrote.
    Unless ``keep``, what the demo wrote there is removed at the end, as the folder is.

    ``report["verified"]`` is True only if every segment read back byte-identical and
    the container has no invariant violation and no leaked chunk.
    """
    _require_spark()
    _prepare(folder)
    if store is not None:
        _require_empty(store)
    names = [f"demo/stream-{i:03d}/0" for i in range(segments)]
    expected = _Expected()
    quiet = json_output or not sys.stderr.isatty()
    report: dict[str, Any] = {"segments": segments}

    def bar(total: int, desc: str) -> tqdm:
        return tqdm(total=total, desc=desc, unit="segment", disable=quiet)

    try:
        with _open(folder, store) as storage:
            for name in names:
                storage.create(name)
            with bar(segments, "ingest") as progress:
                started = time.perf_counter()
                _parallel(names, _small_writes(storage, expected, writes), SEED, progress)
                ingest_s = time.perf_counter() - started
            ingest_bytes = sum(len(data) for data in expected.data.values())
            report.update(
                writes=segments * writes,
                ingest_bytes=ingest_bytes,
                ingest_s=round(ingest_s, 3),
                writes_per_s=round(segments * writes / ingest_s, 1),
                ingest_mb_per_s=round(ingest_bytes / ingest_s / 1e6, 2),
                epochs=[storage.epoch],
            )

        # Failovers, as after crashes: each new epoch fences the last one and takes the streams
        # over; its first write to a stream starts a new chunk. The last instance stays open.
        per_failover = max(1, writes // 20)
        for failover in range(1, FAILOVERS):
            with _open(folder, store) as storage:
                report["epochs"].append(storage.epoch)
                with bar(segments, f"failover {failover}") as progress:
                    _parallel(
                        names, _small_writes(storage, expected, per_failover), SEED + 10 + failover, progress
                    )
        with _open(folder, store, concat_merge_seam=False) as storage:
            report["epochs"].append(storage.epoch)
            with bar(segments, f"failover {FAILOVERS}") as progress:
                _parallel(names, _small_writes(storage, expected, per_failover), SEED + 1, progress)

            concats: list[int] = []
            with bar(segments // 2, "transactions") as progress:
                started = time.perf_counter()
                _parallel(
                    names[: segments // 2], _transactions(storage, expected, concats), SEED + 2, progress
                )
                concat_s = time.perf_counter() - started
            report.update(transactions=len(concats), transactions_per_s=round(len(concats) / concat_s, 1))

            for name in names[: segments // 4]:
                cut = storage.info(name).length // 2
                storage.truncate(storage.open_write(name), cut)
                expected.start[name] = cut
            report["truncated"] = segments // 4

            report["cost_before_defrag"] = _cost(storage)
            batch, spark_start_s = _spark_defrag(folder, storage, quiet, store)
            # The batch fenced nobody: the live owner keeps writing, through the new layout.
            with bar(segments, "after defrag") as progress:
                _parallel(names, _small_writes(storage, expected, 1), SEED + 3, progress)
            report.update(
                chunks_before_defrag=batch.chunks_before,
                chunks_after_defrag=batch.chunks_after,
                defrag_driver="spark",
                defrag_master=SPARK_MASTER,
                defrag_runs=batch.runs_committed,
                defrag_runs_dropped=batch.runs_dropped,
                defrag_runs_failed=batch.runs_failed,
                defrag_bytes_native=batch.bytes_native,
                defrag_bytes_copied=batch.bytes_copied,
                defrag_s=round(batch.seconds, 3),
                spark_start_s=round(spark_start_s, 3),
                owner_epoch_after_defrag=storage.epoch,
                writes_after_defrag=segments,
            )
            # A failed run corrupts nothing (its chunk goes to GC), but the demo expects none.
            defrag_problems = [f"spark defrag: run failed: {error}" for error in batch.errors]

        # Verify on a fresh instance, collect garbage at once, verify again: no leak.
        with _open(folder, store, gc_delay_s=0.0) as storage:
            report["epochs"].append(storage.epoch)
            with bar(segments, "verify") as progress:
                started = time.perf_counter()
                mismatched = _verify(storage, expected, progress)
                verify_s = time.perf_counter() - started
            total_bytes = sum(len(data) - expected.start[name] for name, data in expected.data.items())
            while storage.gc.run_once().progressed:
                pass
            report["cost_after_defrag"] = _cost(storage)
            problems = defrag_problems + verify_container(storage).problems
            report.update(
                readable_bytes=total_bytes,
                verify_mb_per_s=round(total_bytes / verify_s / 1e6, 2),
                gc_chunks_deleted=storage.gc.statistics().chunks_deleted,
            )
            assert storage.durable is not None
            snapshot = storage.durable.snapshot()
            report.update(
                snapshot_sequence=snapshot.sequence,
                snapshot_entries=snapshot.entries,
                snapshot_bytes=snapshot.end - snapshot.start,
            )
        lost, restored = _disaster_recovery(folder, expected, bar, report, store)
        mismatched += lost
        problems += restored
        report.update(run_kafka_demo(os.path.join(folder, "kafka"), open_new_store))
        report.update(
            store=_chunks_url(folder, store) if store is not None else None,
            mismatched=mismatched,
            problems=problems[:20],
            verified=not mismatched and not problems and report["kafka_verified"],
            folder=os.path.abspath(folder) if keep else None,
        )
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)
            if store is not None:
                _empty_store(store)

    out(json.dumps(report, sort_keys=True) if json_output else _format(report))
    return report


def _cost(storage: ChunkedSegmentStorage) -> dict[str, Any]:
    """The container's layout and requests so far, priced at its store's list prices
    (``slts.prices.list_prices``: S3's, GCS's on ``gs://``, Azure's on ``azure://``)."""
    storage.flush_usage()
    report = cost_report(storage, list_prices(storage.chunk_storage.url)[0])
    total = report.total
    return {
        "chunks": report.stored.chunks,
        "stored_bytes": report.stored.bytes,
        "storage_per_month": report.storage_per_month,
        "requests": total.request_count,
        "requests_cost": report.cost(),
        "prices_source": report.prices_source,
    }


def _require_empty(store: str) -> None:
    """Refuse a ``--store`` whose prefix already holds chunks (``InvalidArgument``)."""
    from slts.bindings import from_url

    with from_url(store) as binding:
        if next(iter(binding.list()), None) is not None:
            raise InvalidArgument(f"the demo's --store {store!r} already holds chunks: give it a new prefix")


def _empty_store(store: str) -> None:
    """Remove every chunk below a ``--store`` the demo used (it held none before)."""
    from slts.bindings import from_url

    with from_url(store) as binding:
        for name in list(binding.list()):
            binding.delete(binding.open_write(name))


def _spark_defrag(
    folder: str, owner: ChunkedSegmentStorage, quiet: bool, store: str | None = None
) -> tuple[BatchReport, float]:
    """The Spark defrag batch over every segment, beside the live ``owner``: its report and
    the seconds Spark took to start. Spark's output goes to ``SPARK_LOG`` in ``folder``;
    its tail is shown if the step fails."""
    from slts.tools.spark_defrag import spark_quietly

    from slts.storage.batch_defrag import Executor, defrag_store

    root = os.path.abspath(folder)  # the executors rebuild the binding from this URL
    log = os.path.join(root, SPARK_LOG)
    spark_start_s = 0.0

    @contextlib.contextmanager
    def timed_spark(_: object) -> Iterator[Executor]:
        nonlocal spark_start_s
        started = time.perf_counter()
        with spark_quietly(log, SPARK_MASTER) as executor:
            spark_start_s = time.perf_counter() - started
            yield executor

    try:
        with tqdm(desc=f"spark defrag ({SPARK_MASTER})", unit="run", disable=quiet) as progress:
            report = defrag_store(
                _chunks_url(root, store),
                os.path.join(root, "metadata"),
                timed_spark,
                config=owner.config,  # not an owner: fences nobody
                progress=progress.update,
            )
        return report, spark_start_s
    except Exception:
        print(f"slts demo: the Spark defrag failed; the end of {log}:\n{_log_tail(log)}", file=sys.stderr)
        raise


def _disaster_recovery(
    folder: str,
    expected: _Expected,
    bar: Callable[[int, str], tqdm],
    report: dict[str, Any],
    store: str | None = None,
) -> tuple[list[str], list[str]]:
    """Lose the metadata folder, restore it from tier-2 alone, verify every segment;
    return (mismatched segments, problems) and put the figures in ``report``."""
    from slts.bindings import from_url
    from slts.journal.restore import restore_to_folder

    shutil.rmtree(os.path.join(folder, "metadata"))  # the machine is lost: only tier-2 is left
    restored = os.path.join(folder, "metadata-restored")
    with from_url(_chunks_url(folder, store)) as binding:
        restore = restore_to_folder(binding, 0, restored)
    report.update(
        restore_s=round(restore.seconds, 3),
        restore_sequence=restore.sequence,
        restore_log_records=restore.log_records,
        restore_mb_per_s=round(restore.bytes_read / max(restore.seconds, 1e-9) / 1e6, 2),
    )
    with open_storage(_chunks_url(folder, store), metadata=restored) as storage:
        report["epochs"].append(storage.epoch)
        with bar(len(expected.data), "verify restored") as progress:
            mismatched = _verify(storage, expected, progress)
        return [f"restored:{name}" for name in mismatched], verify_container(storage).problems


def _shown(url: str) -> str:
    """A store URL without its query (no option of it is a secret, but it is long)."""
    return url.partition("?")[0]


def _cost_lines(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """``slts cost``'s figures before the defrag and after it and GC, on S3's list prices."""

    def line(label: str, cost: dict[str, Any]) -> str:
        return (
            f"{label}{cost['chunks']:,} chunks, {cost['stored_bytes'] / 1e6:.2f} MB"
            f" (${cost['storage_per_month']:.6f}/month), {cost['requests']:,} requests so far"
            f" (${cost['requests_cost']:.4f}); reading it all takes {cost['chunks']:,} GETs"
        )

    return [
        f"  cost          slts cost at {before.get('prices_source', PRICES_SOURCE).split(',')[0]}"
        " (requests: the driver's, not Spark's):",
        line("                before defrag: ", before),
        line("                after defrag and GC: ", after),
    ]


def _format(report: dict[str, Any]) -> str:
    verdict = "every segment byte-identical, no invariant broken, no chunk leaked"
    if not report["verified"]:
        verdict = f"FAILED: mismatched {report['mismatched']}, problems {report['problems']}"
    per_segment = report["writes"] // report["segments"]
    return "\n".join(
        [
            "SLTS demo: filesystem binding + LMDB metadata, durable writes (fsync data, sync metadata)"
            if not report.get("store")
            else f"SLTS demo: chunks on {_shown(report['store'])} + LMDB metadata",
            f"  ingest        {report['segments']} segments x {per_segment} small writes"
            f" ({WRITE_BYTES_MIN}-{WRITE_BYTES_MAX} B) from {THREADS} threads",
            f"                {report['writes']} writes, {report['ingest_bytes'] / 1e6:.2f} MB in "
            f"{report['ingest_s']} s:"
            f" {report['writes_per_s']} writes/s, {report['ingest_mb_per_s']} MB/s",
            f"  failovers     epochs {' -> '.join(str(e) for e in report['epochs'][: FAILOVERS + 1])}: each "
            "took every"
            " stream over and appended small writes (a new chunk per stream and epoch)",
            f"  transactions  {report['transactions']} written, sealed and concatenated into streams"
            f" ({report['transactions_per_s']}/s)",
            f"  truncate      {report['truncated']} streams cut in half",
            f"  spark defrag  chunks {report['chunks_before_defrag']} -> {report['chunks_after_defrag']}:"
            f" {report['defrag_runs']} runs on Spark {report['defrag_master']} in {report['defrag_s']} s"
            f" (after {report['spark_start_s']} s of Spark start-up),",
            f"                {report['defrag_bytes_native'] / 1e6:.2f} MB concatenated natively,"
            f" {report['defrag_bytes_copied'] / 1e6:.2f} MB copied through the executors;",
            f"                beside the live owner: it kept epoch {report['owner_epoch_after_defrag']} and "
            "wrote"
            f" {report['writes_after_defrag']} more writes through the new layout",
            f"  gc            {report['gc_chunks_deleted']} chunks deleted",
            *_cost_lines(report["cost_before_defrag"], report["cost_after_defrag"]),
            f"  verify        {report['readable_bytes'] / 1e6:.2f} MB read back at "
            f"{report['verify_mb_per_s']} MB/s",
            f"  snapshot      metadata snapshot on tier-2 at sequence {report['snapshot_sequence']}:"
            f" {report['snapshot_entries']} records, {report['snapshot_bytes'] / 1e6:.2f} MB",
            f"  lose machine  metadata folder deleted; restored from tier-2 alone in {report['restore_s']} s"
            f" ({report['restore_mb_per_s']} MB/s, snapshot + {report['restore_log_records']} log records,"
            f" up to sequence {report['restore_sequence']}); epoch {report['epochs'][-1]} takes over",
            f"  verify        every segment read back again from the restored metadata: {verdict}",
            *format_kafka(report),
        ]
    )
