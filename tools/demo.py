"""``slts demo``: the main job on the embedded default, end to end, with its figures.

Filesystem binding + LMDB in one local folder. Steps:

1. ingest: many segments, many small durable writes, from several threads;
2. restart: a new epoch takes the container over (as after a crash) and keeps writing;
3. transactions: small segments written, sealed and concatenated into the streams;
4. truncate: the older half of some streams is dropped;
5. defrag: runs of small chunks are merged, in process;
6. verify: every segment read back and compared byte for byte with what was written,
   every invariant checked (``slts.storage.verify``), garbage collected, no leak;
7. disaster recovery: a metadata snapshot on tier-2, then the machine is "lost" (the
   LMDB folder is deleted), the metadata is restored from the chunk storage alone into
   a fresh folder, and every segment is verified byte-identical again.

The Spark defrag extends it later.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tqdm import tqdm

from slts.errors import InvalidArgument
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.factory import open as open_storage
from slts.storage.verify import verify_container

MARKER = ".slts-demo"
THREADS = 4
WRITE_BYTES_MIN, WRITE_BYTES_MAX = 256, 4096
TXNS_PER_STREAM = 8
SEED = 20261122


def _prepare(folder: str) -> None:
    if os.path.exists(folder):
        if not os.path.exists(os.path.join(folder, MARKER)) and os.listdir(folder):
            raise InvalidArgument(f"{folder!r} exists and is not a demo folder; choose another --dir")
        shutil.rmtree(folder)
    os.makedirs(os.path.join(folder, "metadata"))
    with open(os.path.join(folder, MARKER), "w") as marker:
        marker.write("created by slts demo; removed and recreated by the next run\n")


def _open(folder: str, **config: Any) -> ChunkedSegmentStorage:
    return open_storage(f"file://{os.path.join(folder, 'chunks')}", metadata=os.path.join(folder, "metadata"),
                        **config)  # fmt: skip


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


def _small_writes(storage: ChunkedSegmentStorage, expected: _Expected, writes: int) -> Callable[[str, random.Random], None]:
    def work(name: str, rng: random.Random) -> None:
        handle = storage.open_write(name)
        offset = storage.info(name).length
        for _ in range(writes):
            data = rng.randbytes(rng.randint(WRITE_BYTES_MIN, WRITE_BYTES_MAX))
            storage.write(handle, offset, data)
            expected.add(name, data)
            offset += len(data)

    return work


def _transactions(storage: ChunkedSegmentStorage, expected: _Expected, counter: list[int]) -> Callable[[str, random.Random], None]:
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
) -> dict[str, Any]:
    """Run the demo in ``folder`` (recreated) and return its report.

    ``report["verified"]`` is True only if every segment read back byte-identical and
    the container has no invariant violation and no leaked chunk.
    """
    _prepare(folder)
    names = [f"demo/stream-{i:03d}/0" for i in range(segments)]
    expected = _Expected()
    quiet = json_output or not sys.stderr.isatty()
    report: dict[str, Any] = {"segments": segments}

    def bar(total: int, desc: str) -> tqdm:
        return tqdm(total=total, desc=desc, unit="segment", disable=quiet)

    try:
        with _open(folder) as storage:
            for name in names:
                storage.create(name)
            with bar(segments, "ingest") as progress:
                started = time.perf_counter()
                _parallel(names, _small_writes(storage, expected, writes), SEED, progress)
                ingest_s = time.perf_counter() - started
            ingest_bytes = sum(len(data) for data in expected.data.values())
            report.update(
                writes=segments * writes, ingest_bytes=ingest_bytes, ingest_s=round(ingest_s, 3),
                writes_per_s=round(segments * writes / ingest_s, 1),
                ingest_mb_per_s=round(ingest_bytes / ingest_s / 1e6, 2), epochs=[storage.epoch],
            )  # fmt: skip

        # Restart as after a crash: the new epoch fences the old one and takes the segments over.
        with _open(folder, concat_merge_seam=False) as storage:
            report["epochs"].append(storage.epoch)
            with bar(segments, "after restart") as progress:
                _parallel(names, _small_writes(storage, expected, max(1, writes // 10)), SEED + 1, progress)

            concats: list[int] = []
            with bar(segments // 2, "transactions") as progress:
                started = time.perf_counter()
                _parallel(names[: segments // 2], _transactions(storage, expected, concats), SEED + 2, progress)
                concat_s = time.perf_counter() - started
            report.update(transactions=len(concats), transactions_per_s=round(len(concats) / concat_s, 1))

            for name in names[: segments // 4]:
                cut = storage.info(name).length // 2
                storage.truncate(storage.open_write(name), cut)
                expected.start[name] = cut
            report["truncated"] = segments // 4

            chunks_before = sum(storage.info(name).chunk_count for name in names)
            started = time.perf_counter()
            results = [storage.defrag(name) for name in names]
            defrag_s = time.perf_counter() - started
            report.update(
                chunks_before_defrag=chunks_before,
                chunks_after_defrag=sum(result.chunks_after for result in results),
                defrag_runs=sum(result.runs_committed for result in results),
                defrag_bytes_native=sum(result.bytes_native for result in results),
                defrag_s=round(defrag_s, 3),
            )  # fmt: skip

        # Verify on a fresh instance, collect garbage at once, verify again: no leak.
        with _open(folder, gc_delay_s=0.0) as storage:
            report["epochs"].append(storage.epoch)
            with bar(segments, "verify") as progress:
                started = time.perf_counter()
                mismatched = _verify(storage, expected, progress)
                verify_s = time.perf_counter() - started
            total_bytes = sum(len(data) - expected.start[name] for name, data in expected.data.items())
            while storage.gc.run_once().chunks_deleted:
                pass
            problems = verify_container(storage).problems
            report.update(
                readable_bytes=total_bytes, verify_mb_per_s=round(total_bytes / verify_s / 1e6, 2),
                gc_chunks_deleted=storage.gc.statistics().chunks_deleted,
            )  # fmt: skip
            assert storage.durable is not None
            snapshot = storage.durable.snapshot()
            report.update(snapshot_sequence=snapshot.sequence, snapshot_entries=snapshot.entries,
                          snapshot_bytes=snapshot.end - snapshot.start)  # fmt: skip
        lost, restored = _disaster_recovery(folder, expected, bar, report)
        mismatched += lost
        problems += restored
        report.update(mismatched=mismatched, problems=problems[:20], verified=not mismatched and not problems,
                      folder=os.path.abspath(folder) if keep else None)  # fmt: skip
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)

    out(json.dumps(report, sort_keys=True) if json_output else _format(report))
    return report


def _disaster_recovery(
    folder: str, expected: _Expected, bar: Callable[[int, str], tqdm], report: dict[str, Any]
) -> tuple[list[str], list[str]]:
    """Lose the metadata folder, restore it from tier-2 alone, verify every segment;
    return (mismatched segments, problems) and put the figures in ``report``."""
    from slts.bindings import from_url
    from slts.journal.restore import restore_to_folder

    shutil.rmtree(os.path.join(folder, "metadata"))  # the machine is lost: only tier-2 is left
    restored = os.path.join(folder, "metadata-restored")
    with from_url(f"file://{os.path.join(folder, 'chunks')}") as binding:
        restore = restore_to_folder(binding, 0, restored)
    report.update(restore_s=round(restore.seconds, 3), restore_sequence=restore.sequence,
                  restore_log_records=restore.log_records,
                  restore_mb_per_s=round(restore.bytes_read / max(restore.seconds, 1e-9) / 1e6, 2))  # fmt: skip
    with open_storage(f"file://{os.path.join(folder, 'chunks')}", metadata=restored) as storage:
        report["epochs"].append(storage.epoch)
        with bar(len(expected.data), "verify restored") as progress:
            mismatched = _verify(storage, expected, progress)
        return [f"restored:{name}" for name in mismatched], verify_container(storage).problems


def _format(report: dict[str, Any]) -> str:
    verdict = "every segment byte-identical, no invariant broken, no chunk leaked"
    if not report["verified"]:
        verdict = f"FAILED: mismatched {report['mismatched']}, problems {report['problems']}"
    per_segment = report["writes"] // report["segments"]
    return "\n".join([
        "SLTS demo: filesystem binding + LMDB metadata, durable writes (fsync data, sync metadata)",
        f"  ingest        {report['segments']} segments x {per_segment} small writes"
        f" ({WRITE_BYTES_MIN}-{WRITE_BYTES_MAX} B) from {THREADS} threads",
        f"                {report['writes']} writes, {report['ingest_bytes'] / 1e6:.2f} MB in {report['ingest_s']} s:"
        f" {report['writes_per_s']} writes/s, {report['ingest_mb_per_s']} MB/s",
        f"  restart       epoch {report['epochs'][0]} -> {report['epochs'][1]}: segments taken over, more writes",
        f"  transactions  {report['transactions']} written, sealed and concatenated into streams"
        f" ({report['transactions_per_s']}/s)",
        f"  truncate      {report['truncated']} streams cut in half",
        f"  defrag        chunks {report['chunks_before_defrag']} -> {report['chunks_after_defrag']}"
        f" ({report['defrag_runs']} runs, {report['defrag_bytes_native'] / 1e6:.2f} MB concatenated natively,"
        f" {report['defrag_s']} s)",
        f"  gc            {report['gc_chunks_deleted']} chunks deleted",
        f"  verify        {report['readable_bytes'] / 1e6:.2f} MB read back at {report['verify_mb_per_s']} MB/s",
        f"  snapshot      metadata snapshot on tier-2 at sequence {report['snapshot_sequence']}:"
        f" {report['snapshot_entries']} records, {report['snapshot_bytes'] / 1e6:.2f} MB",
        f"  lose machine  metadata folder deleted; restored from tier-2 alone in {report['restore_s']} s"
        f" ({report['restore_mb_per_s']} MB/s, snapshot + {report['restore_log_records']} log records,"
        f" up to sequence {report['restore_sequence']}); epoch {report['epochs'][-1]} takes over",
        f"  verify        every segment read back again from the restored metadata: {verdict}",
    ])  # fmt: skip
