"""Spark's batch defrag and scrub over a store with compression and encryption on.

Neither needs a key: a defrag task concatenates stored frames natively (their frame maps
and wrapped data keys travel in the run's sources and commit, never key material), and a
scrub task checks the stored bytes' CRC32C. So the executors get no key ring at all
(``SLTS_KEY_RING`` is not in their environment; the scrub's driver gets its ring by its
``--key-ring`` flag); only the drivers and the readers afterwards hold it. The merged
segments read back exactly with the ring, and a flipped stored byte is the same finding
on Spark as in process.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import slts
from slts.admin.verify import verify_container
from slts.config import StorageConfig
from slts.storage.batch_defrag import Executor
from tests.support.cli import child_env, slts_command
from tests.support.engine import key_ring

from .conftest import collect_garbage, defrag_with, file_locations, fragment, mismatched, open_owner

TRANSFORMS = {"encryption": True, "compression_level": 3, "frame_bytes": 4096}
SEGMENTS, PIECES = 40, 4


def test_a_spark_defrag_of_an_encrypted_store_moves_frames_natively(
    tmp_path: Path, spark: Executor, monkeypatch
) -> None:
    monkeypatch.delenv("SLTS_KEY_RING", raising=False)  # the executors start without any
    ring = key_ring(tmp_path)
    url, metadata = file_locations(tmp_path)
    names = [f"topic/{i:03d}" for i in range(SEGMENTS)]
    written = fragment(url, metadata, names, PIECES, seal=names, key_ring=ring, **TRANSFORMS)
    with open_owner(url, metadata, key_ring=ring, **TRANSFORMS) as owner:
        stored_before = sum(chunk.stored for name in names for _, chunk in owner.chunks(name))
        assert all(chunk.data_keys for name in names for _, chunk in owner.chunks(name))

    report = defrag_with(spark, url, metadata, StorageConfig(**TRANSFORMS))  # type: ignore[arg-type]
    assert report.errors == [] and report.runs_failed == 0, report
    assert report.runs_committed == SEGMENTS and report.chunks_after == SEGMENTS
    assert report.bytes_native == stored_before and report.bytes_copied == 0  # every byte natively

    with open_owner(url, metadata, key_ring=ring, **TRANSFORMS) as owner:
        for name in names:
            ((_, chunk),) = owner.chunks(name)
            assert len(chunk.data_keys) == PIECES  # each piece's frames under its own data key
        assert mismatched(owner, written.lengths) == []
        assert verify_container(owner, checksums=True).problems == []
        assert collect_garbage(owner) == SEGMENTS * PIECES
        assert mismatched(owner, written.lengths) == []


def test_a_spark_scrub_of_an_encrypted_store_finds_a_flipped_stored_byte(tmp_path: Path) -> None:
    ring = key_ring(tmp_path)
    store = tmp_path / "store"
    url, metadata = f"file://{store / 'chunks'}", str(store / "metadata")
    with slts.open(url, metadata=metadata, gc_interval_s=0.0, key_ring=ring, **TRANSFORMS) as storage:
        for name in ("a", "b"):
            storage.create(name, max_rolling_length=20_000)
            for i in range(3):
                storage.write(storage.open_write(name), i * 15_000, os.urandom(15_000))
        _, (start, chunk), *_ = storage.chunks("a")
        path = next(store.rglob(chunk.name.rsplit("/", 1)[-1]))
    with open(path, "r+b") as file:
        file.seek(chunk.stored // 2)
        byte = file.read(1)
        file.seek(chunk.stored // 2)
        file.write(bytes([byte[0] ^ 1]))

    ring_folder = tmp_path / "key-ring"

    def scrub(*flags: str) -> dict:
        environment = child_env()
        environment.pop("SLTS_KEY_RING", None)  # the driver's ring is its flag: no executor sees it
        result = subprocess.run(
            slts_command("scrub", "--key-ring", str(ring_folder), "--json", "--store", str(store), *flags),
            capture_output=True,
            text=True,
            env=environment,
            check=False,
        )
        assert result.returncode == 1, result.stderr
        report = json.loads(result.stdout)
        report.pop("seconds")
        return report

    local, on_spark = scrub(), scrub("--spark", "--master", "local[2]")
    assert on_spark == local
    assert [(a["segment"], a["offset"], a["kind"]) for a in on_spark["anomalies"]] == [
        ("a", start, "checksum")
    ]
