"""Fixtures for the Spark defrag tests (``slts.tools.spark_defrag``): a real local Spark.

* ``spark``: one ``spark_executor(MASTER)`` per test module (a module may override it,
  e.g. to inject a task function). The JVM starts once per test process (about 10 s);
  later sessions reuse it and start in well under a second.
* ``fragment(url, metadata, names, pieces)``: a container whose segments have ``pieces``
  chunks each. Every piece is written by a new owner: a takeover always starts a new
  chunk. (A small ``max_rolling_length`` would make many chunks too, but never
  mergeable ones: a defrag run is at most the segment's rolling length.)
* The bytes are a function of (segment, offset) (``pieces.piece``), so any process can
  tell what a segment of a given length must hold (``pieces.expected``).

Everything here skips, with the reason, only when PySpark or Java is missing.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from slts.config import StorageConfig
from slts.storage.batch_defrag import BatchDefrag, BatchReport, Executor, run_batch
from slts.storage.chunked import ChunkedSegmentStorage

from .pieces import expected, piece

#: Two executor threads: the machines this runs on have two cores.
MASTER = "local[2]"
#: Threads writing while a container is fragmented.
BUILD_THREADS = 8


def require_spark() -> None:
    """Skip the calling test unless PySpark and a Java runtime are installed."""
    from slts.tools.spark_defrag import spark_unavailable

    missing = spark_unavailable()
    if missing is not None:
        pytest.skip(missing)


@pytest.fixture(scope="module")
def spark() -> Iterator[Executor]:
    """The module's Spark session, as a ``run_batch`` executor."""
    require_spark()
    from slts.tools.spark_defrag import spark_executor

    with spark_executor(MASTER) as executor:
        yield executor


def file_locations(root: Path) -> tuple[str, str]:
    """(chunk storage URL, LMDB metadata folder) of a filesystem container under ``root``."""
    return f"file://{root / 'chunks'}", str(root / "metadata")


@dataclass
class Fragmented:
    """What ``fragment`` wrote: every piece's length, per segment."""

    pieces: dict[str, list[int]] = field(default_factory=dict)

    @property
    def lengths(self) -> dict[str, int]:
        return {name: sum(sizes) for name, sizes in self.pieces.items()}

    def mergeable_bytes(self) -> int:
        """Bytes of every segment's chunks but its last (what a defrag merges)."""
        return sum(sum(sizes[:-1]) for sizes in self.pieces.values() if len(sizes) > 1)


def fragment(
    url: str, metadata: str, names: Sequence[str], pieces: int, *, seal: Sequence[str] = (), **config: object
) -> Fragmented:
    """Create ``names`` and give each ``pieces`` chunks: one ``piece`` per owner, a new
    owner (epoch) per round; then seal ``seal``. The metadata is written without syncs
    (setup speed only: nothing here crashes); every owner is closed when this returns."""
    from slts.metadata.lmdb_store import LmdbMetadataStore
    from slts.metadata.schema import TABLES
    from slts.storage.factory import open as open_storage

    os.makedirs(metadata, exist_ok=True)
    written = Fragmented({name: [] for name in names})
    settings = {"gc_interval_s": 0.0, "metadata_log_flush_interval_s": 0.0, **config}

    def work(owner: ChunkedSegmentStorage, first: bool, index: int) -> None:
        for name in names[index::BUILD_THREADS]:  # each name in one thread only
            if first:
                owner.create(name)
            offset = sum(written.pieces[name])
            data = piece(name, offset)
            owner.write(owner.open_write(name), offset, data)
            written.pieces[name].append(len(data))

    for round_ in range(pieces):
        store = LmdbMetadataStore(metadata, TABLES, durable=False)
        owner = open_storage(url, metadata=store, **settings)
        try:
            with ThreadPoolExecutor(BUILD_THREADS) as pool:
                list(pool.map(functools.partial(work, owner, round_ == 0), range(BUILD_THREADS)))
            if round_ == pieces - 1:
                for name in seal:
                    owner.seal(owner.open_write(name))
        finally:
            owner.close()
            store.close()  # the caller's store: the instance never closes it
    return written


def defrag_with(
    executor: Executor, url: str, metadata: str, config: StorageConfig | None = None, **options: object
) -> BatchReport:
    """One batch defrag of the container at ``url``/``metadata`` through ``executor``,
    from a driver of its own (its binding and metadata store opened here)."""
    from slts.bindings import from_url

    from slts.metadata.lmdb_store import LmdbMetadataStore
    from slts.metadata.schema import TABLES

    with from_url(url) as binding, LmdbMetadataStore(metadata, TABLES) as store:
        return run_batch(BatchDefrag(binding, store, 0, config), executor, **options)  # type: ignore[arg-type]


def mismatched(storage: object, lengths: dict[str, int]) -> list[str]:
    """The segments of ``lengths`` whose length or bytes differ from what was written."""
    wrong = []
    for name, length in lengths.items():
        info = storage.info(name)  # type: ignore[attr-defined]
        data = storage.read(storage.open_read(name), 0, length) if length else b""  # type: ignore[attr-defined]
        if info.length != length or data != expected(name, length):
            wrong.append(name)
    return wrong


def open_owner(url: str, metadata: str, *, synced: bool = True, **config: object) -> ChunkedSegmentStorage:
    """A new owner (next epoch) that collects garbage at once when asked (no background
    GC). ``synced=False``: metadata commits without syncs, for checks after the fact
    (the metadata folder must not be open elsewhere in this process)."""
    from slts.metadata.lmdb_store import LmdbMetadataStore
    from slts.metadata.schema import TABLES
    from slts.storage.factory import open as open_storage

    store = metadata if synced else LmdbMetadataStore(metadata, TABLES, durable=False)
    settings = {"gc_delay_s": 0.0, "gc_interval_s": 0.0, "metadata_log_flush_interval_s": 0.0, **config}
    return open_storage(url, metadata=store, **settings)


def collect_garbage(storage: object) -> int:
    """GC passes until one deletes nothing (the instance needs ``gc_delay_s=0``)."""
    deleted = 0
    while count := storage.gc.run_once().chunks_deleted:  # type: ignore[attr-defined]
        deleted += count
    return deleted
