"""``slts demo``: the main job on the embedded default, end to end, with its figures.

Filesystem binding + LMDB in one local folder. Steps: ingest many segments with many
small durable writes from several threads; restart the container (a new epoch, as
after a crash or failover) and keep writing (the takeover starts new chunks); read every
segment back and compare it byte for byte (SHA-256) with what was written; print the
figures. Later capabilities (concat, truncate, defrag, snapshot/restore) extend it.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tqdm import tqdm

from slts.errors import InvalidArgument
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.factory import open as open_storage

MARKER = ".slts-demo"
THREADS = 4
WRITE_BYTES_MIN, WRITE_BYTES_MAX = 256, 4096
SEED = 20261122


def _prepare(folder: str) -> None:
    if os.path.exists(folder):
        if not os.path.exists(os.path.join(folder, MARKER)) and os.listdir(folder):
            raise InvalidArgument(f"{folder!r} exists and is not a demo folder; choose another --dir")
        shutil.rmtree(folder)
    os.makedirs(os.path.join(folder, "metadata"))
    with open(os.path.join(folder, MARKER), "w") as marker:
        marker.write("created by slts demo; removed and recreated by the next run\n")


def _open(folder: str) -> ChunkedSegmentStorage:
    return open_storage(f"file://{os.path.join(folder, 'chunks')}", metadata=os.path.join(folder, "metadata"))


class _Expected:
    """What each segment must hold: running SHA-256 and length, per segment."""

    def __init__(self, names: list[str]) -> None:
        self.digests = {name: hashlib.sha256() for name in names}
        self.lengths = dict.fromkeys(names, 0)

    def add(self, name: str, data: bytes) -> None:
        self.digests[name].update(data)
        self.lengths[name] += len(data)


def _ingest(
    storage: ChunkedSegmentStorage, names: list[str], writes: int, expected: _Expected, seed: int, progress: tqdm
) -> int:
    """Each thread owns a slice of the segments and appends ``writes`` small writes to each."""

    def work(slice_index: int) -> int:
        rng = random.Random(seed + slice_index)
        done = 0
        for name in names[slice_index::THREADS]:
            handle = storage.open_write(name)
            offset = storage.info(name).length
            for _ in range(writes):
                data = rng.randbytes(rng.randint(WRITE_BYTES_MIN, WRITE_BYTES_MAX))
                storage.write(handle, offset, data)
                expected.add(name, data)
                offset += len(data)
                done += 1
            progress.update(writes)
        return done

    with ThreadPoolExecutor(THREADS) as pool:
        return sum(pool.map(work, range(THREADS)))


def _verify(storage: ChunkedSegmentStorage, expected: _Expected, progress: tqdm) -> list[str]:
    mismatched = []
    for name, digest in expected.digests.items():
        info = storage.info(name)
        handle = storage.open_read(name)
        actual = hashlib.sha256()
        offset = info.start_offset
        while offset < info.length:
            size = min(8 << 20, info.length - offset)
            actual.update(storage.read(handle, offset, size))
            offset += size
        if info.length != expected.lengths[name] or actual.digest() != digest.digest():
            mismatched.append(name)
        progress.update(1)
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

    ``report["verified"]`` is True only if every segment read back byte-identical.
    """
    _prepare(folder)
    names = [f"demo/stream-{i:03d}/0" for i in range(segments)]
    expected = _Expected(names)
    quiet = json_output or not sys.stderr.isatty()
    try:
        with _open(folder) as storage:
            for name in names:
                storage.create(name)
            with tqdm(total=segments * writes, desc="ingest", unit="write", disable=quiet) as bar:
                started = time.perf_counter()
                first_writes = _ingest(storage, names, writes, expected, SEED, bar)
                ingest_s = time.perf_counter() - started
            first_epoch = storage.epoch
            ingest_bytes = sum(expected.lengths.values())

        # Restart as after a crash: a new epoch fences the old one and takes the segments over.
        with _open(folder) as storage:
            takeover_writes = max(1, writes // 10)
            with tqdm(total=segments * takeover_writes, desc="after restart", unit="write", disable=quiet) as bar:
                _ingest(storage, names, takeover_writes, expected, SEED + 1000, bar)
            with tqdm(total=segments, desc="verify", unit="segment", disable=quiet) as bar:
                started = time.perf_counter()
                mismatched = _verify(storage, expected, bar)
                verify_s = time.perf_counter() - started
            chunk_counts = [storage.info(name).chunk_count for name in names]
            second_epoch = storage.epoch
            total_bytes = sum(expected.lengths.values())
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)

    report = {
        "segments": segments,
        "writes": first_writes,
        "ingest_bytes": ingest_bytes,
        "ingest_s": round(ingest_s, 3),
        "writes_per_s": round(first_writes / ingest_s, 1),
        "ingest_mb_per_s": round(ingest_bytes / ingest_s / 1e6, 2),
        "epochs": [first_epoch, second_epoch],
        "total_bytes": total_bytes,
        "verify_mb_per_s": round(total_bytes / verify_s / 1e6, 2),
        "chunks_per_segment_mean": round(sum(chunk_counts) / segments, 2),
        "chunks_per_segment_max": max(chunk_counts),
        "mismatched": mismatched,
        "verified": not mismatched,
        "folder": os.path.abspath(folder) if keep else None,
    }
    if json_output:
        out(json.dumps(report, sort_keys=True))
    else:
        out(_format(report, threads=THREADS))
    return report


def _format(report: dict[str, Any], *, threads: int) -> str:
    verdict = "every segment byte-identical" if report["verified"] else f"MISMATCH in {report['mismatched']}"
    return "\n".join([
        "SLTS demo: filesystem binding + LMDB metadata, durable writes (fsync data, sync metadata)",
        f"  ingest          {report['segments']} segments x {report['writes'] // report['segments']} small writes"
        f" ({WRITE_BYTES_MIN}-{WRITE_BYTES_MAX} B) from {threads} threads",
        f"                  {report['writes']} writes, {report['ingest_bytes'] / 1e6:.2f} MB in {report['ingest_s']} s:"
        f" {report['writes_per_s']} writes/s, {report['ingest_mb_per_s']} MB/s",
        f"  restart         epoch {report['epochs'][0]} -> {report['epochs'][1]}: segments taken over, more writes",
        f"  layout          chunks per segment: mean {report['chunks_per_segment_mean']},"
        f" max {report['chunks_per_segment_max']}",
        f"  verify          {report['total_bytes'] / 1e6:.2f} MB read back at {report['verify_mb_per_s']} MB/s: {verdict}",
    ])  # fmt: skip
