"""The durable copy of the metadata on tier-2 (``slts.journal``): journal replay, journal
boot, and restore of a whole container from tier-2 alone. Filesystem binding throughout.

* ``journal_replay``: ``replay`` of N journal records (no journal snapshot covers them)
  vs. reading the journal files and msgpack-decoding every record (the least work that
  yields the decoded records);
* ``journal_boot``: ``SystemJournal.boot`` of a new epoch on that tier-2 (replay, boot
  record, checkpointed journal snapshot) vs. the same raw read;
* ``restore_100k``: ``restore`` of a container of N segments (metadata snapshot taken
  half-way, the rest in the metadata log) into a fresh LMDB store vs. raw LMDB puts of the
  restored entries.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import lmdb
import msgpack
from slts.bindings import from_url
from slts.bindings.base import ChunkStorage
from slts.journal import framing, system_names
from slts.journal.journal import JournalSettings, SystemJournal
from slts.journal.metadata_copy import SNAPSHOT_END
from slts.journal.replay import read_object, replay
from slts.journal.restore import restore
from slts.journal.system_segments import SystemSegments
from slts.tools.benchmarks.base import Benchmark, Folder, Workload

from slts.config import StorageConfig
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.schema import SEGMENTS, TABLES
from slts.storage.factory import open as open_storage

#: Bytes of each metadata-log append in the journal benchmarks (one journal record each).
APPEND_BYTES = 64
#: No journal snapshot while the records are written: replay reads every one of them.
NO_SNAPSHOTS = JournalSettings(snapshot_records=10**9)
#: Threads creating and writing segments while the restore benchmark builds its container.
BUILD_THREADS = 32
#: Bytes of the one write each segment of the restored container gets.
SEGMENT_BYTES = 16
#: Entries per raw LMDB write transaction in the restore baseline.
RAW_BATCH = 10_000


def _journal_with_records(folder: Folder, records: int) -> tuple[ChunkStorage, list[str]]:
    """Tier-2 (filesystem binding) holding epoch 1's journal: the boot record, then
    ``records`` records of ``SystemSegments.append`` to the metadata log; returns the
    binding and the names of the journal files."""
    binding = from_url(f"file://{folder.sub('tier2')}")
    journal = SystemJournal.boot(binding, 0, 1, NO_SNAPSHOTS)
    segments = SystemSegments(journal, StorageConfig().system_rolling_length_bytes, lambda: None)
    payload = os.urandom(APPEND_BYTES)
    for i in range(records):
        segments.append(system_names.METADATA_LOG, payload, {"last_sequence": i + 1})
    assert journal.statistics.records == records + 1 and journal.statistics.snapshots == 1, journal.statistics
    return binding, sorted(binding.list(system_names.journal_prefix(0)))


def _raw_read(binding: ChunkStorage, files: list[str]) -> float:
    """Seconds to read ``files`` whole through the binding (the physical part of a replay)."""
    started = time.perf_counter()
    for name in files:
        read_object(binding, name)
    return time.perf_counter() - started


def _decoded(binding: ChunkStorage, files: list[str]) -> float:
    """Seconds to read ``files`` through the binding and msgpack-decode every record's
    payload: the least work that yields the decoded records a replay starts from. The
    files are read by the binding's read (replay maps the files no writer can still
    append to, ``read_view``; the newest file of an epoch, which here holds every record,
    it reads so too), then one ``msgpack.Unpacker`` per file, each 8-byte frame header
    skipped with ``read_bytes``; no CRC check, no validation, nothing applied. (Of the
    ways tried, this and the same with a mapped read were the fastest: ``msgpack.unpackb``
    of each payload's slice took 5-15% longer.)"""
    started = time.perf_counter()
    decoded = 0
    for name in files:
        data = read_object(binding, name)
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(len(data), 1))
        unpacker.feed(data)
        skip, unpack, tell = unpacker.read_bytes, unpacker.unpack, unpacker.tell
        while tell() < len(data):
            skip(framing.HEADER_BYTES)
            unpack()
            decoded += 1
    elapsed = time.perf_counter() - started
    assert decoded > 0
    return elapsed


def journal_replay(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: ``replay`` of N journal records; baseline: reading the journal files
    holding them (page cache) and msgpack-decoding every record (``_decoded``)."""
    records = 1000 if quick else 10_000
    folder = Folder(parent)
    binding: ChunkStorage | None = None
    try:
        binding, files = _journal_with_records(folder, records)
        journal_bytes = sum(binding.get_info(name).length for name in files)

        def subject() -> float:
            started = time.perf_counter()
            found = replay(binding, 0)
            elapsed = time.perf_counter() - started
            assert found.records == records and not (found.corrupt or found.torn or found.inconsistent), found
            return elapsed

        work = (
            f"replay of {records} journal records ({len(files)} files, {journal_bytes / 1e6:.2f} MB) "
            "vs. reading the same files and msgpack-decoding every record (one Unpacker per file, "
            "headers skipped, no CRC check, nothing applied)"
        )
        yield work, subject, lambda: _decoded(binding, files), float(records), "records/s"
    finally:
        if binding is not None:
            binding.close()
        folder.close()


def journal_boot(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: ``SystemJournal.boot`` of epoch 2 on a copy of a tier-2 holding epoch 1's
    N journal records (replay, boot record, journal snapshot and checkpoint, each read
    back); baseline: raw binding reads of the same journal files."""
    records = 1000 if quick else 10_000
    folder = Folder(parent)
    binding: ChunkStorage | None = None
    try:
        binding, files = _journal_with_records(folder, records)
        pristine = os.path.join(folder.path, "tier2")
        runs = 0

        def subject() -> float:
            nonlocal runs
            runs += 1
            copy = os.path.join(folder.path, f"boot-{runs}")
            shutil.copytree(pristine, copy)  # every boot starts from the same tier-2
            os.sync()  # the copy's writeback must not land in the boot's fsyncs
            target = from_url(f"file://{copy}")
            try:
                started = time.perf_counter()
                booted = SystemJournal.boot(target, 0, 2, NO_SNAPSHOTS)
                elapsed = time.perf_counter() - started
            finally:
                target.close()
            assert booted.boot_replay is not None and booted.boot_replay.records == records, (
                booted.boot_replay
            )
            assert booted.statistics.snapshots == 1, booted.statistics
            shutil.rmtree(copy)
            return elapsed

        yield (
            f"boot of epoch 2 over {records} journal records vs. raw read of the journal files",
            subject,
            lambda: _raw_read(binding, files),
            1.0,
            "boots/s",
        )
    finally:
        if binding is not None:
            binding.close()
        folder.close()


def _build_container(folder: Folder, segments: int) -> tuple[int, int, int]:
    """A container on the filesystem binding with ``segments`` segments, each created and
    written once (``SEGMENT_BYTES``), by ``BUILD_THREADS`` threads through the public API.
    A metadata snapshot is taken after the first half; the second half stays in the
    metadata log. Returns (store sequence, snapshot sequence, snapshot entries)."""
    # A non-durable local store: the build's speed does not matter, and what is measured
    # is read from tier-2 only.
    store = LmdbMetadataStore(folder.sub("metadata"), TABLES, durable=False)
    storage = open_storage(
        f"file://{folder.sub('chunks')}", metadata=store, metadata_log_flush_interval_s=0, gc_interval_s=0.0
    )
    payload = os.urandom(SEGMENT_BYTES)

    def make(i: int) -> None:
        name = f"s{i:07d}"
        storage.create(name)
        storage.write(storage.open_write(name), 0, payload)

    try:
        assert storage.durable is not None
        with ThreadPoolExecutor(BUILD_THREADS) as pool:
            list(pool.map(make, range(segments // 2), chunksize=64))
            snapshot = storage.durable.snapshot()
            list(pool.map(make, range(segments // 2, segments), chunksize=64))
        storage.close()  # its last commits (the usage record) and the log's last flush
        assert storage.durable.durable_sequence == store.last_sequence, (
            storage.durable.durable_sequence,
            store.last_sequence,
        )
        return store.last_sequence, snapshot.sequence, snapshot.entries
    finally:
        storage.close()  # idempotent
        store.close()  # ours: the instance leaves a store it was given open


def _entries(path: str) -> list[tuple[str, bytes, bytes]]:
    """Every (table, key, stored value) of the LMDB metadata store at ``path``; the stored
    value is framed as in LMDB (8-byte version, then the value)."""
    store = LmdbMetadataStore(path, TABLES, durable=False, readonly=True)
    try:
        return [
            (table, key, stored.version.to_bytes(8, "big") + stored.value)
            for table in TABLES
            for key, stored in store.iterate(table)
        ]
    finally:
        store.close()


def restore_segments(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: ``restore`` of a container of N segments from tier-2 into a fresh
    non-durable LMDB store (journal replay, metadata snapshot of the first half, metadata
    log of the second); baseline: raw LMDB puts of the restored entries (same tables,
    keys and bytes) into a fresh environment, ``RAW_BATCH`` per write transaction."""
    segments = 2000 if quick else 100_000
    folder = Folder(parent)
    binding: ChunkStorage | None = None
    try:
        sequence, snapshot_sequence, snapshot_entries = _build_container(folder, segments)
        binding = from_url(f"file://{os.path.join(folder.path, 'chunks')}")
        entries = _entries(os.path.join(folder.path, "metadata"))
        entry_bytes = sum(len(key) + len(value) for _, key, value in entries)
        found = replay(binding, 0)
        snapshots = found.layout.segment(system_names.METADATA_SNAPSHOTS)
        log = found.layout.segment(system_names.METADATA_LOG)
        tier2_bytes = (
            snapshots.attrs[SNAPSHOT_END]
            - snapshots.start_offset
            + log.length
            - log.start_offset
            + found.bytes_read
        )
        os.sync()  # the build's writeback must not land in the measured restores
        runs = 0

        def subject() -> float:
            nonlocal runs
            runs += 1
            path = folder.sub(f"restored-{runs}")
            target = LmdbMetadataStore(path, TABLES, durable=False)
            try:
                started = time.perf_counter()
                report = restore(binding, 0, target)
                elapsed = time.perf_counter() - started
                assert report.sequence == sequence and report.snapshot_sequence == snapshot_sequence, report
                assert report.bytes_read == tier2_bytes, (report.bytes_read, tier2_bytes)
                if runs == 1:
                    restored = sum(1 for _ in target.iterate(SEGMENTS))
                    assert restored == segments, (restored, segments)
            finally:
                target.close()
            shutil.rmtree(path)
            return elapsed

        def baseline() -> float:
            path = folder.sub(f"raw-{runs}")
            env = lmdb.open(path, map_size=64 << 30, max_dbs=len(TABLES) + 1, sync=False, metasync=False)
            try:
                dbs = {table: env.open_db(table.encode()) for table in TABLES}
                started = time.perf_counter()
                for first in range(0, len(entries), RAW_BATCH):
                    with env.begin(write=True) as txn:
                        for table, key, value in entries[first : first + RAW_BATCH]:
                            txn.put(key, value, db=dbs[table])
                elapsed = time.perf_counter() - started
            finally:
                env.close()
            shutil.rmtree(path)
            return elapsed

        work = (
            f"restore of {segments} segments ({tier2_bytes / 1e6:.1f} MB read from tier-2: snapshot of "
            f"{snapshot_entries} entries + {sequence - snapshot_sequence} log commits) vs. raw LMDB puts of "
            f"the {len(entries)} restored entries ({entry_bytes / 1e6:.1f} MB)"
        )
        yield work, subject, baseline, float(segments), "segments/s"
    finally:
        if binding is not None:
            binding.close()
        folder.close()


BENCHMARKS = {
    "journal_replay": Benchmark(
        "journal_replay",
        "replay of 10,000 journal records (1,000 with --quick) vs. reading and decoding the same records",
        journal_replay,
    ),
    "journal_boot": Benchmark(
        "journal_boot",
        "journal boot over 10,000 records (1,000 with --quick) vs. raw read of the journal files",
        journal_boot,
    ),
    "restore_100k": Benchmark(
        "restore_100k",
        "restore of a 100,000-segment container (2,000 with --quick) from tier-2 vs. raw LMDB puts",
        restore_segments,
    ),
}
