"""Client-side transforms (docs/security.md): what encryption costs writes and reads next to
the same work on a plain store, what zstd saves on JSON-like Kafka values, and how many
bytes a defrag of encrypted chunks moves natively."""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterator
from typing import Any

from slts.tools.benchmarks.base import Benchmark, Folder, Workload

from slts.storage.chunked import ChunkedSegmentStorage
from slts.transforms.keys import FolderKeyRing

WRITE_BYTES = 1 << 20
READ_BYTES = 8 << 20
RANDOM_READS = 2000
RANDOM_BYTES = 4096
ENCRYPTED: dict[str, Any] = {"encryption": True}


def _ring(folder: Folder) -> FolderKeyRing:
    ring = FolderKeyRing.create(folder.sub("key-ring"))
    ring.activate(ring.add())
    return ring


def encrypted_writes(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: 1 MiB durable writes to a segment of a store with encryption on (frames of
    64 KiB, AES-256-GCM, a fresh data key per chunk). Baseline: the same writes to a plain
    store (block CRC32Cs computed as usual). Each run in a new store, removed after it."""
    count = 32 if quick else 256
    payload = os.urandom(WRITE_BYTES)
    folder = Folder(parent)
    ring = _ring(folder)

    def run(config: dict[str, Any]) -> float:
        with folder.fresh_store("store", key_ring=ring if config else None, **config) as storage:
            storage.create("w")
            handle = storage.open_write("w")
            started = time.perf_counter()
            for i in range(count):
                storage.write(handle, i * WRITE_BYTES, payload)
            return time.perf_counter() - started

    try:
        yield (
            f"{count} durable writes of 1 MiB, encrypted vs. the same writes to a plain store",
            lambda: run(ENCRYPTED),
            lambda: run({}),
            count * WRITE_BYTES / 1e6,
            "MB/s",
        )
    finally:
        folder.close()


def encrypted_reads(
    parent: str, quick: bool, *, random_reads: bool
) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: reads of a segment of an encrypted store (written in 8 MiB writes: frames of
    64 KiB), front to back in 8 MiB reads, or ``random_reads`` of 4 KiB at random offsets
    (each decodes the one frame it falls in). Baseline: the same reads of the same bytes on
    a plain store that verifies every read (the CRC32C of each 64 KiB block a read touches).
    Both from the page cache after the first pass."""
    total = (32 if quick else 256) << 20
    folder = Folder(parent)
    ring = _ring(folder)
    data = os.urandom(READ_BYTES)
    stores = {
        "encrypted": folder.store("encrypted", key_ring=ring, **ENCRYPTED),
        "plain": folder.store("plain", verify_checksums_on_read=True),
    }
    for storage in stores.values():
        storage.create("r")
        handle = storage.open_write("r")
        for offset in range(0, total, READ_BYTES):
            storage.write(handle, offset, data)
    rng = random.Random(7)
    offsets = [rng.randrange(total - RANDOM_BYTES) for _ in range(RANDOM_READS)]

    def reader(storage: ChunkedSegmentStorage) -> Workload:
        handle = storage.open_read("r")

        def run() -> float:
            started = time.perf_counter()
            if random_reads:
                for offset in offsets:
                    storage.read(handle, offset, RANDOM_BYTES)
            else:
                for offset in range(0, total, READ_BYTES):
                    storage.read(handle, offset, READ_BYTES)
            return time.perf_counter() - started

        return run

    try:
        if random_reads:
            yield (
                f"{RANDOM_READS} random 4 KiB reads of a {total >> 20} MiB encrypted segment vs. the same"
                " reads of a plain one, verified",
                reader(stores["encrypted"]),
                reader(stores["plain"]),
                float(RANDOM_READS),
                "reads/s",
            )
        else:
            yield (
                f"{total >> 20} MiB encrypted segment read in 8 MiB reads vs. the same reads of a plain one,"
                " verified",
                reader(stores["encrypted"]),
                reader(stores["plain"]),
                total / 1e6,
                "MB/s",
            )
    finally:
        for storage in stores.values():
            storage.close()
        folder.close()


def json_values(count: int, seed: int) -> bytes:
    """JSON-like Kafka record values: an event per line, as a topic of click events holds."""
    rng = random.Random(seed)
    events = ("view", "click", "add_to_cart", "purchase")
    return b"".join(
        json.dumps(
            {
                "user_id": f"user-{rng.randrange(50_000):06d}",
                "event": rng.choice(events),
                "page": f"/products/{rng.randrange(2_000)}",
                "ts": 1_764_000_000_000 + i * 37,
                "session": f"{rng.getrandbits(64):016x}",
            }
        ).encode()
        + b"\n"
        for i in range(count)
    )


def compression_ratio(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: the MB a store with zstd (level 3) keeps of JSON-like Kafka values written in
    1 MiB writes; baseline: their logical MB. The ratio is stored over logical bytes
    (lower is better)."""
    data = json_values(40_000 if quick else 200_000, 1)
    folder = Folder(parent)

    def subject() -> float:
        with folder.fresh_store("store", compression_level=3) as storage:
            storage.create("json")
            handle = storage.open_write("json")
            for offset in range(0, len(data), WRITE_BYTES):
                storage.write(handle, offset, data[offset : offset + WRITE_BYTES])
            return sum(chunk.stored for _, chunk in storage.chunks("json")) / 1e6

    try:
        yield (
            f"stored MB of {len(data) >> 20} MiB of JSON-like Kafka values with zstd vs. their logical MB",
            subject,
            lambda: len(data) / 1e6,
            1.0,
            "MB",
        )
    finally:
        folder.close()


def encrypted_defrag(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: the MB a defrag of an encrypted, compressed segment of small chunks (small
    segments, each under its own data key, concatenated in) moves natively (the filesystem
    binding concatenates: no byte through the client); baseline:
    the MB the merged chunks store. A ratio of 1: every byte moved natively, none decoded."""
    folder = Folder(parent)
    ring = _ring(folder)
    merged = 0
    runs = 0  # (each run's values differ: a seed)

    def subject() -> float:
        nonlocal runs, merged
        runs += 1
        with folder.fresh_store(
            "store",
            key_ring=ring,
            encryption=True,
            compression_level=3,
            defrag_small_chunk_bytes=1 << 20,
            concat_merge_seam=False,
        ) as storage:
            storage.create("d")
            length = 0
            for part in range(16 if quick else 64):  # small sealed segments concatenated in
                piece = json_values(500, runs * 1000 + part)
                storage.create(f"p{part}")
                storage.write(storage.open_write(f"p{part}"), 0, piece)
                storage.seal(storage.open_write(f"p{part}"))
                storage.concat(storage.open_write("d"), length, f"p{part}")
                length += len(piece)
            storage.seal(storage.open_write("d"))
            result = storage.defrag("d")
            merged = sum(chunk.stored for _, chunk in storage.chunks("d"))
            return result.bytes_native / 1e6

    try:
        yield (
            "MB a defrag of an encrypted segment moves natively vs. the MB its merged chunks store",
            subject,
            lambda: merged / 1e6,
            1.0,
            "MB",
        )
    finally:
        folder.close()


BENCHMARKS = {
    "encrypt_write_1m": Benchmark(
        "encrypt_write_1m", "1 MiB durable writes, encrypted vs. plain", encrypted_writes
    ),
    "encrypt_read_seq": Benchmark(
        "encrypt_read_seq",
        "sequential reads of an encrypted segment vs. verified plain reads",
        lambda parent, quick: encrypted_reads(parent, quick, random_reads=False),
    ),
    "encrypt_read_random_4k": Benchmark(
        "encrypt_read_random_4k",
        "random 4 KiB reads of an encrypted segment vs. verified plain reads",
        lambda parent, quick: encrypted_reads(parent, quick, random_reads=True),
    ),
    "zstd_json": Benchmark(
        "zstd_json",
        "stored over logical bytes of JSON-like Kafka values with zstd (lower is better)",
        compression_ratio,
        measures="value",
    ),
    "encrypt_defrag_native": Benchmark(
        "encrypt_defrag_native",
        "bytes an encrypted defrag moves natively over the bytes it merges (1: none through the client)",
        encrypted_defrag,
        measures="value",
    ),
}
